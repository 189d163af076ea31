"""The evaluator spreads its sweep of the whole fleet over ticks, and events evaluate at once."""

from collector.incidents.cel_data import TALLY_CHUNK
from collector.incidents.changes import paced_signals
from collector.incidents.evaluator import Evaluator
from collector.incidents.rule_reads import watched_signals
from collector.model.fleet import FleetModel
from collector.model.target_keys import gpu_key
from collector.testing import job_world
from fleetwatch.model import EventKind, Target, sample_to_pb
from fleetwatch.signals import IB_STATE
from fleetwatch.testing import FakeClock, made_up_hello, made_up_uuid
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.engine import Phase
from rules.loader import load_rules, parse_rules
from rules.xid_catalog import load_catalog

RULES = """\
version: 1
rules:
  - name: any_node
    scope: node
    when: '!node.reachable'
    severity: warning
    actions: [notify]
"""


def fleet_of(count: int, clock: FakeClock) -> FleetModel:
    fleet = FleetModel()
    for i in range(count):
        fleet.on_hello(made_up_hello(f"n{i:02d}", gpus=0, ib_ports=0), clock.monotonic(), 0.0)
    return fleet


def evaluator(rules: str, fleet: FleetModel, clock: FakeClock, sweep_s: float) -> Evaluator:
    """An evaluator of ``rules`` that the fleet tells of its changes."""
    ev = Evaluator(
        rules=parse_rules(rules, "t.yaml"),
        fleet=fleet,
        catalog=load_catalog(),
        clock=clock,
        full_sweep_s=sweep_s,
    )
    fleet.observer = ev
    return ev


def test_sweep_is_spread_over_the_sweep_period():
    """30 nodes, a 30 s sweep, a tick a second: the first tick sees all, then one node a tick,
    and every node again within 30 s."""
    clock = FakeClock()
    fleet = fleet_of(30, clock)
    ev = evaluator(RULES, fleet, clock, 30.0)
    ev.tick()
    assert ev.evaluations == 30
    per_tick = []
    for _ in range(30):
        clock.advance(1.0)
        before = ev.evaluations
        ev.tick()
        per_tick.append(ev.evaluations - before)
    assert max(per_tick) <= 2
    assert sum(per_tick) == 30


def test_urgent_tick_evaluates_only_what_changed():
    """An event's tick skips the sweep and the open incidents: only the event's target."""
    clock = FakeClock()
    fleet = fleet_of(30, clock)
    ev = evaluator(RULES, fleet, clock, 1.0)
    ev.tick()
    clock.advance(5.0)
    fleet.mark_unreachable("n07")
    before = ev.evaluations
    outcomes = ev.tick(urgent=True)
    assert ev.evaluations - before == 1
    assert {o.transition.incident.target for o in outcomes} == {"n07"}


def test_a_tick_evaluates_the_nodes_with_a_marked_change_first():
    """A tick that an event woke also takes the samples since the last one: the event's node
    comes first, so its incident is found in the tick's first part, not wherever it fell."""
    clock = FakeClock()
    fleet = FleetModel()
    for i in range(60):
        fleet.on_hello(made_up_hello(f"n{i:02d}", gpus=1, ib_ports=0), clock.monotonic(), 0.0)
    ev = evaluator(RULES + HOT.removeprefix("version: 1\nrules:\n"), fleet, clock, 3600.0)
    ev.tick()
    clock.advance(1.0)
    for name, node in fleet.view().items():  # a second of samples: every GPU is hot
        (uuid,) = node.gpus
        fleet.apply_samples(name, [sample_to_pb(Target.gpu(uuid), "temperature_celsius", 95.0)])
    fleet.mark_unreachable("n59")
    parts = [part for part in ev.steps(urgent=True) if part]
    assert len(parts) == 60  # each node's hot GPU, n59's too, in a part of its node
    assert {o.transition.incident.target for o in parts[0]} == {"n59", "n59/gpu/0"}


HOT = """\
version: 1
rules:
  - name: hot
    scope: gpu
    when: 'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 90.0'
    severity: warning
"""


class TestWatchedSignals:
    def test_only_samples_a_condition_reads_queue_the_target(self):
        """A busy GPU's power changes every poll and no rule reads it: its rules are not queued
        for it. A temperature a rule reads, or an NVLink state the model turns into
        nvlinks_down, queues them."""
        clock = FakeClock()
        fleet = FleetModel()
        fleet.on_hello(made_up_hello("n1", gpus=1, ib_ports=0), 0.0, 0.0)
        ev = evaluator(HOT, fleet, clock, 30.0)
        ev.tick()  # the first sweep
        (uuid,) = fleet.view()["n1"].gpus

        def apply(target: Target, signal: str, value: float) -> None:
            fleet.apply_samples("n1", [sample_to_pb(target, signal, value)])

        before = ev.evaluations
        apply(Target.gpu(uuid), "power_watts", 400.0)
        ev.tick(urgent=True)
        assert ev.evaluations == before
        apply(Target.gpu(uuid), "temperature_celsius", 95.0)
        ev.tick(urgent=True)
        assert ev.evaluations == before + 1
        apply(Target.nvlink(uuid, 3), "nvlink_up", 0)
        ev.tick(urgent=True)
        assert ev.evaluations == before + 2

    def test_a_sample_evaluates_only_the_rules_that_read_its_signal(self):
        """Two GPU rules, one reading the temperature, one the failed reads: a temperature
        sample evaluates the first only, a failed-read count the second only, and an event on
        the GPU both (hot also fires on the temperature it read)."""
        two = HOT + (
            "  - name: unreadable\n"
            "    scope: gpu\n"
            "    when: >-\n"
            "      has(gpu.signals.nvml_read_failures) && gpu.signals.nvml_read_failures > 2.0\n"
            "    severity: warning\n"
        )
        clock = FakeClock()
        fleet = FleetModel()
        fleet.on_hello(made_up_hello("n1", gpus=1, ib_ports=0), 0.0, 0.0)
        ev = evaluator(two, fleet, clock, 30.0)
        ev.tick()  # the first sweep
        (uuid,) = fleet.view()["n1"].gpus
        before = ev.evaluations
        fleet.apply_samples("n1", [sample_to_pb(Target.gpu(uuid), "temperature_celsius", 95.0)])
        fired = {o.transition.incident.rule for o in ev.tick(urgent=True)}
        assert ev.evaluations == before + 1
        assert fired == {"hot"}
        fleet.apply_samples("n1", [sample_to_pb(Target.gpu(uuid), "nvml_read_failures", 1.0)])
        ev.tick(urgent=True)
        assert ev.evaluations == before + 2
        ev.note_event("n1", EventKind.XID, Target.gpu(uuid), 13)
        ev.tick(urgent=True)
        assert ev.evaluations == before + 4

    def test_a_condition_walking_the_signals_map_watches_everything(self):
        walks = HOT.replace(
            "'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 90.0'",
            "'size(gpu.signals) > 3'",
        )
        assert watched_signals(parse_rules(walks, "t.yaml")) is None
        assert "power_watts" not in (watched_signals(parse_rules(HOT, "t.yaml")) or {"power_watts"})


QUIET_AGAIN = """\
version: 1
rules:
  - name: link_quiet_again
    scope: nvlink
    when: >-
      has(link.signals.nvlink_crc_errors) && link.signals.nvlink_crc_errors > 0.0
      && increase("nvlink_crc_errors", "1m") == 0.0
    severity: info
"""

FLEET_SHARE = """\
version: 1
rules:
  - name: most_of_the_fleet_gone
    scope: nvlink
    when: 'fleet.nodes_reachable * 2 < fleet.nodes'
    severity: info
"""


class TestSweepOnlyWhatTimeCanChange:
    """A sweep evaluates a target only when its answer can change with time alone."""

    @staticmethod
    def fleet_with_counters(clock: FakeClock, rules: str) -> tuple[FleetModel, Evaluator]:
        fleet = FleetModel()
        ev = evaluator(rules, fleet, clock, 10.0)
        for name in ("n0", "n1"):
            fleet.on_hello(made_up_hello(name, gpus=2, nvlinks=4, ib_ports=0), 0.0, 0.0)
            for gpu in fleet.view()[name].gpus.values():
                for link in range(4):
                    fleet.apply_samples(
                        name, [sample_to_pb(Target.nvlink(gpu.uuid, link), "nvlink_crc_errors", 0)]
                    )
        ev.tick()  # the first: everything
        return fleet, ev

    def test_still_counters_are_not_swept(self):
        """16 NVLinks whose counters never moved: a whole sweep period evaluates none of them."""
        clock = FakeClock()
        _fleet, ev = self.fleet_with_counters(clock, QUIET_AGAIN)
        before = ev.evaluations
        for _ in range(12):
            clock.advance(1.0)
            ev.tick()
        assert ev.evaluations == before

    def test_a_counter_that_moved_is_swept_until_its_window_passes(self):
        """A link's errors grew once, then nothing more came: only the sweep can see the minute
        pass, and it fires the incident; the other links are never looked at."""
        clock = FakeClock()
        fleet, ev = self.fleet_with_counters(clock, QUIET_AGAIN)
        (gpu, *_) = fleet.view()["n1"].gpus.values()
        fleet.apply_samples(
            "n1", [sample_to_pb(Target.nvlink(gpu.uuid, 2), "nvlink_crc_errors", 7)]
        )
        assert ev.tick(urgent=True) == []  # it grew within the minute: not quiet yet
        fired = []
        before = ev.evaluations
        for _ in range(75):
            clock.advance(1.0)
            fired += [
                o.transition.incident.target
                for o in ev.tick()
                if o.transition.incident.phase == Phase.FIRING
            ]
        assert fired == ["n1/gpu/0/nvlink/2"]
        # about 6 sweeps of that one link, then the open incident's evaluations each tick
        assert ev.evaluations - before < 75 + 10

    def test_rules_reading_the_fleet_are_swept_everywhere(self):
        """A condition on the fleet can change with any node: the sweep evaluates it on every
        target, even still ones."""
        clock = FakeClock()
        fleet, ev = self.fleet_with_counters(clock, FLEET_SHARE)
        fleet.mark_unreachable("n0")
        fleet.mark_unreachable("n1")
        ev.tick()
        fired = set()
        for _ in range(11):
            clock.advance(1.0)
            fired |= {o.transition.incident.target for o in ev.tick()}
        assert len(fired) == 16

    def test_a_hello_then_its_first_report_evaluate_the_node_once(self):
        """A node that said Hello and sent a Report a rule reads: the event's urgent tick
        evaluates all of it, and the next regular tick none of it again."""
        clock = FakeClock()
        fleet, ev = self.fleet_with_counters(clock, QUIET_AGAIN)
        fleet.on_hello(made_up_hello("n0", gpus=2, nvlinks=4, ib_ports=0), 0.0, 0.0)
        gpus = list(fleet.view()["n0"].gpus.values())
        for gpu in gpus:  # its first Report: every link, one counter a rule reads
            fleet.apply_samples(
                "n0", [sample_to_pb(Target.nvlink(gpu.uuid, i), "x", 1) for i in range(4)]
            )
        fleet.apply_samples(
            "n0", [sample_to_pb(Target.nvlink(gpus[0].uuid, 0), "nvlink_crc_errors", 1)]
        )
        before = ev.evaluations
        ev.tick(urgent=True)
        assert ev.evaluations == before + 8  # every link of n0, not only the one reported
        ev.tick()
        assert ev.evaluations == before + 8  # and not again: n0 was done

    def test_a_hello_evaluates_the_whole_node_once(self):
        """A node that said Hello again starts afresh: every target of it is evaluated at the
        next regular tick, nothing of the other node."""
        clock = FakeClock()
        fleet, ev = self.fleet_with_counters(clock, QUIET_AGAIN)
        fleet.on_hello(made_up_hello("n0", gpus=2, nvlinks=4, ib_ports=0), 0.0, 0.0)
        for gpu in fleet.view()["n0"].gpus.values():
            fleet.apply_samples(
                "n0", [sample_to_pb(Target.nvlink(gpu.uuid, i), "x", 1) for i in range(4)]
            )
        before = ev.evaluations
        ev.tick(urgent=True)
        assert ev.evaluations == before  # "x" is read by no rule
        ev.tick()
        assert ev.evaluations == before + 8


SLOW_HOT = HOT.replace("    severity: warning\n", "    for: 2m\n    severity: warning\n")
INSTANT_HOT = (
    "  - name: very_hot\n"
    "    scope: gpu\n"
    "    when: 'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 99.0'\n"
    "    severity: critical\n"
)


def one_gpu(rules: str) -> tuple[FakeClock, FleetModel, Evaluator, str]:
    """A node of one GPU under ``rules``, its first sweep done: (clock, fleet, evaluator, uuid)."""
    clock = FakeClock()
    fleet = FleetModel()
    fleet.on_hello(made_up_hello("n1", gpus=1, ib_ports=0), 0.0, 0.0)
    ev = evaluator(rules, fleet, clock, 3600.0)
    ev.tick()
    (uuid,) = fleet.view()["n1"].gpus
    return clock, fleet, ev, uuid


class TestPacedSignals:
    """A signal read only by rules that must hold a minute or more is evaluated at a pace."""

    def test_only_signals_whose_every_reader_holds_a_minute_are_paced(self):
        slow = parse_rules(SLOW_HOT, "t.yaml")
        assert "temperature_celsius" in paced_signals(slow, watched_signals(slow))
        both = parse_rules(SLOW_HOT + INSTANT_HOT, "t.yaml")
        assert "temperature_celsius" not in paced_signals(both, watched_signals(both))

    def test_a_temperature_moving_every_second_is_evaluated_every_five(self):
        clock, fleet, ev, uuid = one_gpu(SLOW_HOT)
        before = ev.evaluations
        for second in range(20):
            temp = 60.0 + second % 3
            fleet.apply_samples("n1", [sample_to_pb(Target.gpu(uuid), "temperature_celsius", temp)])
            ev.tick()
            clock.advance(1.0)
        assert 4 <= ev.evaluations - before <= 5  # not 20

    def test_a_held_sample_is_evaluated_when_its_pause_ends(self):
        """Nothing held is lost: the last value of a pause is evaluated once it ends, though no
        sample follows it (an agent sends only changes). A target with an open incident is
        evaluated at every tick, paced or not."""
        clock, fleet, ev, uuid = one_gpu(SLOW_HOT)
        key = gpu_key("n1", fleet.view()["n1"].gpus[uuid].index)

        def temp(value: float) -> None:
            sample = sample_to_pb(Target.gpu(uuid), "temperature_celsius", value)
            fleet.apply_samples("n1", [sample])

        temp(70.0)
        ev.tick()  # the first sample of a pause goes through
        clock.advance(1.0)
        temp(95.0)  # within the pause: held
        ev.tick()
        assert ev.engine.get("hot", key) is None
        clock.advance(4.5)
        ev.tick()  # the pause is over: the held 95 °C is evaluated
        incident = ev.engine.get("hot", key)
        assert incident is not None
        assert incident.phase == Phase.PENDING
        clock.advance(1.0)
        temp(70.0)  # an open incident's target: evaluated at the next tick
        ev.tick()
        assert ev.engine.get("hot", key) is None

    def test_a_pause_that_ends_is_let_through_at_whichever_tick_comes_first(self):
        """Urgent ticks release paced samples too, so pauses keep their samples' phases: at
        regular ticks alone, every busy GPU's pause came to begin and end at one, and a regular
        tick at 4,096 nodes evaluated 11,000 of them at once."""
        clock, fleet, ev, uuid = one_gpu(SLOW_HOT)
        key = gpu_key("n1", fleet.view()["n1"].gpus[uuid].index)
        gpu = Target.gpu(uuid)
        fleet.apply_samples("n1", [sample_to_pb(gpu, "temperature_celsius", 70.0)])
        ev.tick(urgent=True)  # the first sample of a pause goes through
        clock.advance(1.0)
        fleet.apply_samples("n1", [sample_to_pb(gpu, "temperature_celsius", 95.0)])  # held
        ev.tick(urgent=True)
        assert ev.engine.get("hot", key) is None
        assert not ev.has_changes()  # held: nothing to evaluate until the pause is over
        clock.advance(4.5)
        assert ev.has_changes()
        ev.tick(urgent=True)  # the pause is over: the held 95 °C is evaluated
        incident = ev.engine.get("hot", key)
        assert incident is not None
        assert incident.phase == Phase.PENDING
        assert not ev.has_changes()

    def test_a_reports_signals_of_one_target_go_through_together(self):
        """An NVLink's three counters arrive in one report: evaluated once, not again 5 s on."""
        rules = SLOW_HOT.replace(
            "temperature_celsius > 90.0",
            "temperature_celsius > 90.0 && "
            "has(gpu.signals.power_watts) && gpu.signals.power_watts > 1.0",
        )
        clock, fleet, ev, uuid = one_gpu(rules)
        before = ev.evaluations
        gpu = Target.gpu(uuid)
        fleet.apply_samples(
            "n1",
            [sample_to_pb(gpu, "temperature_celsius", 70.0), sample_to_pb(gpu, "power_watts", 400)],
        )
        ev.tick()
        assert ev.evaluations == before + 1
        clock.advance(6.0)
        ev.tick()  # nothing was held: nothing more to evaluate
        assert ev.evaluations == before + 1


class TestNodesWithoutReadings:
    """A node restored from the journal, or that said Hello again, holds no readings until its
    first Report: an incident open on it is not resolved by the want of data."""

    def test_an_open_incident_waits_for_the_first_report_before_it_resolves(self):
        clock = FakeClock()
        fleet = FleetModel()
        fleet.on_hello(made_up_hello("n1", gpus=1, ib_ports=0), 0.0, 0.0)
        ev = evaluator(HOT, fleet, clock, 1.0)
        (uuid,) = fleet.view()["n1"].gpus
        fleet.apply_samples("n1", [sample_to_pb(Target.gpu(uuid), "temperature_celsius", 95.0)])
        ev.tick()
        assert [(i.rule, i.phase) for i in ev.engine.open_incidents()] == [("hot", Phase.FIRING)]

        fleet.on_hello(made_up_hello("n1", gpus=1, ib_ports=0), 1.0, 0.0)  # it reconnects
        for _ in range(3):
            clock.advance(1.0)
            assert ev.tick() == []  # evaluated, but nothing read yet: still firing
        assert [i.phase for i in ev.engine.open_incidents()] == [Phase.FIRING]

        fleet.apply_samples("n1", [sample_to_pb(Target.gpu(uuid), "temperature_celsius", 60.0)])
        clock.advance(1.0)
        resolved = [o.transition.incident for o in ev.tick()]
        assert [(i.rule, i.phase) for i in resolved] == [("hot", Phase.RESOLVED)]

    def test_a_rule_that_holds_still_fires_on_a_node_without_readings(self):
        """A node taken back from the journal that never reconnects is still seen: a rule
        about its liveness holds without a Report."""
        clock = FakeClock()
        fleet = FleetModel()
        fleet.restore(made_up_hello("n1", gpus=0, ib_ports=0), reachable=False, mono=0.0, unix=0.0)
        ev = evaluator(RULES, fleet, clock, 1.0)
        ev.tick()
        assert [(i.rule, i.phase) for i in ev.engine.open_incidents()] == [
            ("any_node", Phase.FIRING)
        ]


def first_report(fleet: FleetModel, node: str) -> None:
    """A node's first Report: each GPU's temperature and each of its 18 links' ``nvlink_up``."""
    uuids = list(fleet.view()[node].gpus)
    fleet.apply_samples(
        node,
        [sample_to_pb(Target.gpu(u), "temperature_celsius", 60.0) for u in uuids]
        + [sample_to_pb(Target.nvlink(u, i), "nvlink_up", 1) for u in uuids for i in range(18)],
    )


class TestHelloEvaluation:
    """A node's Hello evaluates it whole, but not a rule of windows alone on a still target."""

    RATES = """\
version: 1
rules:
  - name: link_errors
    scope: nvlink
    when: 'rate("nvlink_crc_errors", "5m") > 100.0'
    severity: warning
  - name: no_growth
    scope: gpu
    when: 'increase("ecc_sbe_aggregate_total", "1h") == 0.0'
    severity: info
  - name: hot
    scope: gpu
    when: 'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 90.0'
    severity: warning
"""

    def test_windows_alone_are_left_out_while_still_and_kept_when_they_can_hold(self):
        """The NVLink rate rule cannot hold on still windows: no link is evaluated at the
        Hello. A rule that holds at zero (no growth) is evaluated, as is the plain one."""
        clock = FakeClock()
        fleet = FleetModel()
        ev = evaluator(self.RATES, fleet, clock, 30.0)
        ev.tick()
        fleet.on_hello(made_up_hello("n1", gpus=8, nvlinks=18, ib_ports=0), 0.0, 0.0)
        fleet.apply_samples("n1", [])
        before = ev.evaluations
        ev.tick()
        assert ev.evaluations - before == 8 * 2  # no_growth and hot on 8 GPUs, no link
        assert {i.rule for i in ev.engine.open_incidents()} == {"no_growth"}

    def stepped_link(self, clock: FakeClock, nvlinks: int) -> tuple[FleetModel, Evaluator, Target]:
        """A node of one GPU whose link 1 counted 90,000 CRC errors in 10 s: link_errors fires."""
        fleet = FleetModel()
        ev = evaluator(self.RATES, fleet, clock, 30.0)
        fleet.on_hello(made_up_hello("n1", gpus=1, nvlinks=nvlinks, ib_ports=0), 0.0, 0.0)
        (uuid,) = fleet.view()["n1"].gpus
        link = Target.nvlink(uuid, 1)
        fleet.apply_samples("n1", [sample_to_pb(link, "nvlink_crc_errors", 0.0)])
        ev.tick()
        clock.advance(10.0)
        fleet.apply_samples("n1", [sample_to_pb(link, "nvlink_crc_errors", 90_000.0)])
        ev.tick()
        return fleet, ev, link

    def test_a_link_whose_counter_stepped_is_evaluated_at_the_hello(self):
        clock = FakeClock()
        fleet, ev, link = self.stepped_link(clock, 18)
        fleet.on_hello(made_up_hello("n1", gpus=1, nvlinks=18, ib_ports=0), 10.0, 0.0)
        fleet.apply_samples("n1", [sample_to_pb(link, "nvlink_crc_errors", 90_000.0)])
        before = ev.evaluations
        ev.tick()
        # the GPU's two rules and the one link whose counter stepped within its window
        assert ev.evaluations - before == 2 + 1
        assert "link_errors" in {i.rule for i in ev.engine.open_incidents()}

    def test_a_first_report_marking_every_link_changed_leaves_windows_alone_out(self):
        """The first Report carries each link's ``nvlink_up``, which marks the link changed;
        on still windows the rate rule is still not asked there (before: once per link)."""
        clock = FakeClock()
        fleet = FleetModel()
        ev = evaluator(self.RATES, fleet, clock, 30.0)
        ev.tick()
        fleet.on_hello(made_up_hello("n1", gpus=8, nvlinks=18, ib_ports=0), 0.0, 0.0)
        uuids = list(fleet.view()["n1"].gpus)
        fleet.apply_samples(
            "n1",
            [sample_to_pb(Target.nvlink(u, i), "nvlink_up", 1) for u in uuids for i in range(18)],
        )
        before = ev.evaluations
        ev.tick(urgent=True)
        assert ev.evaluations - before == 8 * 2  # no_growth and hot on 8 GPUs, no link

    def test_an_open_incident_keeps_its_rule_on_a_hello_so_that_it_can_end(self):
        """A link whose error rate fired, then went quiet past its window: the node's Hello
        evaluates the rate rule there still (it holds an incident), and the incident ends."""
        clock = FakeClock()
        fleet, ev, link = self.stepped_link(clock, 2)
        assert "link_errors" in {i.rule for i in ev.engine.open_incidents()}
        clock.advance(600.0)  # past the 5-minute window: still again
        fleet.on_hello(made_up_hello("n1", gpus=1, nvlinks=2, ib_ports=0), clock.monotonic(), 0.0)
        fleet.apply_samples("n1", [sample_to_pb(link, "nvlink_crc_errors", 90_000.0)])
        ev.tick()
        assert "link_errors" not in {i.rule for i in ev.engine.open_incidents()}

    def test_nodes_restored_from_the_journal_wait_for_their_hello_to_be_evaluated_whole(self):
        """At a start the journal's nodes are back in the model but not connected: the first
        tick asks only their node rules (a node that never returns is seen); each is evaluated
        whole once its agent says Hello (before: every one whole at the first tick, seconds of
        one callback for a large fleet, and again at its Hello)."""
        rules = self.RATES + RULES.split("rules:\n", 1)[1]
        clock = FakeClock()
        fleet = FleetModel()
        for i in range(3):
            hello = made_up_hello(f"n{i}", gpus=8, nvlinks=18, ib_ports=0)
            fleet.restore(hello, reachable=True, mono=0.0, unix=0.0)
        ev = evaluator(rules, fleet, clock, 30.0)
        ev.tick()
        assert ev.evaluations == 3  # any_node on each node, no GPU rule
        fleet.on_hello(made_up_hello("n1", gpus=8, nvlinks=18, ib_ports=0), 0.0, 0.0)
        fleet.apply_samples("n1", [])  # its first Report
        clock.advance(1.0)
        before = ev.evaluations
        ev.tick()
        assert ev.evaluations - before == 1 + 8 * 2  # n1 whole: any_node, and two rules a GPU

    def test_a_node_is_evaluated_whole_once_its_first_report_is_in(self):
        """In a restart storm a tick comes between most nodes' Hello and their first Report.
        Such a node is not evaluated whole while it has no readings; its first Report then
        still marks only the node, and the next tick evaluates it whole, once (before: whole
        at the tick without readings, then each target its Report marked, again)."""
        clock = FakeClock()
        fleet = FleetModel()
        ev = evaluator(self.RATES, fleet, clock, 3600.0)
        ev.tick()
        fleet.on_hello(made_up_hello("n1", gpus=8, nvlinks=18, ib_ports=0), 0.0, 0.0)
        clock.advance(1.0)
        before = ev.evaluations
        ev.tick()
        ev.tick(urgent=True)
        assert ev.evaluations == before  # no readings yet: nothing of n1
        first_report(fleet, "n1")
        assert ev.changes.dirty == {("n1", "n1")}
        assert ev.changes.touched == {}
        clock.advance(1.0)
        ev.tick()
        assert ev.evaluations - before == 8 * 2  # all of n1: no_growth and hot on 8 GPUs
        assert ev.changes.whole_next == set()  # once only

    def test_a_node_that_leaves_before_its_first_report_is_not_waited_for(self):
        """A node that said Hello and went away before its first Report leaves the list of
        those to evaluate whole; its next Hello puts it back."""
        clock = FakeClock()
        fleet = FleetModel()
        ev = evaluator(self.RATES, fleet, clock, 3600.0)
        ev.tick()
        fleet.on_hello(made_up_hello("n1", gpus=8, nvlinks=18, ib_ports=0), 0.0, 0.0)
        ev.tick()
        assert ev.changes.whole_next == {"n1"}
        fleet.on_disconnect("n1")
        ev.tick()
        assert ev.changes.whole_next == set()
        fleet.on_hello(made_up_hello("n1", gpus=8, nvlinks=18, ib_ports=0), 0.0, 0.0)
        fleet.apply_samples("n1", [])
        before = ev.evaluations
        ev.tick()
        assert ev.evaluations - before == 8 * 2
        assert ev.changes.whole_next == set()

    def test_a_first_report_marks_its_node_not_each_target(self):
        """The first Report after a Hello (evaluated whole anyway) marks only its node, and
        the urgent tick of its event still evaluates all of it."""
        clock = FakeClock()
        fleet = FleetModel()
        ev = evaluator(self.RATES, fleet, clock, 30.0)
        ev.tick()
        fleet.on_hello(made_up_hello("n1", gpus=8, nvlinks=18, ib_ports=0), 0.0, 0.0)
        first_report(fleet, "n1")
        assert ev.changes.dirty == {("n1", "n1")}
        assert ev.changes.touched == {}
        before = ev.evaluations
        ev.tick(urgent=True)
        assert ev.evaluations - before == 8 * 2  # all of n1: no_growth and hot on 8 GPUs


CONGESTION = """\
version: 1
rules:
  - name: congested
    scope: fleet
    when: 'share_of_ports("ib_port_xmit_wait_per_second", 1000.0) >= 0.25'
    severity: warning
    actions: [notify]
"""


def test_the_fleet_tally_comes_in_parts_and_share_of_ports_from_it():
    """A regular tick counts the fleet (and each share_of_ports threshold the rules asked for)
    in parts of TALLY_CHUNK nodes, so the loop can take turns between; the shares agree with
    counting every port at once, and the fleet rule reads them."""
    clock = FakeClock()
    fleet = FleetModel()
    count = 2 * TALLY_CHUNK + 10
    for i in range(count):
        hello = made_up_hello(f"n{i:04d}", gpus=0, ib_ports=2)
        fleet.on_hello(hello, clock.monotonic(), 0.0)
        wait = 5000.0 if i % 3 == 0 else 10.0  # a third of the nodes' ports wait to send
        fleet.apply_samples(
            hello.node,
            [
                sample_to_pb(Target.ib_port(p.device, p.port), "ib_port_xmit_wait_per_second", wait)
                for p in hello.ib_ports
            ],
        )
    ev = evaluator(CONGESTION, fleet, clock, 30.0)
    fired = {o.transition.incident.rule for o in ev.tick()}  # the first: asked, counted at once
    assert fired == {"congested"}
    direct = ev.tally.share_now("ib_port_xmit_wait_per_second", 1000.0)
    assert abs(direct - (TALLY_CHUNK * 2 + 10 + 2) // 3 / count) < 1e-9
    clock.advance(1.0)
    parts = list(ev.steps())
    # the tally's parts (one per TALLY_CHUNK nodes), then the fleet rule's (no node has rules)
    assert parts == [[]] * -(-count // TALLY_CHUNK) + [[]]
    assert ev.tally.shares == {("ib_port_xmit_wait_per_second", 1000.0): direct}
    assert {e.rule for e in ev.engine.open_incidents()} == {"congested"}


def test_a_rank_named_culprit_has_its_gpu_judged_at_the_next_tick_not_at_the_sweep():
    """Rank 5 of a job (node-c GPU 1; node-c's IB port went down) is killed: once the book
    names it the failed job's culprit, gpu_hang_culprit fires on its GPU at the next tick or the
    one after, not when an hour's sweep comes round to node-c (the GPU has no incident of its
    own, which would have it evaluated every tick: the fault is the port's)."""
    w = job_world()
    ev = Evaluator(
        rules=load_rules(),
        fleet=w.fleet,
        catalog=load_catalog(),
        clock=w.clock,
        jobs=w.book,
        full_sweep_s=3600.0,
    )
    w.fleet.observer = ev
    w.run(range(20))
    ev.tick()
    port = Target.ib_port("mlx5_0", 1)
    w.fleet.apply_report("node-c", pb.Report(samples=[sample_to_pb(port, IB_STATE, "DOWN")]))
    ticks_named, ticks_fired = None, None
    for tick in range(1, 31):
        w.clock.advance(1.0)
        for node in w.nodes:
            processes = [
                pb.RankProcess(job_id="j", rank=r, state="exited" if r == 5 else "sleeping")
                for r in range(w.ranks)
                if w.place(r)[0] == node
            ]
            w.book.ingest(node, pb.JobReport(processes=processes))
        outcomes = ev.tick()
        if ticks_named is None and w.book.rank_on("node-c", made_up_uuid("node-c", 1)).get(
            "hang_culprit"
        ):
            ticks_named = tick
        fired = [
            o.transition.incident.target
            for o in outcomes
            if o.transition.incident.rule == "gpu_hang_culprit"
            and o.transition.incident.phase == Phase.FIRING
        ]
        if fired and ticks_fired is None:
            assert fired == ["node-c/gpu/1"]
            ticks_fired = tick
    assert ticks_named is not None, "rank 5 was never named"
    assert ticks_fired is not None, "gpu_hang_culprit never fired"
    assert ticks_fired - ticks_named <= 1, (ticks_named, ticks_fired)
