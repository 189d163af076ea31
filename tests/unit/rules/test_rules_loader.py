from pathlib import Path

import pytest

from collector.incidents.evaluator import NO_DRAINS, Evaluator
from collector.incidents.sweep import Sweep
from collector.jobs.book import JobBook
from collector.jobs.config import JobsConfig
from collector.model.fleet import FleetModel
from fleetwatch import PROTOCOL_VERSION
from fleetwatch.model import Target, sample_to_pb
from fleetwatch.testing import FakeClock
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.cel_env import SCOPE_VARIABLES, VARIABLE_FIELDS
from rules.cel_types import VARIABLE_TYPES, Kind
from rules.loader import RulesFileError, load_rules, parse_rules
from rules.model import Mode, Scope, Severity
from rules.xid_catalog import load_catalog

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
            ("drain_first: true", "drain_first: 3", "reset_gpu.drain_first must be true or false"),
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


class TestSuppresses:
    def test_a_node_rule_may_suppress(self):
        """``suppresses: true`` on a node rule is kept; rules say false unless they ask."""
        text = one_rule("node", "!node.reachable", "suppresses: true")
        assert parse_rules(text, "r.yaml").rules[0].suppresses is True
        assert parse_rules(GOOD, "r.yaml").rules[0].suppresses is False

    def test_only_node_rules_suppress_and_only_with_a_boolean(self):
        """A GPU rule cannot hold back its node's others; "yes" is not true."""
        found = problems(one_rule("gpu", "!gpu.present", "suppresses: true"))
        assert found == [
            "r.yaml:6: rule r: suppresses is for node rules (it holds a node's others)"
        ]
        found = problems(one_rule("node", "!node.reachable", 'suppresses: "yes"'))
        assert found == ["r.yaml:6: rule r: suppresses must be true or false, not 'yes'"]

    def test_of_the_builtin_rules_only_node_unreachable_suppresses(self):
        """A hot sensor or a hung NVML must not hold back a lost GPU's drain (issue 43)."""
        assert [r.name for r in load_rules().rules if r.suppresses] == ["node_unreachable"]


class TestMode:
    def test_a_rule_acts_unless_it_says_shadow(self):
        """``mode`` defaults to act; ``shadow`` is kept and read back as such."""
        assert parse_rules(GOOD, "r.yaml").rules[0].shadow is False
        text = one_rule("gpu", "!gpu.present", "mode: shadow")
        rule = parse_rules(text, "r.yaml").rules[0]
        assert (rule.mode, rule.shadow) == (Mode.SHADOW, True)

    def test_an_unknown_mode_names_the_two(self):
        found = problems(one_rule("gpu", "!gpu.present", "mode: quiet"))
        assert found == ["r.yaml:6: rule r: mode must be one of act, shadow, not 'quiet'"]


def one_rule(scope: str, when: str, extra: str = "") -> str:
    return f"version: 1\nrules:\n  - name: r\n    scope: {scope}\n    when: '{when}'\n" + "".join(
        f"    {line}\n" for line in extra.splitlines()
    )


class TestTypedFields:
    @pytest.mark.parametrize(
        ("old", "new", "expected"),
        [
            (
                "    labels:",
                '    dry_run: "true"\n    labels:',
                "dry_run must be true or false, not 'true'",
            ),
            (
                "    labels:",
                "    dry_run: 1\n    labels:",
                "r.yaml:9: rule hot_gpu: dry_run must be",
            ),
            (
                "severity: warning",
                "severity: urgent",
                "severity must be one of info, warning, critical",
            ),
            (
                "severity: warning",
                "severity: 2",
                "severity must be one of info, warning, critical, not 2",
            ),
            (
                "scope: gpu",
                "scope: planet",
                "scope must be one of node, gpu, nvlink, ib_port, job, fleet",
            ),
            ("for: 2m", "for: true", "for: True is not a duration"),
            (
                "keep_firing_for: 10m",
                "keep_firing_for: -5",
                "keep_firing_for: duration -5 is out of",
            ),
            ("{team: infra}", "{team: 1}", "labels must map names to strings"),
            ("{team: infra}", "{1: infra}", "labels must map names to strings"),
            ("{team: infra}", "[team]", "labels must map names to strings"),
            ("    labels:", "    runbook: [a]\n    labels:", "runbook must be a string, not ['a']"),
            (
                "    labels:",
                "    description: 5\n    labels:",
                "description must be a string, not 5",
            ),
            ("[notify, {", "[{notify: {channel: 5}}, {", "notify.channel must be a string, not 5"),
            (
                "drain_first: true",
                'drain_first: "true"',
                "drain_first must be true or false, not 'true'",
            ),
            ("[notify, {", "[{notify: {}, drain_node: {}}, {", "unknown action \"{'notify'"),
            ("[notify, {", "[[notify], {", "unknown action \"['notify']\""),
            ("{drain_first: true}", "{drain_first: true, 1: 2}", "reset_gpu has no parameter 1"),
        ],
    )
    def test_wrong_type_is_a_problem_naming_the_field(self, old: str, new: str, expected: str):
        """A value of the wrong type or outside its set is refused, never taken as a default."""
        text = GOOD.replace(old, new)
        assert text != GOOD
        assert any(expected in p for p in problems(text)), problems(text)

    def test_bad_severity_message_names_severity_not_scope(self):
        """A bad severity is reported as severity, with the allowed values."""
        (problem,) = problems(GOOD.replace("severity: warning", "severity: urgent"))
        expected = (
            "r.yaml:8: rule hot_gpu: severity must be one of info, warning, critical, not 'urgent'"
        )
        assert expected == problem

    def test_dry_run_true_is_kept(self):
        """A real boolean dry_run is taken as written."""
        rule = parse_rules(GOOD.replace("    labels:", "    dry_run: true\n    labels:"), "r.yaml")
        assert rule.rules[0].dry_run is True


class TestEscalation:
    @pytest.mark.parametrize(
        ("escalate", "expected"),
        [
            ("{after: 3, within: 1d}", "escalate.actions must list"),
            ("{after: 3, within: 1d, actions: []}", "escalate.actions must list"),
            ("{after: 3, within: 1d, actions: null}", "escalate.actions must list"),
            ("{after: 3, within: 1d, actions: drain_node}", "escalate.actions must be a list"),
            ("{after: 3, within: 1d, actions: [explode]}", "unknown action 'explode'"),
            ("{after: 0, within: 1d, actions: [notify]}", "escalate.after must be a count"),
            ('{after: "3", within: 1d, actions: [notify]}', "escalate.after must be a count"),
            ("{after: true, within: 1d, actions: [notify]}", "escalate.after must be a count"),
            ("{after: 3, within: 0s, actions: [notify]}", "escalate.within must be longer than 0s"),
            ("{after: 3, actions: [notify]}", "escalate.within: None is not a duration"),
            ("{after: 3, within: 1d, actions: [notify], then: x}", "(not then)"),
        ],
    )
    def test_bad_escalation_is_a_problem(self, escalate: str, expected: str):
        """An escalation that would do nothing, or whose counts make no sense, is refused."""
        text = GOOD.replace("{after: 3, within: 1d, actions: [drain_node]}", escalate)
        assert text != GOOD
        found = problems(text)
        assert any(expected in p for p in found), found
        assert all(p.startswith("r.yaml:11: rule hot_gpu: ") for p in found), found


class TestConditionTypes:
    @pytest.mark.parametrize(
        ("scope", "when", "expected"),
        [
            ("node", "node.gpus", "when must give true or false; this condition gives a number"),
            ("node", "node.signals.agent_nvml_hung", "gives a number"),
            ("job", "job.summary", "when must give true or false; this condition gives text"),
            ("job", "job.suspects", "gives a list (list<string>)"),
            ("gpu", 'events("xid", "1h")', "gives a number"),
            ("gpu", 'xids("1h")', "gives a list"),
            ("node", "node.reachable ? node.gpus : 0", "gives a number"),
            ("node", "node.name + 1", "bad condition: ERROR: <input>:1:11: found no matching "),
            ("node", "node.name + 1 > 0", "applied to '(string, int)'"),
            ("ib_port", "port.rate > 100", "applied to '(string, int)'"),
            ("gpu", "rank.straggler + 1 > 0", "applied to '(bool, int)'"),
        ],
    )
    def test_condition_that_cannot_give_a_bool_is_refused(self, scope, when, expected):
        """CEL compiles these against untyped maps, and at run time each would only count as
        not holding: the check names the type the condition gives, or CEL's type error."""
        found = problems(one_rule(scope, when))
        assert any(p.startswith("r.yaml:5: rule r: ") and expected in p for p in found), found

    @pytest.mark.parametrize(
        ("scope", "when"),
        [
            ("gpu", "has(gpu.signals.remap_pending) && gpu.signals.remap_pending == 1"),
            ("gpu", "has(rank.straggler) && rank.straggler"),
            ("gpu", "rank.straggler"),
            ("gpu", 'gpu.model != null && gpu.model != ""'),
            ("gpu", 'size(rank) > 0 && gpu.model.startsWith("H")'),
            ("gpu", "{1: 2.5, 2: 5.0}[gpu.signals.pcie_link_gen] > 3.0"),
            ("gpu", 'xids("1h").exists(x, x.xid in [119, 120])'),
            ("ib_port", 'port.state != "ACTIVE" || port.signals.ib_state == "x"'),
            ("job", 'job.mfu > 0.5 && job.gpus > 8 && job.drop_cause == "fabric"'),
            ("job", '"node-01" in job.suspects'),
            ("node", "node.gpus_lost > 0 ? node.reachable : false"),
            ("fleet", "fleet.drain_breaker_open || fleet.nodes_reachable < fleet.nodes"),
        ],
    )
    def test_conditions_that_give_a_bool_pass(self, scope, when):
        """Int and double compared, null, signals holding text, maps as a whole: all pass."""
        (rule,) = parse_rules(one_rule(scope, when), "r.yaml").rules
        assert rule.when == when

    @pytest.mark.parametrize("key", ["rulez", "defaults", "groups"])
    def test_unknown_top_level_key_is_refused(self, key):
        """A top-level key the loader does not read (a typo of rules, say) is a problem at its
        line, not silently ignored."""
        text = f"version: 1\n{key}: []\nrules: []\n"
        assert problems(text) == [
            f"r.yaml:2: unknown top-level key {key!r}; a rule file has version and rules"
        ]


class TestConditionFields:
    @pytest.mark.parametrize(
        ("scope", "when", "expected"),
        [
            ("gpu", "!gpu.presnt", "unknown field gpu.presnt; gpu has index, model,"),
            ("gpu", 'gpu["presnt"] == false', "unknown field gpu.presnt"),
            ("gpu", "has(gpu.presnt)", "unknown field gpu.presnt"),
            ("ib_port", 'port.sate != "ACTIVE"', "unknown field port.sate; port has device,"),
            ("ib_port", "!node.reachabel", "unknown field node.reachabel; node has connected,"),
            ("nvlink", "!link.upp", "unknown field link.upp; link has index, signals, up"),
            ("fleet", "fleet.drains_wating > 0", "unknown field fleet.drains_wating; fleet has"),
            ("node", 'events("gpu_lots", "1h") > 0', "unknown event kind 'gpu_lots'; known:"),
            ("gpu", 'events(r"xdi", "1h") > 0', "unknown event kind 'xdi'; known: "),
        ],
    )
    def test_unknown_field_or_event_kind(self, scope: str, when: str, expected: str):
        """A misspelt field or event kind would be absent or zero at run time: it is refused."""
        found = problems(one_rule(scope, when))
        assert any(p.startswith("r.yaml:5: rule r: " + expected) for p in found), found

    @pytest.mark.parametrize(
        ("scope", "when"),
        [
            ("gpu", 'gpu.model == "gpu.presnt" && events("gpu_lost", "1h") >= 0'),
            ("gpu", 'gpu.model.startsWith("H") && gpu.size() > 0'),
            ("gpu", "[1].exists(gpu, gpu == 1)"),
            ("ib_port", 'port.state == "node.reachabel" || port.signals.ib_state == "x"'),
            ("fleet", "fleet.drain_breaker_open || fleet.nodes_reachable < fleet.nodes"),
        ],
    )
    def test_known_fields_and_string_contents_pass(self, scope: str, when: str):
        """Real fields, text inside strings, methods and macro variables are not taken as typos."""
        (rule,) = parse_rules(one_rule(scope, when), "r.yaml").rules
        assert when == rule.when

    def test_field_lists_match_the_collector_maps(self):
        """The fields checked are exactly the keys of the maps the collector hands to CEL."""
        clock = FakeClock()
        fleet = FleetModel()
        uuid = "GPU-00000000-0000-0000-0000-000000000000"
        hello = pb.Hello(
            node="n1",
            boot_id="b",
            protocol_version=PROTOCOL_VERSION,
            gpus=[
                pb.Gpu(index=0, uuid=uuid, pci_bus_id="0000:18:00.0", model="H100", nvlink_count=1)
            ],
            ib_ports=[pb.IbPort(device="mlx5_0", port=1, rate="400 Gb/sec (4X NDR)")],
        )
        fleet.on_hello(hello, clock.monotonic(), clock.now())
        sample = sample_to_pb(Target.nvlink(uuid, 0), "nvlink_crc_errors", 0)
        fleet.apply_report("n1", pb.Report(samples=[sample]))
        jobs = JobBook(config=JobsConfig(), fleet=fleet, clock=clock)
        every_scope = "version: 1\nrules:\n" + "".join(
            f"  - {{name: r_{s.value}, scope: {s.value}, when: 'true', severity: info}}\n"
            for s in Scope
        )
        evaluator = Evaluator(
            rules=parse_rules(every_scope, "r.yaml"),
            fleet=fleet,
            catalog=load_catalog(),
            clock=clock,
            jobs=jobs,
        )
        step = pb.JobStep(
            job_id="j", rank=0, step=1, time_unix_ms=1, step_time_s=1.0, gpu_uuid=uuid
        )
        jobs.ingest("n1", pb.JobReport(steps=[step]))
        fleet_map = {**evaluator.tally.counts_now(), **evaluator.fleet_extras()}
        sweep = Sweep(fleet=fleet_map, now=0.0, wanted=set(), swept=set(), whole={"n1"})
        seen: dict[str, set[str]] = {}
        targets = [(scope, data) for _n, _k, scope, _r, data in evaluator._targets(sweep)]
        targets += [(Scope.JOB, {"job": m, "fleet": sweep.fleet}) for m in jobs.publish()]
        assert {scope for scope, _ in targets} == set(Scope) - {Scope.FLEET}
        kinds: dict[tuple[str, str], set[str]] = {}
        for scope, data in targets:
            assert set(SCOPE_VARIABLES[scope]) == set(data)
            for var, fields in data.items():
                seen.setdefault(var, set()).update(fields)
                for name, value in fields.items():
                    kinds.setdefault((var, name), set()).add(kind_of(value))
        assert set(NO_DRAINS) <= seen["fleet"]
        assert {var: set(fields) for var, fields in VARIABLE_FIELDS.items()} == seen
        declared = {
            (var, name): {kind}
            for var, fields in VARIABLE_TYPES.items()
            for name, kind in fields.items()
        }
        assert kinds == declared


def kind_of(value: object) -> Kind:
    """The kind rules.cel_types declares for a value of the collector's maps."""
    if isinstance(value, bool):
        return Kind.BOOL
    if isinstance(value, int | float):
        return Kind.NUMBER
    if isinstance(value, str):
        return Kind.TEXT
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return Kind.NAMES
    assert isinstance(value, dict), value
    return Kind.SIGNALS


class TestRequeueJobAction:
    def test_defaults_to_excluding_the_node(self):
        """``requeue_job`` keeps the job off the incident's node unless told not to."""
        (rule,) = parse_rules(one_rule("gpu", "true", "actions: [requeue_job]"), "r.yaml").rules
        assert rule.actions[0].params == {"exclude_node": True}
        text = one_rule("gpu", "true", "actions: [{requeue_job: {exclude_node: false}}]")
        (rule,) = parse_rules(text, "r.yaml").rules
        assert rule.actions[0].params == {"exclude_node": False}

    @pytest.mark.parametrize(("scope", "when"), [("node", "true"), ("job", "true")])
    def test_needs_a_gpu_scope(self, scope, when):
        """The job comes from the rank on the incident's GPU: node and job rules cannot."""
        found = problems(one_rule(scope, when, "actions: [requeue_job]"))
        assert any(f"requeue_job needs a GPU (its rank's job), and a {scope}" in p for p in found)

    def test_option_is_checked(self):
        """A quoted boolean is refused, naming the parameter."""
        found = problems(one_rule("gpu", "true", 'actions: [{requeue_job: {exclude_node: "no"}}]'))
        assert any("requeue_job.exclude_node must be true or false" in p for p in found), found


class TestRebootAndRmaActions:
    @pytest.mark.parametrize("scope", ["node", "gpu", "nvlink", "ib_port"])
    def test_node_level_rules_may_reboot_and_open_tickets(self, scope):
        """Both name the incident's node: any rule whose target is on a node may use them."""
        text = one_rule(scope, "true", "actions: [reboot_node, rma_ticket]")
        (rule,) = parse_rules(text, "r.yaml").rules
        assert [(a.name, a.params) for a in rule.actions] == [
            ("reboot_node", {"reason": ""}),
            ("rma_ticket", {}),
        ]

    @pytest.mark.parametrize("scope", ["job", "fleet"])
    @pytest.mark.parametrize("action", ["reboot_node", "rma_ticket"])
    def test_need_a_node_scope(self, scope, action):
        """A job or fleet incident names no node to reboot or send back."""
        found = problems(one_rule(scope, "true", f"actions: [{action}]"))
        assert any(f"{action} needs a node, and a {scope} rule has none" in p for p in found)

    def test_escalation_actions_are_checked_too(self):
        """A reboot in a job rule's escalation is as wrong as in its actions."""
        extra = "escalate: {after: 2, within: 1h, actions: [reboot_node]}"
        found = problems(one_rule("job", "true", extra))
        assert any("reboot_node needs a node" in p for p in found), found

    def test_a_reason_of_words_is_kept(self):
        """``reason`` adds the rule's words to the reboot's reason."""
        text = one_rule("gpu", "true", "actions: [{reboot_node: {reason: Xid 79 after reset}}]")
        (rule,) = parse_rules(text, "r.yaml").rules
        assert rule.actions[0].params == {"reason": "Xid 79 after reset"}

    @pytest.mark.parametrize(
        "reason", ['"a; reboot"', '"$(id)"', '"x\\"y"', '" padded"', '"' + "a" * 81 + '"']
    )
    def test_a_reason_with_more_than_words_is_refused(self, reason):
        """What reaches scontrol and a webhook from a rule file is words and . _ : / ( ) , -."""
        found = problems(
            one_rule("gpu", "true", f"actions: [{{reboot_node: {{reason: {reason}}}}}]")
        )
        assert any("reboot_node.reason must be 1-80 letters" in p for p in found), found

    def test_rma_ticket_takes_no_parameter(self):
        """An unknown parameter is named."""
        found = problems(one_rule("gpu", "true", "actions: [{rma_ticket: {vendor: x}}]"))
        assert any("rma_ticket has no parameter vendor" in p for p in found), found
