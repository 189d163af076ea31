"""The lemon counts reach the rules: marked when they move, seen as they age, remembered."""

from collector.incidents.evaluator import Evaluator
from collector.model.fleet import FleetModel
from collector.model.recent_faults import RecentFaults
from collector.reload import successor
from fleetwatch.testing import FakeClock, made_up_hello
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.engine import Phase
from rules.loader import load_rules, parse_rules
from rules.xid_catalog import load_catalog

LEMON = next(r for r in load_rules().rules if r.name == "lemon_node")
WEEK = 7 * 86400.0


def world() -> tuple[Evaluator, RecentFaults, FakeClock]:
    clock = FakeClock()
    fleet = FleetModel()
    for name in ("n1", "n2"):
        fleet.on_hello(made_up_hello(name, gpus=1, ib_ports=1), clock.monotonic(), clock.now())
        fleet.apply_report(name, pb.Report())
    recent = RecentFaults(clock)
    rules = parse_rules(
        "version: 1\nrules:\n"
        f"  - name: lemon_node\n    scope: node\n    when: '{LEMON.when}'\n"
        "    keep_firing_for: 5m\n    severity: critical\n    actions: [drain_node, notify]\n",
        "lemon.yaml",
    )
    evaluator = Evaluator(
        rules=rules,
        fleet=fleet,
        catalog=load_catalog(),
        clock=clock,
        node_faults=recent.fields,
    )
    fleet.observer = evaluator
    recent.changed.append(evaluator.note_node)
    return evaluator, recent, clock


def phases(outcomes) -> list[tuple[str, str]]:
    return [(o.transition.incident.target, o.transition.incident.phase) for o in outcomes]


class TestLemonCounts:
    def test_the_built_in_rule_reads_the_counts(self):
        assert "node.remediations_7d >= 5" in LEMON.when
        assert "!node.seen_by_person" in LEMON.when

    def test_a_count_that_moves_is_evaluated_at_once_and_one_that_ages_by_the_sweep(self):
        """The fifth remediation marks the node: the next urgent tick fires.

        A week later the counts are gone with nothing marking the node: a regular tick sees it
        (the node's open incident, and the sweep), and keep_firing_for later it resolves.
        """
        evaluator, recent, clock = world()
        evaluator.tick()  # the first, regular tick: everything once
        for _ in range(5):
            recent.action("drain_node", "succeeded", "n1")
        assert ("n1", "n1") in evaluator.changes.dirty
        fired = evaluator.tick(urgent=True)
        assert phases(fired) == [("n1", Phase.PENDING), ("n1", Phase.FIRING)]
        assert fired[-1].transition.incident.evidence == (
            "5 remediations and 0 incident episodes in 7 days"
        )
        clock.advance(WEEK + 1)
        evaluator.tick()
        clock.advance(301)
        assert phases(evaluator.tick()) == [("n1", Phase.RESOLVED)]

    def test_answers_are_remembered_by_the_counts(self):
        """A pure condition: the same counts, the memo answers; other counts, CEL again."""
        evaluator, recent, _ = world()
        evaluator.tick()
        misses = evaluator.memo.misses
        recent.action("reset_gpu", "succeeded", "n2")
        evaluator.tick(urgent=True)
        assert evaluator.memo.misses == misses + 1  # n2's counts: a key not seen yet
        hits = evaluator.memo.hits
        evaluator.note_node("n2")
        evaluator.tick(urgent=True)
        assert evaluator.memo.hits == hits + 1

    def test_a_reload_keeps_the_counts(self):
        evaluator, recent, _ = world()
        new, _dropped = successor(evaluator, evaluator.rules, evaluator.catalog)
        assert new.node_faults == recent.fields
        assert new.sweeper.faults == recent.fields
