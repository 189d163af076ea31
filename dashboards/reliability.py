"""Reliability: how often the fleet fails, how, what fleetwatch did, what checkpoints it advises.

MTBF comes from the recording rules in ``deploy/prometheus/rules/fleetwatch-recording.yml``
(``fleet:fleetwatch_nodes:count``, ``fleet:fleetwatch_node_mtbf_seconds:1d``,
``category:fleetwatch_node_failures:increase1h``): node-time observed over failures counted.
A new panel goes into its place in ``PANELS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from dashboards.common import (
    BLUE,
    FULL,
    OPEN_CLOSED,
    RANGE,
    RATE,
    THIRD,
    WINDOW,
    actions_annotation,
    increase,
    new_dashboard,
    thresholds,
)
from dashboards.panels import Bars, Row, Stat, State, Table, Timeseries

if TYPE_CHECKING:
    from grafana_foundation_sdk.models import dashboard as dm

UID: Final = "fleetwatch-reliability"
NODES: Final = "fleet:fleetwatch_nodes:count"
REPAIRS: Final = '{action=~"drain_node|reset_gpu|resume_node"}'
# Failures over the range, the first of each node and category included.
FAILED: Final = increase("fleetwatch_node_failures_total", RANGE)
# Node-seconds observed over the dashboard's range: the average fleet size times its length.
NODE_SECONDS: Final = f"avg_over_time({NODES}[{RANGE}]) * $__range_s"


def _repairs(window: str) -> str:
    """Drains, GPU resets and node resumes over ``window``, by action and outcome."""
    return f"sum by (action, outcome) ({increase(f'fleetwatch_actions_total{REPAIRS}', window)})"


PANELS: Final = (
    Row("Failures"),
    Bars(
        "Failures by category",
        "Job-interrupting failures over the dashboard's range, by category (lost GPUs, "
        "PCIe, unreachable nodes, fatal Xids by their catalog class ...).",
        [(f"sort_desc(sum by (category) ({FAILED}))", "{{category}}")],
        width=THIRD,
    ),
    Timeseries(
        "Failures by category over time",
        "Failures in the hour before each point, by category (recording rule).",
        [("category:fleetwatch_node_failures:increase1h", "{{category}}")],
        stack=True,
        width=THIRD,
    ),
    Table(
        "Nodes that failed most",
        "The ten nodes with the most failures over the dashboard's range.",
        [f"topk(10, sum by (node) ({FAILED}))"],
        hide=("Time",),
        rename={"Value": "failures"},
        width=THIRD,
        no_value="no failure",
    ),
    Row("Mean time between failures"),
    Stat(
        "Node MTBF over the range",
        "Node-time observed (average fleet size x the range) / failures in the range.",
        [f"{NODE_SECONDS} / (sum({FAILED}) > 0)"],
        unit="s",
        width=THIRD,
        steps=BLUE,
        no_value="no failure in range",
    ),
    Stat(
        "Failures per 1,000 node-days",
        "Failures in the range per 1,000 node-days observed (Llama 3's cluster saw 3.79).",
        [f"sum({FAILED}) / ({NODE_SECONDS} / 86400) * 1000"],
        width=THIRD,
        steps=thresholds((None, "green"), (3.79, "orange"), (10, "red")),
    ),
    Stat(
        "Nodes observed",
        "Nodes the collector knows, on average over the range.",
        [f"avg_over_time({NODES}[{RANGE}])"],
        width=THIRD,
        steps=BLUE,
    ),
    Timeseries(
        "Node MTBF over the last day",
        "Node-time over failures in the day before each point (recording rule). Until "
        "Prometheus holds a day of history it overstates MTBF.",
        [("fleet:fleetwatch_node_mtbf_seconds:1d", "MTBF")],
        unit="s",
        width=FULL,
    ),
    Row("Drains and resets"),
    Timeseries(
        "Drains, resets and resumes",
        "Node drains, GPU resets and node resumes per rate interval, by outcome.",
        [(_repairs(WINDOW), "{{action}} {{outcome}}")],
        bars=True,
        stack=True,
    ),
    Bars(
        "Drains, resets and resumes over the range",
        "How many of each, by outcome, over the dashboard's range.",
        [(_repairs(RANGE), "{{action}} {{outcome}}")],
    ),
    Timeseries(
        "Drained nodes and the drain cap",
        "Nodes fleetwatch holds drained, drains waiting for room, and how many it may drain "
        "at once (a count or a share of the fleet).",
        [
            ("fleetwatch_drained_nodes", "drained"),
            ("fleetwatch_drains_waiting", "waiting"),
            ("fleetwatch_drain_cap", "cap"),
        ],
        width=THIRD,
    ),
    State(
        "Drain circuit breaker",
        "Open: drains failed or came too fast, and fleetwatch drains nothing until it closes.",
        [("fleetwatch_drain_breaker_open", "breaker")],
        mappings=OPEN_CLOSED,
        width=THIRD,
    ),
    Timeseries(
        "Actions deferred",
        "Times per rate interval an action was held back to wait (cap, breaker, busy GPU).",
        [(f"increase(fleetwatch_actions_deferred_total{RATE})", "deferred")],
        width=THIRD,
    ),
    Row("Checkpoint advice"),
    Table(
        "Checkpoint advice per job",
        "Each job's advised checkpoint interval (Young/Daly, from its nodes' failure rate), "
        "its checkpoint cost and the age of its last checkpoint.",
        [
            "fleetwatch_job_checkpoint_interval_recommended_seconds",
            "fleetwatch_job_checkpoint_cost_seconds",
            "fleetwatch_job_checkpoint_age_seconds",
        ],
        hide=("Time", "__name__", "instance"),
        rename={
            "Value #A": "advised interval",
            "Value #B": "checkpoint cost",
            "Value #C": "last checkpoint age",
        },
        unit="s",
    ),
    Timeseries(
        "Advised checkpoint interval",
        "Young/Daly interval per job (0: its checkpoint cost is not known yet).",
        [("fleetwatch_job_checkpoint_interval_recommended_seconds", "{{training_job}}")],
        unit="s",
    ),
    Timeseries(
        "ETTR per job",
        "Effective training time ratio: what failures and restarts cost each job.",
        [("fleetwatch_job_ettr_ratio", "{{training_job}}")],
        unit="percentunit",
        width=FULL,
    ),
)


def build() -> dm.Dashboard:
    """The reliability dashboard."""
    return new_dashboard(
        "fleetwatch: reliability",
        UID,
        "Failures by category, MTBF, drains and resets, checkpoint advice.",
        PANELS,
        tags=["reliability"],
        time_from="now-7d",
        refresh="5m",
        annotations=[actions_annotation("Drains and resets", REPAIRS)],
    )


__all__ = ["UID", "build"]
