"""docs/rules.md counts the built-in rules as the loader does (issue 18).

The page said 39 rules while ``rules/default.yaml`` held 47: a count written by hand goes stale,
so each one is checked against the file.
"""

import re
from pathlib import Path

from rules.loader import load_rules

DOC = Path(__file__).parents[3] / "docs" / "rules.md"
# "`rules/default.yaml` holds 47 rules" (the section) and "built-in rules: 47 rules, no problems"
# (`fleetwatch rules check`'s output); whitespace may be a line break.
BUILTIN_COUNT = re.compile(r"(?:`rules/default\.yaml`\s+holds|built-in\s+rules:)\s+(\d+)\s+rules\b")


class TestBuiltinRuleCount:
    def test_every_count_of_the_builtin_rules_in_the_doc_is_the_real_one(self):
        """Both statements of how many rules the built-in file holds are found, and each says
        as many as the loader loads from it."""
        loaded = len(load_rules().rules)
        stated = [int(n) for n in BUILTIN_COUNT.findall(DOC.read_text(encoding="utf-8"))]
        assert len(stated) >= 2, "docs/rules.md no longer states the count as this test expects"
        assert [loaded] * len(stated) == stated

    def test_the_config_check_example_counts_them_too(self):
        """docs/deploy.md shows `fleetwatch config check`'s line, with the built-in count."""
        text = (DOC.parent / "deploy.md").read_text(encoding="utf-8")
        stated = [int(n) for n in re.findall(r"(\d+) rules \(built-in\)", text)]
        assert stated, "docs/deploy.md no longer shows config check's count"
        assert stated == [len(load_rules().rules)] * len(stated)
