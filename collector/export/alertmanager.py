"""Prometheus metrics of the Alertmanager forwarder: what it keeps there, what got through.

Per configured Alertmanager (its URL, as ``urls`` gives it): alerts taken, failed requests and
the last request taken; and the alerts kept there now, firing and resolved. Without
``[collector.alertmanager]`` the families have no samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client.registry import Collector

from collector.export.catalog import catalog, families

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client import Metric

    from collector.actions.alertmanager import AlertForwarder

GROUP: Final = "Alertmanager"


class AlertmanagerCollector(Collector):
    """Yields the forwarder's families at scrape time (dict copies are atomic under the GIL)."""

    def __init__(self, forwarder: AlertForwarder) -> None:
        """Read from ``forwarder``."""
        self._forwarder = forwarder

    def describe(self) -> list[Metric]:
        """Skip the registration-time collect (families are dynamic)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Render every family."""
        f = families(s.name for s in catalog() if s.group == GROUP)
        forwarder = self._forwarder
        urls = [e.url for e in forwarder.endpoints]
        if urls:
            firing, resolved = forwarder.held()
            f["fleetwatch_alertmanager_alerts"].add_metric(["firing"], firing)
            f["fleetwatch_alertmanager_alerts"].add_metric(["resolved"], resolved)
        sent, failures = dict(forwarder.sent), dict(forwarder.failures)
        last = dict(forwarder.last_success)
        for url in urls:
            f["fleetwatch_alertmanager_alerts_sent_total"].add_metric([url], sent.get(url, 0))
            f["fleetwatch_alertmanager_send_failures_total"].add_metric([url], failures.get(url, 0))
            f["fleetwatch_alertmanager_last_success_timestamp_seconds"].add_metric(
                [url], last.get(url, 0.0)
            )
        yield from f.values()
