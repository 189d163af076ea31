"""``fleetwatch rules eval``'s engine: what a rule set would do on the fleet now, changing
nothing (collector/incidents/dry_run.py)."""

from collector.actions.journaling import expand
from collector.actions.local_checks import SafetyChecks
from collector.actions.safety import SafetyConfig
from collector.incidents.dry_run import dry_run
from collector.incidents.evaluator import Evaluator
from collector.model.fleet import FleetModel
from fleetwatch.model import EventKind, Target
from fleetwatch.testing import FakeClock, made_up_hello, made_up_uuid
from rules.engine import Phase
from rules.loader import load_rules, parse_rules
from rules.xid_catalog import load_catalog

NODES = [f"n{i}" for i in range(1, 11)]
NEW = """\
version: 1
rules:
  - name: any_gpu_lost
    scope: gpu
    when: '!gpu.present'
    severity: critical
    actions: [drain_node, notify]
  - name: slow_to_fire
    scope: gpu
    for: 5m
    when: '!gpu.present'
    severity: warning
"""


def world(lost: list[str]):
    clock = FakeClock()
    fleet = FleetModel()
    for name in NODES:
        fleet.on_hello(made_up_hello(name, gpus=2, ib_ports=0), clock.monotonic(), clock.now())
    live = Evaluator(rules=load_rules(), fleet=fleet, catalog=load_catalog(), clock=clock)
    fleet.observer = live
    live.tick()
    for name in lost:
        fleet.apply_event(name, EventKind.GPU_LOST, Target.gpu(made_up_uuid(name, 1)), xid=79)
    return clock, fleet, live


def checks(fleet: FleetModel, clock: FakeClock, **safety) -> SafetyChecks:
    return SafetyChecks(config=SafetyConfig(**safety), fleet=fleet, clock=clock)


def test_a_new_rule_names_every_target_it_holds_on_and_changes_nothing():
    """A GPU lost on n3: the new rule would fire there (and only there), its drain would run,
    the 5-minute rule would wait its for; the live engine opened nothing for either."""
    clock, fleet, live = world(["n3"])
    safety = checks(fleet, clock, max_drained_nodes=5, max_drained_share=1.0)
    before = {(i.rule, i.target) for i in live.engine.open_incidents()}
    answer = dry_run(live, parse_rules(NEW, "new.yaml"), safety.would, expand)
    got = {(h.rule, h.target, h.state) for h in answer.holds}
    assert got == {
        ("any_gpu_lost", "n3/gpu/1", "would fire"),
        ("slow_to_fire", "n3/gpu/1", "would be pending, firing after 300 s if it still holds"),
    }
    fire = next(h for h in answer.holds if h.rule == "any_gpu_lost")
    assert [(a.action, a.outcome) for a in fire.actions] == [
        ("drain_node", "would run"),
        ("notify", "would run"),
    ]
    assert answer.targets == len(NODES) * 2  # every GPU looked at (the rules are GPU rules)
    assert {(i.rule, i.target) for i in live.engine.open_incidents()} == before
    assert safety.drained == {}
    assert safety.breaker_open_until is None


def test_the_running_rules_show_what_is_open_and_the_cap_counts_the_drains_before():
    """Three GPUs lost, a cap of 2: the running rules' gpu_lost is already firing where the
    live tick saw it; a new drain rule's third drain meets the cap the first two filled."""
    clock, fleet, live = world(["n2", "n5", "n8"])
    live.tick()
    safety = checks(fleet, clock, max_drained_nodes=2, max_drained_share=1.0)
    running = dry_run(live, live.rules, safety.would, expand)
    lost = {h.target: h.state for h in running.holds if h.rule == "gpu_lost"}
    assert lost == dict.fromkeys(("n2/gpu/1", "n5/gpu/1", "n8/gpu/1"), "firing")
    assert all(
        i.phase == Phase.FIRING for i in live.engine.open_incidents() if i.rule == "gpu_lost"
    )
    new = dry_run(live, parse_rules(NEW, "new.yaml"), safety.would, expand)
    drains = [
        next(a for a in h.actions if a.action == "drain_node")
        for h in new.holds
        if h.rule == "any_gpu_lost"
    ]
    assert sorted(d.outcome for d in drains) == ["deferred", "would run", "would run"]
    (deferred,) = [d for d in drains if d.outcome == "deferred"]
    assert deferred.why.startswith("drain cap reached: 2 of 10 nodes")


def test_dry_run_rules_and_silences_answer_as_the_dispatcher_would():
    """A rule in dry run says so for its drain; without a dispatcher the actions are unknown;
    a rule that reads a window the running rules do not keep is named."""
    clock, fleet, live = world(["n4"])
    text = NEW.replace("actions: [drain_node, notify]", "actions: [drain_node]\n    dry_run: true")
    text += """\
  - name: power_rate
    scope: gpu
    when: 'rate("power_watts", "10m") > 100.0'
    severity: warning
"""
    answer = dry_run(live, parse_rules(text, "new.yaml"), checks(fleet, clock).would, expand)
    fire = next(h for h in answer.holds if h.rule == "any_gpu_lost")
    assert [(a.action, a.outcome) for a in fire.actions] == [("drain_node", "dry run")]
    assert any(w.startswith("power_watts") for w in answer.unkept_windows), answer.unkept_windows
    blind = dry_run(live, parse_rules(NEW, "new.yaml"), None, expand)
    fire = next(h for h in blind.holds if h.rule == "any_gpu_lost")
    assert {a.outcome for a in fire.actions} == {"unknown"}
