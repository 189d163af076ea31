"""Incidents as Alertmanager alerts: the label set that names one, the annotations that tell it.

Alertmanager tells alerts apart by their labels alone, so an incident's labels are what stays the
same while it fires and differs between any two incidents open at once: the rule
(``alertname``) and the target (``target`` as the collector keys it, with its parts as labels of
their own: ``node``, ``gpu``, ``nvlink``, ``ib_device``, ``ib_port``, ``training_job``), with
the rule's ``severity`` and ``scope``. A new incident of the same rule on the same target is the
same alert again, as a Prometheus alert that fires again is. The incident's id changes at every
firing, so it is an annotation (``fleetwatch_incident``), never a label: as a label it would
split a flapping fault into many alerts and defeat Alertmanager's grouping.

Below fleetwatch's own labels come the rule's ``labels`` (those whose names are valid label
names and not one of :data:`RESERVED_LABELS`), then the configured static ones, lowest; a name
set twice keeps the higher one. Empty values are left out, as Alertmanager drops them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

from collector.actions.tally import metric_node
from rules.model import Scope

if TYPE_CHECKING:
    from collections.abc import Mapping

    from collector.store.incidents import IncidentRow
    from rules.model import Rule

__all__ = [
    "LABEL_NAME",
    "RESERVED_LABELS",
    "Alert",
    "alert_for",
    "alert_labels",
    "rfc3339",
    "rule_labels",
    "target_labels",
    "valid_label",
]

# A label name Alertmanager takes (Prometheus' classic names); ``__`` starts reserved ones.
LABEL_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The labels fleetwatch sets itself: the rule's and static labels may not change them.
RESERVED_LABELS: Final = frozenset(
    {
        "alertname",
        "severity",
        "scope",
        "node",
        "target",
        "gpu",
        "nvlink",
        "ib_device",
        "ib_port",
        "training_job",
    }
)
# The shape of a target key after its node, by scope (collector.model.target_keys): a word as
# it is, or ``=label``: a part that is that label's value.
_SHAPES: Final[dict[Scope, tuple[str, ...]]] = {
    Scope.GPU: ("gpu", "=gpu"),
    Scope.NVLINK: ("gpu", "=gpu", "nvlink", "=nvlink"),
    Scope.IB_PORT: ("ib", "=ib_device", "=ib_port"),
}
_JOB_PREFIX: Final = "job/"


def rfc3339(unix_ms: int) -> str:
    """``2026-01-01T00:00:00.000Z``: Unix milliseconds as Alertmanager's API writes times."""
    moment = datetime.fromtimestamp(unix_ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{unix_ms % 1000:03d}Z"


def valid_label(name: str) -> bool:
    """Whether ``name`` is a label name Alertmanager accepts and none reserved to it."""
    return LABEL_NAME.fullmatch(name) is not None and not name.startswith("__")


def target_labels(scope: Scope, node: str, target: str) -> dict[str, str]:
    """The target's parts as labels: ``{"target": "n1/gpu/3", "node": "n1", "gpu": "3"}``.

    ``node`` is the incident's (``job/<id>`` for a job's incident, ``fleet`` for the fleet's:
    neither is a node, so neither gets a ``node`` label). A key not of its scope's shape gives
    no parts: the ``target`` label still names it.
    """
    labels = {"target": target}
    if scope == Scope.JOB:
        labels["training_job"] = target.removeprefix(_JOB_PREFIX)
        return {k: v for k, v in labels.items() if v}
    labels["node"] = metric_node(node)
    shape = _SHAPES.get(scope, ())
    prefix = f"{node}/"
    rest = target.removeprefix(prefix).split("/") if target.startswith(prefix) else []
    parts: dict[str, str] = {}
    if shape and len(rest) == len(shape):
        for word, part in zip(shape, rest, strict=True):
            if word.startswith("="):
                parts[word[1:]] = part
            elif word != part:
                parts = {}
                break
    labels.update(parts)
    return {k: v for k, v in labels.items() if v}


def rule_labels(rule: Rule) -> tuple[dict[str, str], list[str]]:
    """The rule's labels an alert may carry, and the names it may not (invalid, reserved)."""
    kept: dict[str, str] = {}
    refused: list[str] = []
    for name, value in rule.labels.items():
        if not valid_label(name) or name in RESERVED_LABELS:
            refused.append(name)
        elif value:
            kept[name] = value
    return kept, refused


def alert_labels(row: IncidentRow, rule: Rule, static: Mapping[str, str]) -> dict[str, str]:
    """The label set of ``row``'s alert: static labels, the rule's, then fleetwatch's own."""
    labels = {k: v for k, v in static.items() if v}
    labels.update(rule_labels(rule)[0])
    labels.update(target_labels(rule.scope, row.node, row.target))
    labels.update(alertname=rule.name, severity=rule.severity.value, scope=rule.scope.value)
    return labels


@dataclass(frozen=True, slots=True)
class Alert:
    """One incident's alert, less its end: that is the send's (firing) or the incident's."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_ms: int
    generator_url: str = ""

    @property
    def fingerprint(self) -> tuple[tuple[str, str], ...]:
        """What Alertmanager knows the alert by: its labels."""
        return tuple(sorted(self.labels.items()))

    def body(self, ends_ms: int) -> dict[str, Any]:
        """The alert as ``POST /api/v2/alerts`` takes it, ending at ``ends_ms``.

        A firing alert ends a while after the send (so Alertmanager resolves it by itself if
        no more sends come); a resolved one at the incident's resolution.
        """
        body: dict[str, Any] = {
            "labels": self.labels,
            "annotations": self.annotations,
            "startsAt": rfc3339(self.starts_ms),
            "endsAt": rfc3339(max(ends_ms, self.starts_ms)),
        }
        if self.generator_url:
            body["generatorURL"] = self.generator_url
        return body


def alert_for(
    row: IncidentRow, rule: Rule, static: Mapping[str, str], external_url: str = ""
) -> Alert:
    """The alert of a firing (or resolved) incident.

    ``external_url``: where people reach the collector's API ("": no ``generatorURL``); the
    link lists the incidents of the rule on the node, this one among them.
    """
    told = {
        "summary": f"{rule.name} on {row.target}",
        "description": rule.description,
        "evidence": row.evidence,
        "runbook_url": rule.runbook,
        "fleetwatch_incident": row.id,
        "escalated": "true" if row.escalated else "",
    }
    annotations = {name: value for name, value in told.items() if value}
    link = ""
    if external_url:
        query = urlencode({"rule": row.rule, "node": row.node})
        link = f"{external_url.rstrip('/')}/api/v1/incidents?{query}"
    return Alert(
        labels=alert_labels(row, rule, static),
        annotations=annotations,
        starts_ms=row.fired_ms if row.fired_ms is not None else row.started_ms,
        generator_url=link,
    )
