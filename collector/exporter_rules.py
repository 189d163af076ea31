"""Prometheus metrics of the rules and actions: what fires, what waits, what fails to evaluate."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client import Metric

    from collector.actions.dispatcher import Dispatcher
    from collector.incidents import Evaluator


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
        yield CounterMetricFamily(
            "fleetwatch_rule_evaluations", "Rule conditions evaluated.", value=ev.evaluations
        )
        errors = CounterMetricFamily(
            "fleetwatch_rule_evaluation_errors",
            "Evaluations of a rule's condition that failed (the rule cannot fire while they do).",
            labels=["rule"],
        )
        for rule in ev.rules.rules:
            errors.add_metric([rule.name], ev.errors.get(rule.name, 0))
        yield errors
        open_now = GaugeMetricFamily(
            "fleetwatch_incidents_open",
            "Incidents pending or firing, by rule, severity and phase.",
            labels=["rule", "severity", "phase"],
        )
        counts = Counter(
            (i.rule, ev.engine.rules[i.rule].severity.value, i.phase.value)
            for i in ev.engine.open_incidents()
        )
        for labels, count in sorted(counts.items()):
            open_now.add_metric(list(labels), count)
        yield open_now
        status = self._dispatcher.status()
        for name, doc in (
            ("drained_nodes", "Nodes fleetwatch has drained and not resumed."),
            ("drains_waiting", "Drains held back by the drain cap or the circuit breaker."),
            ("drain_cap", "How many nodes fleetwatch may drain at once now."),
            ("drain_breaker_open", "1 while the drain circuit breaker is open."),
        ):
            yield GaugeMetricFamily(f"fleetwatch_{name}", doc, value=float(status[name]))
        yield CounterMetricFamily(
            "fleetwatch_actions_deferred",
            "Times an action was held back to wait (drain cap, breaker, a busy GPU).",
            value=self._dispatcher.deferred,
        )
