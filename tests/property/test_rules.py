"""Rule files and the Xid catalog: any YAML (or not-YAML) text loads or raises the loader's own
error naming the file and line, never anything else, and never hangs on an alias bomb."""

from __future__ import annotations

import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from rules.exceptions import CatalogError
from rules.loader import RULE_KEYS as LOADER_KEYS
from rules.loader import RulesFileError, parse_rules
from rules.xid_catalog import parse_catalog
from tests.property.hostile import (
    SCALARS,
    WEIRD_TEXT,
    alias_bomb,
    assert_clear,
    deep,
    nested,
    tried,
)

TARGET_RULES = "rules"
TARGET_CATALOG = "xid_catalog"
VALUES = st.one_of(SCALARS, nested())
RULE_KEYS = [*sorted(LOADER_KEYS), "extra"]  # every key a rule takes, and one it does not
GOOD_RULE = {
    "name": "gpu_lost",
    "scope": "gpu",
    "when": 'events("gpu_lost", "1h") > 0',
    "severity": "critical",
    "actions": ["drain_node"],
}
CONDITIONS = st.one_of(
    WEIRD_TEXT,
    st.sampled_from(
        [
            "true",
            "(" * 300 + "true" + ")" * 300,
            "!" * 5000 + "true",
            'events("gpu_lost", "99999999999999999999d") > 0',
            'rate("x", "1h") > 1.0/0.0',
            "gpu.signals['x'] > 1e309",
            "size(xids('1h')) > 0 && " * 200 + "true",
        ]
    ),
)


@st.composite
def rule_texts(draw: st.DrawFn) -> str:
    """A rule file built from a good rule with fields replaced by hostile values; or any text."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(max_size=200))
    rules = []
    for _ in range(draw(st.integers(0, 3))):
        rule: dict[str, object] = dict(GOOD_RULE)
        for key in draw(st.lists(st.sampled_from(RULE_KEYS), max_size=4)):
            rule[key] = draw(CONDITIONS if key == "when" else VALUES)
        rules.append(rule)
    doc = {"version": draw(st.sampled_from([1, 1, 2, "1", None])), "rules": rules}
    return yaml.safe_dump(doc, allow_unicode=True)


def check_rules(text: str) -> None:
    try:
        parse_rules(text, "fuzz.yaml")
    except RulesFileError as exc:
        assert exc.problems
        for problem in exc.problems:
            assert problem.source == "fuzz.yaml"
            assert problem.line >= 0
            assert_clear(problem)


class TestRuleFiles:
    @given(rule_texts())
    @example(
        "version: 1\nrules: [{name: a, scope: node, when: " + "x" * 5000 + "}]\n"
    )  # 10 kB message
    @example(deep(20_000))  # RecursionError inside the YAML parser
    @example("a: " + "9" * 5000)  # int() beyond Python's digit limit inside the YAML parser
    @example("version: 1\nrules: []\nrules: [a, b]\n")  # a key twice: lines and rules disagreed
    @example(
        "version: 1\nrules: [{name: a, scope: node, when: 'true', for: " + "9" * 400 + "}]\n"
    )  # a duration too large for a float
    @example(
        alias_bomb() + "version: 1\nrules: [{name: a, scope: node, when: 'true', labels: *a9}]\n"
    )
    @example(
        alias_bomb() + "version: 1\nrules: [{name: a, scope: node, when: 'true', actions: [*a9]}]\n"
    )
    @example(alias_bomb() + "version: 1\nrules: [{name: *a9}]\n")
    def test_any_rule_file_loads_or_lists_its_problems(self, text):
        """Any text: a RuleSet, or RulesFileError whose problems name the file and a line."""
        tried(TARGET_RULES)
        check_rules(text)


ENTRY_KEYS = ["name", "class", "action", "fatal", "extra"]


@st.composite
def catalog_texts(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(max_size=200))
    xids: dict[object, object] = {}
    for key in draw(
        st.lists(st.one_of(st.integers(), st.sampled_from([0, 79, 65_536, 10**30])), max_size=3)
    ):
        entry: dict[str, object] = {
            "name": "x",
            "class": "bus",
            "action": "RESET_GPU",
            "fatal": True,
        }
        for field in draw(st.lists(st.sampled_from(ENTRY_KEYS), max_size=3)):
            entry[field] = draw(VALUES)
        xids[key] = draw(st.one_of(st.just(entry), VALUES))
    return yaml.safe_dump({"version": 1, "xids": xids}, allow_unicode=True)


class TestXidCatalog:
    @given(catalog_texts())
    @example("version: 1\nxids:\n  5: {name: a, class: [1], action: IGNORE, fatal: true}\n")
    @example("version: 1\nxids:\n  5: {name: a, class: bus, action: {a: 1}, fatal: true}\n")
    @example(deep(20_000))
    @example("xids: " + "9" * 5000)
    @example(
        alias_bomb()
        + "version: 1\nxids:\n  5: {name: a, class: *a9, action: IGNORE, fatal: true}\n"
    )
    def test_any_catalog_loads_or_raises_catalog_error(self, text):
        """Any text: a catalog of valid entries, or CatalogError naming the file."""
        tried(TARGET_CATALOG)
        try:
            catalog = parse_catalog(text, "fuzz.yaml")
        except CatalogError as exc:
            assert_clear(exc, "fuzz.yaml")
            return
        for xid in range(1, 100):
            entry = catalog.get(xid)
            assert entry is None or isinstance(entry.xid_class, str)
