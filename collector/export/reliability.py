"""Prometheus metrics of the fleet's reliability: time to repair, between incidents, lemons.

The two histograms are observed live (:class:`~collector.model.recent_faults.RecentFaults`), so
Prometheus' ``rate()`` and ``histogram_quantile()`` work on them; the 30-day gauges come from the
last refresh of the figures from the journal (computed off the scrape thread: a scrape only reads
them). Per node there are two families, bounded by the nodes that need fixing: a node's
remediations of the last 7 days (only the nodes with one) and the lemon flag (only the lemons);
the episodes a lemon is also judged by are in the API.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from prometheus_client.registry import Collector

from collector.export.catalog import catalog, families, spec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from prometheus_client import Metric

    from collector.model.recent_faults import RecentFaults
    from collector.model.reliability import Buckets, FleetFigures

GROUP: Final = "Reliability"
REPAIRS: Final = "fleetwatch_node_repair_seconds"
BETWEEN: Final = "fleetwatch_node_time_between_incidents_seconds"
_HISTOGRAMS: Final = frozenset({REPAIRS, BETWEEN})


def histogram(name: str, buckets: Buckets) -> Metric:
    """The family of one of the histograms, from its counts now."""
    family = spec(name).histogram_family()
    cumulative = buckets.cumulative()
    family.add_metric(
        [],
        [("+Inf" if math.isinf(b) else repr(b), float(count)) for b, count in cumulative],
        sum_value=buckets.total,
    )
    return family


class ReliabilityCollector(Collector):
    """Yields the reliability families at scrape time."""

    def __init__(
        self,
        recent: RecentFaults,
        latest: Callable[[], tuple[FleetFigures | None, float]],
        lemons: Callable[[], frozenset[str]],
    ) -> None:
        """Read ``recent``, and the figures of the last refresh.

        ``latest`` gives them (None: none yet) and how long the refresh took; ``lemons`` the
        nodes a lemon rule fires on now.
        """
        self._recent = recent
        self._latest = latest
        self._lemons = lemons

    def describe(self) -> list[Metric]:
        """Skip the registration-time collect (families are dynamic)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Render every family, in the catalog's order."""
        recent = self._recent
        yield histogram(REPAIRS, recent.repairs)
        yield histogram(BETWEEN, recent.between)
        f = families(s.name for s in catalog() if s.group == GROUP and s.name not in _HISTOGRAMS)
        figures, took = self._latest()
        lemons = self._lemons()
        if figures is not None:
            f["fleetwatch_fleet_gpu_time_lost_ratio"].add_metric([], figures.gpu_time_lost_ratio)
            mttr, mtbi = figures.mean_time_to_repair_s, figures.mean_time_between_incidents_s
            if mttr is not None:
                f["fleetwatch_fleet_mean_time_to_repair_seconds"].add_metric([], mttr)
            if mtbi is not None:
                f["fleetwatch_fleet_mean_time_between_incidents_seconds"].add_metric([], mtbi)
        f["fleetwatch_fleet_lemon_nodes"].add_metric([], len(lemons))
        for node, (fixed, _) in sorted(recent.counts().items()):
            if fixed:
                f["fleetwatch_node_remediations"].add_metric([node], fixed)
        for node in sorted(lemons):
            f["fleetwatch_node_lemon"].add_metric([node], 1)
        f["fleetwatch_reliability_refresh_duration_seconds"].add_metric([], took)
        yield from f.values()
