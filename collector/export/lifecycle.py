"""Prometheus metrics of the nodes' lifecycle: how many stand where, and since when.

Per state, the count of nodes (every node the fleet model knows, and every node that moved);
per node out of service, since when (bounded by the nodes out of service, not the fleet); and
the moves made since the collector started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client.registry import Collector

from collector.export.catalog import catalog, families
from collector.model.lifecycle import State

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from prometheus_client import Metric

    from collector.model.lifecycle import Lifecycle

GROUP: Final = "Lifecycle"


class LifecycleCollector(Collector):
    """Yields the lifecycle's families at scrape time (dict copies are atomic under the GIL)."""

    def __init__(self, lifecycle: Lifecycle, nodes: Callable[[], Iterable[str]]) -> None:
        """Read ``lifecycle``; ``nodes`` names the fleet's nodes (each in service unless moved)."""
        self._lifecycle = lifecycle
        self._nodes = nodes

    def describe(self) -> list[Metric]:
        """Skip the registration-time collect (families are dynamic)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Render every family."""
        f = families(s.name for s in catalog() if s.group == GROUP)
        lifecycle = self._lifecycle
        for state, count in lifecycle.counts(self._nodes()).items():
            f["fleetwatch_nodes_lifecycle"].add_metric([state.value], count)
        for node, row in sorted(lifecycle.rows().items()):
            if row.state != State.IN_SERVICE:
                f["fleetwatch_node_lifecycle_since_timestamp_seconds"].add_metric(
                    [node, row.state], row.at_ms / 1000
                )
        for (left, entered), count in sorted(dict(lifecycle.moves).items()):
            f["fleetwatch_lifecycle_moves_total"].add_metric([left, entered], count)
        f["fleetwatch_lifecycle_journal_failures_total"].add_metric([], lifecycle.write_failures)
        yield from f.values()
