"""The PromQL of the generated dashboards, and the metric names an expression reads.

Tests use it to check that every query parses and returns data in a real Prometheus, and that
every metric a dashboard or a Prometheus rule reads is one the collector exports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

# Words of PromQL that look like metric names but are not.
KEYWORDS: Final = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "inf",
        "nan",
    }
)
_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS: Final = re.compile(r"\{[^}]*\}")
_RANGE: Final = re.compile(r"\[[^\]]*\]")
_GROUPING: Final = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLE: Final = re.compile(r"\$\{?\w+\}?")
_IDENTIFIER: Final = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")
_LABEL_VALUES: Final = re.compile(r"^\s*label_values\(\s*(?:(.+?)\s*,\s*)?(\w+)\s*\)\s*$")


@dataclass(frozen=True, slots=True)
class Query:
    """One query of a dashboard: a panel's target, an annotation or a template variable."""

    dashboard: str  # the dashboard's uid
    where: str  # 'panel "Title"', 'annotation "Name"', 'variable "name"'
    expr: str
    instant: bool = False  # an instant query (tables, stats); otherwise a range query
    variable: bool = False  # a template variable's query (label_values(...))


def metric_names(expr: str) -> set[str]:
    """The metric (and recording-rule) names a PromQL expression reads.

    A small tokenizer, not a parser: strings, label matchers, ranges and grouping clauses are
    removed, and what is left that looks like an identifier, is no keyword and is not followed
    by ``(`` (a function) is a metric name. ``label_values(metric, label)`` reads ``metric``.
    """
    values = _LABEL_VALUES.match(expr)
    if values:
        return metric_names(values.group(1)) if values.group(1) else set()
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    return {
        match.group(1)
        for match in _IDENTIFIER.finditer(text)
        if match.group(2) is None and match.group(1).lower() not in KEYWORDS
    }


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for panel in panels:
        found.append(panel)
        found.extend(_panels(panel.get("panels", [])))
    return found


def dashboard_queries(dashboard: dict[str, Any]) -> list[Query]:
    """Every query of a dashboard's JSON: panel targets, annotations, template variables."""
    uid = str(dashboard["uid"])
    found = [
        Query(
            uid,
            f"panel {panel.get('title', '')!r}",
            target["expr"],
            instant=bool(target.get("instant")) and not target.get("range"),
        )
        for panel in _panels(dashboard.get("panels", []))
        for target in panel.get("targets", [])
        if target.get("expr")
    ]
    found.extend(
        Query(uid, f"annotation {annotation['name']!r}", annotation["expr"])
        for annotation in dashboard.get("annotations", {}).get("list", [])
        if annotation.get("expr")
    )
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            expr = query["query"] if isinstance(query, dict) else query
            found.append(Query(uid, f"variable {variable['name']!r}", expr, variable=True))
    return found
