"""Reliability: how often the fleet fails, how, what fleetwatch did, what checkpoints it advises.

Also the nodes' lifecycle (how many stand where, who is out and for how long) and how they are
repaired: time to repair and between incidents (the collector's 30-day figures from its journal,
and the histograms over the range), GPU time lost, lemon nodes.

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
    ORANGE_FROM_ONE,
    RANGE,
    RATE,
    SCRAPE,
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


# Lifecycle states, in the order a reader scans them, with their colours.
LIFECYCLE_COLOURS: Final = (
    ("in_service", "green"),
    ("suspect", "yellow"),
    ("drained", "orange"),
    ("in_repair", "purple"),
    ("requalifying", "blue"),
    ("rma", "red"),
)


def _median(histogram: str) -> str:
    """The median of what ``histogram`` observed over the dashboard's range."""
    return f"histogram_quantile(0.5, sum by (le) (increase({histogram}_bucket[{RANGE}])))"


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
    Row("Lifecycle"),
    Timeseries(
        "Nodes by lifecycle state",
        "How many nodes stand in each lifecycle state: in service, suspect (an incident fires "
        "on it), drained, in repair, re-qualifying, RMA (docs/oncall.md, a node's lifecycle).",
        [("sum by (state) (fleetwatch_nodes_lifecycle)", "{{state}}")],
        stack=True,
        colours=LIFECYCLE_COLOURS,
    ),
    Table(
        "Nodes out of service",
        "Each node not in service now, where it stands and for how long (since it entered "
        "that state).",
        ["time() - fleetwatch_node_lifecycle_since_timestamp_seconds"],
        hide=SCRAPE,
        rename={"Value": "for"},
        unit="s",
        no_value="every node in service",
    ),
    Row("Repairs and lemon nodes"),
    Stat(
        "Mean time to repair (30 days)",
        "From a node leaving service (drained, in repair, RMA) to its return to service, over "
        "the repairs that ended in the last 30 days (from the journal).",
        ["fleetwatch_fleet_mean_time_to_repair_seconds"],
        unit="s",
        width=THIRD,
        steps=BLUE,
        no_value="no repair in 30 days",
    ),
    Stat(
        "Median time to repair over the range",
        "The histogram of the repairs that ended over the dashboard's range (buckets from 15 "
        "minutes to 30 days: a short repair reads as up to 15 minutes).",
        [f"{_median('fleetwatch_node_repair_seconds')} > 0"],
        unit="s",
        width=THIRD,
        steps=BLUE,
        no_value="no repair in range",
    ),
    Stat(
        "GPU time lost (30 days)",
        "The fleet's GPUs times their time out of service (drained, in repair, re-qualifying, "
        "RMA) over its GPUs times 30 days.",
        ["fleetwatch_fleet_gpu_time_lost_ratio"],
        unit="percentunit",
        width=THIRD,
        steps=thresholds((None, "green"), (0.02, "orange"), (0.05, "red")),
    ),
    Stat(
        "Mean time between incidents (30 days)",
        "Between two incident episodes of one node (in service to suspect or drained), over "
        "every node, in the last 30 days (from the journal).",
        ["fleetwatch_fleet_mean_time_between_incidents_seconds"],
        unit="s",
        width=THIRD,
        steps=BLUE,
        no_value="no node had two",
    ),
    Stat(
        "Median time between incidents over the range",
        "The histogram of the incident episodes that began over the dashboard's range.",
        [f"{_median('fleetwatch_node_time_between_incidents_seconds')} > 0"],
        unit="s",
        width=THIRD,
        steps=BLUE,
        no_value="no node had two in range",
    ),
    Stat(
        "Lemon nodes",
        "Nodes a lemon rule fires on now: 5 remediations or 5 incident episodes in 7 days, no "
        "person has looked since (lemon_node drains them).",
        ["fleetwatch_fleet_lemon_nodes"],
        width=THIRD,
        steps=ORANGE_FROM_ONE,
    ),
    Timeseries(
        "Repairs ended and incident episodes begun",
        "Per rate interval, from the histograms' counts.",
        [
            (f"sum(increase(fleetwatch_node_repair_seconds_count{RATE}))", "repairs ended"),
            (
                f"sum(increase(fleetwatch_node_time_between_incidents_seconds_count{RATE}))",
                "episodes begun (a node's second or later)",
            ),
        ],
        bars=True,
    ),
    Timeseries(
        "GPU time lost over the last 30 days",
        "The fleet's share of GPU time lost in the 30 days before each point.",
        [("fleetwatch_fleet_gpu_time_lost_ratio", "GPU time lost")],
        unit="percentunit",
    ),
    Table(
        "Which nodes are lemons",
        "The nodes a lemon rule fires on now (lemon_node drains them until a person releases "
        "them); fleetwatch reliability NODE says why.",
        ["fleetwatch_node_lemon"],
        hide=(*SCRAPE, "Value"),
        no_value="no lemon",
    ),
    Table(
        "Most remediated nodes (7 days)",
        "The twenty nodes with the most remediations (drains, GPU resets, reboots, RMA "
        "tickets) that succeeded in the last 7 days.",
        ["topk(20, fleetwatch_node_remediations)"],
        hide=SCRAPE,
        rename={"Value": "remediations"},
        no_value="no remediation in 7 days",
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
        "Failures by category, MTBF, drains and resets, the nodes' lifecycle, time to repair "
        "and between incidents, GPU time lost, lemon nodes, checkpoint advice.",
        PANELS,
        tags=["reliability"],
        time_from="now-7d",
        refresh="5m",
        annotations=[actions_annotation("Drains and resets", REPAIRS)],
    )


__all__ = ["UID", "build"]
