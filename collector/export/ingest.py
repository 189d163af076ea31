"""Prometheus metrics of ingest: budgets that held streams back, coalesced floods, bad values.

Per node: the time its stream was held back, per budget, and its events journaled in coalesced
rows (3 series a node), for the nodes that were ever held back or coalesced, at most the
:data:`NODE_SERIES_CAP` most held back: these series are on the fleet's own scrape target, which
must stay under Prometheus' ``sample_limit`` at any fleet size (3 series for each of 2,048 nodes
were over 5,000, and the target went down). Fleet-wide, by reason: streams held back per budget,
samples refused and agent clocks that could not be right, and counters that went down.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Final

from prometheus_client.registry import Collector

from collector.export.catalog import catalog, families
from collector.ingest.throttle import BUDGETS

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client import Metric

    from collector.ingest.throttle import IngestThrottle
    from collector.stats import CollectorStats

GROUP: Final = "Ingest budgets and hostile values"
# Nodes with per-node ingest series, at most (3 series each on the fleet target).
NODE_SERIES_CAP: Final = 500


class IngestCollector(Collector):
    """Yields the ingest families from the throttle and the collector's counters at scrape time."""

    def __init__(self, throttle: IngestThrottle, stats: CollectorStats) -> None:
        """Read from both; register with a registry you own."""
        self._throttle = throttle
        self._stats = stats

    def describe(self) -> list[Metric]:
        """Skip the registration-time collect (families are dynamic)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Render every family."""
        f = families(s.name for s in catalog() if s.group == GROUP)
        totals = dict.fromkeys(BUDGETS, 0)
        views = self._throttle.snapshot()
        for node in views:
            for budget in BUDGETS:
                totals[budget] += node.throttled[budget]
        held = [n for n in views if n.coalesced or any(n.throttled_s.values())]
        if len(held) > NODE_SERIES_CAP:
            held = heapq.nlargest(
                NODE_SERIES_CAP, held, key=lambda n: (sum(n.throttled_s.values()), n.coalesced)
            )
        for node in held:
            for budget in BUDGETS:
                f["fleetwatch_node_ingest_throttled_seconds_total"].add_metric(
                    [node.node, budget], node.throttled_s[budget]
                )
            f["fleetwatch_node_events_coalesced_total"].add_metric([node.node], node.coalesced)
        for budget, count in totals.items():
            f["fleetwatch_collector_ingest_throttled_total"].add_metric([budget], count)
        stats = self._stats
        for reason, count in sorted(stats.samples_rejected_snapshot().items()):
            f["fleetwatch_collector_samples_rejected_total"].add_metric([reason], count)
        for reason, count in sorted(stats.bad_times_snapshot().items()):
            f["fleetwatch_collector_bad_times_total"].add_metric([reason], count)
        f["fleetwatch_collector_sample_resets_total"].add_metric([], stats.counter_resets)
        yield from f.values()
