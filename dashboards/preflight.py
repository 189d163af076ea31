"""Pre-flight: the latest qualification of the fleet, node by node, and the runs over time.

The series are the collector's ``fleetwatch_preflight_*`` (``collector/export/preflight.py``):
each node's verdict in the newest run that qualified it (0 pass, 1 warn, 2 fail, 3 could not
run) and when that run finished, the runs by verdict, and results refused from agents. What each
check measured, its gate and what was blamed are in ``fleetwatch preflight show`` and
``/api/v1/preflight``: per-check detail is not a Prometheus series.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from dashboards.common import (
    BLUE,
    HALF,
    ORANGE_FROM_ONE,
    RATE,
    THIRD,
    actions_annotation,
    new_dashboard,
    value_text,
)
from dashboards.panels import Row, Stat, State, Table, Timeseries

if TYPE_CHECKING:
    from grafana_foundation_sdk.models import dashboard as dm

UID: Final = "fleetwatch-preflight"
VERDICTS: Final = value_text(
    {
        "0": ("pass", "green"),
        "1": ("warn", "orange"),
        "2": ("fail", "red"),
        "3": ("could not run", "purple"),
    }
)
NODE: Final = "fleetwatch_preflight_node_verdict"

PANELS: Final = (
    Row("Latest qualification"),
    Stat(
        "Newest run",
        "The verdict of the newest finished pre-flight run.",
        ["fleetwatch_preflight_latest_verdict"],
        mappings=VERDICTS,
    ),
    Stat(
        "Since the newest run",
        "How long ago the newest run finished.",
        ["time() - fleetwatch_preflight_latest_timestamp_seconds"],
        unit="s",
        steps=BLUE,
        no_value="no run yet",
    ),
    Stat(
        "Nodes held back",
        "Nodes whose newest qualification failed or could not run.",
        [f"count({NODE} >= 2) or vector(0)"],
        steps=ORANGE_FROM_ONE,
    ),
    Stat(
        "Runs in progress",
        "Pre-flight runs the collector is carrying out now.",
        ["fleetwatch_preflight_runs_running"],
        steps=BLUE,
    ),
    Table(
        "Nodes by their newest qualification",
        "Each node's verdict in the newest run that qualified it, worst first, and when.",
        [f"sort_desc({NODE})", "fleetwatch_preflight_node_checked_timestamp_seconds * 1000"],
        hide=("Time", "__name__", "instance", "job"),
        rename={"Value #A": "verdict", "Value #B": "checked"},
        width=HALF,
        no_value="no node qualified yet",
    ),
    State(
        "Qualification over time",
        "Each node's newest verdict as it changed.",
        [(NODE, "{{node}}")],
        mappings=VERDICTS,
        width=HALF,
    ),
    Row("Runs"),
    Timeseries(
        "Runs by verdict",
        "Pre-flight runs finished per rate interval, by verdict.",
        [(f"sum by (verdict) (increase(fleetwatch_preflight_runs_total{RATE}))", "{{verdict}}")],
        bars=True,
        stack=True,
        width=THIRD,
    ),
    Timeseries(
        "Nodes by verdict",
        "How many nodes stand at each verdict of their newest qualification.",
        [
            (f"count({NODE} == 0) or vector(0)", "pass"),
            (f"count({NODE} == 1) or vector(0)", "warn"),
            (f"count({NODE} == 2) or vector(0)", "fail"),
            (f"count({NODE} == 3) or vector(0)", "could not run"),
        ],
        stack=True,
        width=THIRD,
    ),
    Timeseries(
        "Results refused",
        "Pre-flight results (or measurements in them) refused from agents per rate interval, "
        "by reason: a NaN, an unknown check, a result for a task never sent ...",
        [
            (
                f"sum by (reason) (increase(fleetwatch_preflight_results_refused_total{RATE}))",
                "{{reason}}",
            )
        ],
        width=THIRD,
    ),
)


def build() -> dm.Dashboard:
    """The pre-flight dashboard."""
    return new_dashboard(
        "fleetwatch: pre-flight",
        UID,
        "The latest qualification of each node (pass, warn, fail, could not run) and the runs.",
        PANELS,
        tags=["preflight"],
        time_from="now-7d",
        refresh="1m",
        annotations=[actions_annotation("Drains", '{action="drain_node"}')],
    )


__all__ = ["UID", "build"]
