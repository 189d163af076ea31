"""The evaluator spreads its sweep of the whole fleet over ticks, and events evaluate at once."""

from collector.fleet import FleetModel
from collector.incidents import Evaluator, watched_signals
from fleetwatch.model import Target
from fleetwatch.testing import FakeClock, made_up_hello
from rules.loader import parse_rules
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


def test_sweep_is_spread_over_the_sweep_period():
    """30 nodes, a 30 s sweep, a tick a second: the first tick sees all, then one node a tick,
    and every node again within 30 s."""
    clock = FakeClock()
    fleet = fleet_of(30, clock)
    ev = Evaluator(
        rules=parse_rules(RULES, "t.yaml"),
        fleet=fleet,
        catalog=load_catalog(),
        clock=clock,
        full_sweep_s=30.0,
    )
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
    ev = Evaluator(
        rules=parse_rules(RULES, "t.yaml"),
        fleet=fleet,
        catalog=load_catalog(),
        clock=clock,
        full_sweep_s=1.0,
    )
    fleet.observer = ev
    ev.tick()
    clock.advance(5.0)
    fleet.mark_unreachable("n07")
    before = ev.evaluations
    outcomes = ev.tick(urgent=True)
    assert ev.evaluations - before == 1
    assert {o.transition.incident.target for o in outcomes} == {"n07"}


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
        ev = Evaluator(
            rules=parse_rules(HOT, "t.yaml"), fleet=fleet, catalog=load_catalog(), clock=clock
        )
        ev.tick()  # the first sweep
        node = fleet.view()["n1"]
        (gpu,) = node.gpus.values()
        before = ev.evaluations
        ev.note_sample(node, Target.gpu(gpu.uuid), "power_watts", 400.0)
        ev.tick(urgent=True)
        assert ev.evaluations == before
        ev.note_sample(node, Target.gpu(gpu.uuid), "temperature_celsius", 95.0)
        ev.tick(urgent=True)
        assert ev.evaluations == before + 1
        ev.note_sample(node, Target.nvlink(gpu.uuid, 3), "nvlink_up", 0)
        ev.tick(urgent=True)
        assert ev.evaluations == before + 2

    def test_a_condition_walking_the_signals_map_watches_everything(self):
        walks = HOT.replace(
            "'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 90.0'",
            "'size(gpu.signals) > 3'",
        )
        assert watched_signals(parse_rules(walks, "t.yaml")) is None
        assert "power_watts" not in (watched_signals(parse_rules(HOT, "t.yaml")) or {"power_watts"})
