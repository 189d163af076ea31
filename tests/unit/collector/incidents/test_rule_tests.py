"""The rule unit-test runner (`fleetwatch rules test`) and the built-in rules' own tests."""

from pathlib import Path

import pytest

from cli.main import main
from collector.incidents.rule_tests import RuleTestError, run_file
from rules.loader import load_rules

BUILTIN_TESTS = Path(__file__).parents[4] / "rules" / "default_test.yaml"

RULES = """\
version: 1
rules:
  - name: hot_gpu
    scope: gpu
    when: 'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 90'
    for: 10s
    severity: warning
    actions: [notify]
"""


def write_tests(tmp_path: Path, expect: str, steps: str | None = None) -> Path:
    (tmp_path / "hot.yaml").write_text(RULES)
    hot = "{node: n1, gpu: 0, signal: temperature_celsius, value: 95}"
    steps = steps or f"      - {{at: 0s, sample: {hot}}}\n"
    path = tmp_path / "hot_test.yaml"
    path.write_text(
        "rule_files: [hot.yaml]\n"
        "tests:\n"
        "  - name: hot\n"
        "    nodes: {n1: {gpus: 1, ib_ports: 1}}\n"
        "    steps:\n" + steps + "    expect:\n" + expect
    )
    return path


class TestBuiltinRuleTests:
    def test_every_builtin_rule_test_passes(self):
        """The shipped rules do what their tests say (this is how `make test` runs them)."""
        results = run_file(BUILTIN_TESTS)
        assert len(results) >= 17
        assert [(r.name, r.failures) for r in results if r.failures] == []

    def test_every_builtin_rule_has_a_test_that_fires_it(self):
        """Each built-in rule appears as firing in some expectation."""
        text = BUILTIN_TESTS.read_text()
        from rules.loader import load_rules  # noqa: PLC0415

        missing = [r.name for r in load_rules().rules if f"{r.name}@" not in text]
        assert missing == []


class TestRunner:
    def test_expected_firing_and_actions_pass(self, tmp_path):
        path = write_tests(
            tmp_path,
            "      - {at: 5s, firing: [], actions: []}\n"
            "      - {at: 11s, firing: [hot_gpu@n1/gpu/0], actions: [notify@n1/gpu/0]}\n",
        )
        assert [r.failures for r in run_file(path)] == [[]]

    def test_wrong_expectations_fail_saying_what_came(self, tmp_path):
        """`for: 10s` means nothing fires at 5s: expecting it is a failure naming both sides."""
        path = write_tests(tmp_path, "      - {at: 5s, firing: [hot_gpu@n1/gpu/0]}\n")
        (result,) = run_file(path)
        assert result.failures == ["at 5s: firing [], expected ['hot_gpu@n1/gpu/0']"]

    def test_actions_are_counted_between_expectations(self, tmp_path):
        """An action listed once is not listed again at a later expectation (it ran once)."""
        path = write_tests(
            tmp_path,
            "      - {at: 11s, actions: [notify@n1/gpu/0]}\n"
            "      - {at: 1m, actions: [notify@n1/gpu/0]}\n",
        )
        (result,) = run_file(path)
        assert result.failures == ["at 1m: actions [], expected ['notify@n1/gpu/0']"]

    def test_malformed_step_is_reported_for_that_test(self, tmp_path):
        path = write_tests(
            tmp_path,
            "      - {at: 5s, firing: []}\n",
            steps="      - {at: 0s, event: {node: n1, kind: meteor_strike}}\n",
        )
        (result,) = run_file(path)
        assert result.failures
        assert "malformed test" in result.failures[0]
        assert "meteor_strike" in result.failures[0]

    def test_unknown_signal_in_a_step_is_reported(self, tmp_path):
        """A misspelt signal would silently test nothing; the runner refuses it."""
        path = write_tests(
            tmp_path,
            "      - {at: 5s, firing: []}\n",
            steps="      - {at: 0s, sample: {node: n1, gpu: 0, signal: temprature, value: 95}}\n",
        )
        (result,) = run_file(path)
        assert "unknown signal 'temprature' for a gpu" in result.failures[0]

    def test_builtin_and_extra_rule_files_load_together(self, tmp_path):
        """`rule_files: [builtin, hot.yaml]` runs the built-in rules and the extra file's."""
        path = write_tests(
            tmp_path,
            "      - at: 11s\n        firing: [hot_gpu@n1/gpu/0, xid_application_error@n1/gpu/0]\n",
            steps="      - {at: 0s, event: {node: n1, kind: xid, gpu: 0, xid: 13}}\n"
            "      - {at: 0s, sample: {node: n1, gpu: 0, signal: temperature_celsius,"
            " value: 95}}\n",
        )
        path.write_text(path.read_text().replace("[hot.yaml]", "[builtin, hot.yaml]"))
        assert [r.failures for r in run_file(path)] == [[]]

    @pytest.mark.parametrize("rule_files", ["builtin", "[]", "{a: b}"])
    def test_rule_files_must_be_a_list(self, tmp_path, rule_files: str):
        """A bare name or an empty list is refused rather than read letter by letter."""
        path = write_tests(tmp_path, "      - {at: 5s, firing: []}\n")
        path.write_text(path.read_text().replace("[hot.yaml]", rule_files))
        with pytest.raises(RuleTestError, match="rule_files must list rule files"):
            run_file(path)

    def test_not_a_test_file(self, tmp_path):
        path = tmp_path / "x.yaml"
        path.write_text("just: words\n")
        with pytest.raises(RuleTestError, match="list of 'tests'"):
            run_file(path)


class TestCli:
    def test_rules_test_exit_status(self, tmp_path, capsys):
        good = write_tests(tmp_path, "      - {at: 11s, firing: [hot_gpu@n1/gpu/0]}\n")
        assert main(["rules", "test", str(good)]) == 0
        assert "1 passed, 0 failed" in capsys.readouterr().out
        bad = write_tests(tmp_path, "      - {at: 1s, firing: [hot_gpu@n1/gpu/0]}\n")
        assert main(["rules", "test", str(bad)]) == 1
        assert "FAIL" in capsys.readouterr().out

    def test_rules_test_with_broken_rule_file_exits_1(self, tmp_path, capsys):
        path = write_tests(tmp_path, "      - {at: 1s, firing: []}\n")
        (tmp_path / "hot.yaml").write_text(RULES.replace("[notify]", "[explode]"))
        assert main(["rules", "test", str(path)]) == 1
        assert "unknown action 'explode'" in capsys.readouterr().err

    def test_rules_check_counts_one_rule_in_the_singular(self, tmp_path, capsys):
        """One rule is "1 rule", not "1 rules"."""
        path = tmp_path / "hot.yaml"
        path.write_text(RULES)
        assert main(["rules", "check", str(path)]) == 0
        assert f"{path}: 1 rule, no problems\n" == capsys.readouterr().out

    def test_rules_check(self, tmp_path, capsys):
        """`rules check` names file, line and rule of each problem and exits 1."""
        assert main(["rules", "check"]) == 0
        builtin = len(load_rules().rules)  # the count follows the file
        assert capsys.readouterr().out == f"built-in rules: {builtin} rules, no problems\n"
        bad = tmp_path / "bad.yaml"
        bad.write_text(RULES.replace("for: 10s", "for: 10s\n    colour: red").replace("> 90", "> "))
        assert main(["rules", "check", str(bad)]) == 1
        err = capsys.readouterr().err.splitlines()
        assert any(
            line.startswith(f"{bad}:7: rule hot_gpu: unknown field 'colour'") for line in err
        )
        assert any(line.startswith(f"{bad}:5: rule hot_gpu: bad condition") for line in err)

    def test_rules_check_refuses_non_bool_conditions_and_unknown_keys(self, tmp_path, capsys):
        """`rules check` once said "no problems" for a number as a condition, text plus a
        number, and a top-level key it never reads; now each is a line and the exit is 1."""
        bad = tmp_path / "bad.yaml"
        bad.write_text(
            "version: 1\n"
            "rulez: []\n"
            "rules:\n"
            "  - {name: many_gpus, scope: node, when: 'node.gpus'}\n"
            "  - {name: odd_name, scope: node, when: 'node.name + 1 > 0'}\n"
        )
        assert main(["rules", "check", str(bad)]) == 1
        out, err = capsys.readouterr()
        assert "no problems" not in out
        lines = err.splitlines()
        assert f"{bad}:2: unknown top-level key 'rulez'; a rule file has version and rules" in lines
        assert (
            f"{bad}:4: rule many_gpus: when must give true or false; this condition gives a number"
            in lines
        )
        assert any(
            line.startswith(f"{bad}:5: rule odd_name: bad condition: ")
            and "applied to '(string, int)'" in line
            for line in lines
        )
