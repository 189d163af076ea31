from pathlib import Path

import pytest

from rules.loader import RulesFileError, load_rules, parse_rules
from rules.model import Scope, Severity

GOOD = """\
version: 1
rules:
  - name: hot_gpu
    scope: gpu
    when: 'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 85'
    for: 2m
    keep_firing_for: 10m
    severity: warning
    labels: {team: infra}
    actions: [notify, {reset_gpu: {drain_first: true}}]
    escalate: {after: 3, within: 1d, actions: [drain_node]}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(RulesFileError) as info:
        parse_rules(text, "r.yaml")
    return [str(p) for p in info.value.problems]


class TestLoader:
    def test_good_file(self):
        """A valid rule comes back with its timing, actions and escalation parsed."""
        rule = parse_rules(GOOD, "r.yaml").rules[0]
        assert (rule.name, rule.scope, rule.severity) == ("hot_gpu", Scope.GPU, Severity.WARNING)
        assert (rule.for_s, rule.keep_firing_for_s) == (120.0, 600.0)
        assert [a.name for a in rule.actions] == ["notify", "reset_gpu"]
        assert rule.actions[1].params == {"drain_first": True}
        assert rule.actions[0].params == {"channel": "default"}
        assert rule.escalation is not None
        assert (rule.escalation.after, rule.escalation.within_s) == (3, 86400.0)
        assert rule.where == "r.yaml:3"

    def test_builtin_rules_load(self):
        """The shipped rule set loads and covers the faults it promises."""
        names = {r.name for r in load_rules().rules}
        assert {
            "gpu_lost",
            "nvlink_down",
            "pcie_replay_rate",
            "row_remap_failure",
            "ib_port_down",
            "ib_link_flapping",
            "ib_fabric_congestion",
            "node_unreachable",
        } <= names

    @pytest.mark.parametrize(
        ("old", "new", "expected"),
        [
            (
                "    labels:",
                "    colour: red\n    labels:",
                "r.yaml:9: rule hot_gpu: unknown field",
            ),
            ("[notify, {reset_gpu: {drain_first: true}}]", "[explode]", "unknown action 'explode'"),
            ("[notify, {", "[{notify: {volume: 11}}, {", "notify has no parameter volume"),
            ("for: 2m", "for: soon", "r.yaml:6: rule hot_gpu: for: 'soon' is not a duration"),
            ("after: 3", "after: 1", "escalate.after must be a count"),
            ("drain_first: true", "drain_first: 3", "reset_gpu.drain_first must be a bool"),
        ],
    )
    def test_bad_fields_name_file_line_and_rule(self, old: str, new: str, expected: str):
        """Each mistake is reported with the file, the line and the rule's name."""
        text = GOOD.replace(old, new)
        assert text != GOOD
        assert any(expected in p for p in problems(text)), problems(text)

    def test_bad_cel_is_reported_with_the_caret(self):
        """A condition that does not compile says where CEL choked."""
        text = GOOD.replace(
            "gpu.signals.temperature_celsius > 85", "gpu.signals.temperature_celsius >"
        )
        (problem,) = problems(text)
        assert problem.startswith("r.yaml:5: rule hot_gpu: bad condition:")
        assert "Syntax error" in problem

    def test_unknown_signal_and_variable(self):
        """A signal the agents do not send, or a variable outside the scope, is refused."""
        assert any(
            "unknown signal 'temperatur_celsius'" in p
            for p in problems(GOOD.replace("temperature_celsius > 85", "temperatur_celsius > 85"))
        )
        assert any(
            "undeclared reference to 'port.signals" in p
            for p in problems(GOOD.replace("has(gpu.", "has(port."))
        )

    def test_all_problems_at_once(self):
        """A file with several mistakes lists all of them, not just the first."""
        text = GOOD + GOOD.replace("hot_gpu", "hot_gpu").replace("scope: gpu", "scope: planet")
        found = problems(text)
        assert any("defined twice" in p or "scope" in p for p in found)

    def test_not_yaml_and_empty(self, tmp_path: Path):
        """Broken YAML and empty files say so, with a line."""
        assert problems("rules: [")[0].startswith("r.yaml:")
        assert "empty" in problems("")[0]
        with pytest.raises(RulesFileError, match="cannot read"):
            load_rules([tmp_path / "missing.yaml"])
