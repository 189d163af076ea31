"""Prometheus metrics of the rules and actions: what fires, what waits, what fails to evaluate."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from prometheus_client.registry import Collector

from collector.actions.tally import metric_node
from collector.export.catalog import catalog, families
from rules.engine import Phase

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client import Metric

    from collector.actions.dispatcher import Dispatcher
    from collector.incidents.evaluator import Evaluator

_NAMES = (
    *(s.name for s in catalog() if s.group == "Rules, incidents and actions"),
    "fleetwatch_node_failures_total",
)


class RulesCollector(Collector):
    """Yields rule and action metrics from the evaluator and the dispatcher at scrape time."""

    def __init__(self, evaluator: Evaluator, dispatcher: Dispatcher) -> None:
        """Read from both; register with a registry you own."""
        self._evaluator = evaluator
        self._dispatcher = dispatcher

    def describe(self) -> list[Metric]:
        """Skip the registration-time collect (families are dynamic)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Render every family."""
        ev = self._evaluator
        f = families(_NAMES)
        f["fleetwatch_rule_evaluations_total"].add_metric([], ev.evaluations)
        for rule in ev.rules.rules:
            f["fleetwatch_rule_evaluation_errors_total"].add_metric(
                [rule.name], ev.errors.get(rule.name, 0)
            )
        incidents = ev.engine.open_incidents()
        counts = Counter(
            (i.rule, ev.engine.rules[i.rule].severity.value, i.phase.value) for i in incidents
        )
        for labels, count in sorted(counts.items()):
            f["fleetwatch_incidents_open"].add_metric(list(labels), count)
        for i in sorted(incidents, key=lambda i: (i.rule, i.target)):
            if i.phase != Phase.FIRING:
                continue
            rule = ev.engine.rules[i.rule]
            job = i.node.removeprefix("job/") if i.node.startswith("job/") else ""
            f["fleetwatch_incident_firing"].add_metric(
                [i.rule, rule.severity.value, rule.scope.value, i.target, metric_node(i.node), job],
                1,
            )
        for (node, category), count in sorted(dict(ev.failures).items()):
            f["fleetwatch_node_failures_total"].add_metric([node, category], count)
        dispatcher = self._dispatcher
        for (action, outcome, node), count, last in dispatcher.tally.snapshot():
            f["fleetwatch_actions_total"].add_metric([action, outcome, node], count)
            f["fleetwatch_action_last_timestamp_seconds"].add_metric([action, outcome, node], last)
        status = dispatcher.status()
        for name in ("drained_nodes", "drains_waiting", "drain_cap", "drain_breaker_open"):
            f[f"fleetwatch_{name}"].add_metric([], float(status[name]))
        f["fleetwatch_actions_deferred_total"].add_metric([], dispatcher.deferred)
        f["fleetwatch_waiting_drains_dropped_total"].add_metric([], dispatcher.dropped_cleared)
        for rule in ev.rules.rules:
            if rule.escalation is not None and rule.escalation.occurrences:
                f["fleetwatch_incident_recurrences_total"].add_metric(
                    [rule.name], ev.engine.recurrences.get(rule.name, 0)
                )
        yield from f.values()
