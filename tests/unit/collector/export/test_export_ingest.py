"""The ingest series on the fleet's own scrape target stay bounded at any fleet size."""

from prometheus_client import CollectorRegistry, generate_latest

from collector.export.ingest import NODE_SERIES_CAP, IngestCollector
from collector.ingest.throttle import IngestThrottle
from collector.stats import CollectorStats


def series(throttle: IngestThrottle) -> dict[str, list[str]]:
    registry = CollectorRegistry()
    registry.register(IngestCollector(throttle, CollectorStats()))
    out: dict[str, list[str]] = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out.setdefault(name, []).append(line)
    return out


def test_only_held_nodes_have_series_and_at_most_the_cap_of_them():
    """3,000 nodes, 700 of them held back once (node i for i seconds): the fleet target
    carries the 500 most held back, and the fleet-wide total counts all 700."""
    throttle = IngestThrottle()
    for i in range(3000):
        node = throttle.node(f"n{i:04d}", 0.0)
        if i < 700:
            node.throttled_s["events"] += float(i + 1)
            node.throttled["events"] += 1
    got = series(throttle)
    held = got["fleetwatch_node_ingest_throttled_seconds_total"]
    nodes = {line.split('node="', 1)[1].split('"', 1)[0] for line in held}
    assert len(nodes) == NODE_SERIES_CAP
    assert nodes == {f"n{i:04d}" for i in range(700 - NODE_SERIES_CAP, 700)}
    assert len(got["fleetwatch_node_events_coalesced_total"]) == NODE_SERIES_CAP
    (events,) = [
        line
        for line in got["fleetwatch_collector_ingest_throttled_total"]
        if 'budget="events"' in line
    ]
    assert events.endswith(" 700.0")


def test_a_quiet_fleet_has_no_per_node_ingest_series():
    throttle = IngestThrottle()
    for i in range(2048):
        throttle.node(f"n{i:04d}", 0.0)
    got = series(throttle)
    assert "fleetwatch_node_ingest_throttled_seconds_total" not in got
    assert "fleetwatch_node_events_coalesced_total" not in got
