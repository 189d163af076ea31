"""The reliability families in a scrape: histograms, 30-day gauges, lemons, bounded per node."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.export.catalog import by_name
from collector.export.reliability import ReliabilityCollector
from collector.model.recent_faults import RecentFaults
from collector.model.reliability import fleet_figures
from collector.store.lifecycle import TransitionRow
from fleetwatch.testing import FakeClock


def scrape(collector: ReliabilityCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    families = list(text_string_to_metric_families(text))
    for family in families:  # every family is the catalog's, of its type
        name = family.name + ("_total" if family.type == "counter" else "")
        assert by_name()[name].kind == family.type
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


class TestReliabilityCollector:
    def test_before_any_refresh_and_with_nothing_recent(self):
        """The histograms are there, empty; no 30-day gauge yet; no node has a series."""
        recent = RecentFaults(FakeClock())
        got = scrape(ReliabilityCollector(recent, lambda: (None, 0.0), frozenset))
        assert got["fleetwatch_node_repair_seconds_count", ()] == 0
        assert got["fleetwatch_node_repair_seconds_bucket", (("le", "900.0"),)] == 0
        assert got["fleetwatch_node_time_between_incidents_seconds_bucket", (("le", "+Inf"),)] == 0
        assert got["fleetwatch_fleet_lemon_nodes", ()] == 0
        assert not any(name.startswith("fleetwatch_fleet_gpu") for name, _ in got)
        per_node = {"fleetwatch_node_remediations", "fleetwatch_node_lemon"}
        assert not [key for key in got if key[0] in per_node]

    def test_figures_lemons_and_the_nodes_with_something(self):
        clock = FakeClock()
        recent = RecentFaults(clock)
        now = round(clock.now() * 1000)
        recent.moved(TransitionRow("n1", "drained", "in_service", now - 7_200_000, "action:a"))
        recent.moved(TransitionRow("n1", "in_service", "drained", now - 3_600_000, "person:a"))
        recent.action("drain_node", "succeeded", "n1")
        rows = [
            TransitionRow("n1", "drained", "in_service", now - 7_200_000, "action:a"),
            TransitionRow("n1", "in_service", "drained", now - 3_600_000, "person:a"),
        ]
        figures = fleet_figures(
            rows, now_ms=now, window_s=30 * 86400.0, gpus={"n1": 8, "n2": 8, "n3": 8}
        )
        lemons = frozenset({"n1", "n9"})
        collector = ReliabilityCollector(recent, lambda: (figures, 0.25), lambda: lemons)
        got = scrape(collector)
        assert got["fleetwatch_node_repair_seconds_count", ()] == 1
        assert got["fleetwatch_node_repair_seconds_sum", ()] == 3600.0
        assert got["fleetwatch_node_repair_seconds_bucket", (("le", "3600.0"),)] == 1
        assert got["fleetwatch_node_repair_seconds_bucket", (("le", "1800.0"),)] == 0
        ratio = got["fleetwatch_fleet_gpu_time_lost_ratio", ()]
        assert ratio == 8 * 3600 / (24 * 30 * 86400)
        assert got["fleetwatch_fleet_mean_time_to_repair_seconds", ()] == 3600.0
        assert ("fleetwatch_fleet_mean_time_between_incidents_seconds", ()) not in got  # one
        assert got["fleetwatch_fleet_lemon_nodes", ()] == 2
        node = (("node", "n1"),)
        assert got["fleetwatch_node_remediations", node] == 1
        assert got["fleetwatch_node_lemon", node] == 1
        assert got["fleetwatch_node_lemon", (("node", "n9"),)] == 1  # firing, counts aged out
        assert ("fleetwatch_node_remediations", (("node", "n9"),)) not in got  # none
        assert ("fleetwatch_node_lemon", (("node", "n2"),)) not in got  # not a lemon: no series
        assert got["fleetwatch_reliability_refresh_duration_seconds", ()] == 0.25
