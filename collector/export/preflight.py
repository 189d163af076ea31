"""Prometheus metrics of pre-flight: the latest qualification of each node, and the runs.

Per node (2 series): the verdict of the newest finished run that qualified it, as a number
(0 pass, 1 warn, 2 fail, 3 could not run), and when that run finished. Fleet-wide: runs by
verdict, the runs in progress, the newest run's verdict and time, and results refused by reason.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Final

from prometheus_client.registry import Collector

from collector.export.catalog import catalog, families
from fleetwatch.preflight.vocabulary import RANK, Verdict

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client import Metric

    from collector.preflight.orchestrator import PreflightService
    from collector.stats import CollectorStats

GROUP: Final = "Pre-flight"


def verdict_code(verdict: str) -> int:
    """0 pass, 1 warn, 2 fail, 3 could not run (the vocabulary's order, worst last)."""
    try:
        return RANK[Verdict(verdict)]
    except ValueError:
        return RANK[Verdict.COULD_NOT_RUN]


class PreflightCollector(Collector):
    """Yields the pre-flight families from the service's newest runs at scrape time."""

    def __init__(self, service: PreflightService, stats: CollectorStats | None = None) -> None:
        """Read from ``service`` (and the refusal counts in ``stats``)."""
        self._service = service
        self._stats = stats

    def describe(self) -> list[Metric]:
        """Skip the registration-time collect (families are dynamic)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Render every family."""
        f = families(s.name for s in catalog() if s.group == GROUP)
        service = self._service
        for node, (verdict, finished_ms) in sorted(dict(service.node_latest).items()):
            f["fleetwatch_preflight_node_verdict"].add_metric([node], verdict_code(verdict))
            f["fleetwatch_preflight_node_checked_timestamp_seconds"].add_metric(
                [node], finished_ms / 1000
            )
        for verdict, count in sorted(dict(service.runs_total).items()):
            f["fleetwatch_preflight_runs_total"].add_metric([verdict], count)
        f["fleetwatch_preflight_runs_running"].add_metric([], len(service.live))
        latest = service.latest
        if latest is not None:
            f["fleetwatch_preflight_latest_verdict"].add_metric([], verdict_code(latest.verdict))
            f["fleetwatch_preflight_latest_timestamp_seconds"].add_metric(
                [], latest.finished_ms / 1000
            )
        refused = Counter(service.results_refused)  # not asked, not planned, duplicates
        if self._stats is not None:
            refused.update(self._stats.preflight_refused)  # what the wire screen refused
        for reason, count in sorted(refused.items()):
            f["fleetwatch_preflight_results_refused_total"].add_metric([reason], count)
        yield from f.values()
