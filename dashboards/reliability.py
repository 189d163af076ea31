"""Reliability: how often the fleet fails, how, what fleetwatch did, what checkpoints it advises.

MTBF comes from the recording rules in ``deploy/prometheus/rules/fleetwatch-recording.yml``
(``fleet:fleetwatch_nodes:count``, ``fleet:fleetwatch_node_mtbf_seconds:1d``,
``category:fleetwatch_node_failures:increase1h``): node-time observed over failures counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import (
    FULL,
    HALF,
    THIRD,
    actions_annotation,
    bar_panel,
    finish,
    increase,
    instant,
    new_dashboard,
    q,
    stat_panel,
    state_panel,
    table_panel,
    thresholds,
    timeseries_panel,
    value_text,
)

if TYPE_CHECKING:
    from grafana_foundation_sdk.models import dashboard as dm

UID: Final = "fleetwatch-reliability"
FAILURES: Final = "fleetwatch_node_failures_total"
RANGE: Final = "[$__range]"
NODES: Final = "fleet:fleetwatch_nodes:count"
REPAIRS: Final = '{action=~"drain_node|reset_gpu|resume_node"}'
# Node-seconds observed over the dashboard's range: the average fleet size times its length.
# Failures over the range, the first of each node and category included.
FAILED: Final = increase(FAILURES, "$__range")
NODE_SECONDS: Final = f"avg_over_time({NODES}{RANGE}) * $__range_s"


def _failures(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Failures"))
    builder = builder.with_panel(
        bar_panel(
            "Failures by category",
            "Job-interrupting failures over the dashboard's range, by category (lost GPUs, "
            "PCIe, unreachable nodes, fatal Xids by their catalog class ...).",
            [instant(f"sort_desc(sum by (category) ({FAILED}))", "{{category}}")],
            width=THIRD,
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Failures by category over time",
            "Failures in the hour before each point, by category (recording rule).",
            [q("category:fleetwatch_node_failures:increase1h", "{{category}}")],
            stack=True,
            width=THIRD,
        )
    )
    return builder.with_panel(
        table_panel(
            "Nodes that failed most",
            "The ten nodes with the most failures over the dashboard's range.",
            [instant(f"topk(10, sum by (node) ({FAILED}))")],
            hide=("Time",),
            rename={"Value": "failures"},
            width=THIRD,
            no_value="no failure",
        )
    )


def _mtbf(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Mean time between failures"))
    failures = f"sum({FAILED})"
    builder = builder.with_panel(
        stat_panel(
            "Node MTBF over the range",
            "Node-time observed (average fleet size x the range) / failures in the range.",
            [instant(f"{NODE_SECONDS} / ({failures} > 0)")],
            unit="s",
            width=THIRD,
            steps=thresholds((None, "blue")),
            no_value="no failure in range",
        )
    )
    builder = builder.with_panel(
        stat_panel(
            "Failures per 1,000 node-days",
            "Failures in the range per 1,000 node-days observed (Llama 3's cluster saw 3.79).",
            [instant(f"{failures} / ({NODE_SECONDS} / 86400) * 1000")],
            width=THIRD,
            steps=thresholds((None, "green"), (3.79, "orange"), (10, "red")),
        )
    )
    builder = builder.with_panel(
        stat_panel(
            "Nodes observed",
            "Nodes the collector knows, on average over the range.",
            [instant(f"avg_over_time({NODES}{RANGE})")],
            width=THIRD,
            steps=thresholds((None, "blue")),
        )
    )
    return builder.with_panel(
        timeseries_panel(
            "Node MTBF over the last day",
            "Node-time over failures in the day before each point (recording rule). Until "
            "Prometheus holds a day of history it overstates MTBF.",
            [q("fleet:fleetwatch_node_mtbf_seconds:1d", "MTBF")],
            unit="s",
            width=FULL,
        )
    )


def _repairs(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Drains and resets"))
    builder = builder.with_panel(
        timeseries_panel(
            "Drains, resets and resumes",
            "Node drains, GPU resets and node resumes per rate interval, by outcome.",
            [
                q(
                    "sum by (action, outcome) "
                    f"({increase(f'fleetwatch_actions_total{REPAIRS}', '$__rate_interval')})",
                    "{{action}} {{outcome}}",
                )
            ],
            bars=True,
            stack=True,
        )
    )
    builder = builder.with_panel(
        bar_panel(
            "Drains, resets and resumes over the range",
            "How many of each, by outcome, over the dashboard's range.",
            [
                instant(
                    "sum by (action, outcome) "
                    f"({increase(f'fleetwatch_actions_total{REPAIRS}', '$__range')})",
                    "{{action}} {{outcome}}",
                )
            ],
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Drained nodes and the drain cap",
            "Nodes fleetwatch holds drained, drains waiting for room, and how many it may drain "
            "at once (a count or a share of the fleet).",
            [
                q("fleetwatch_drained_nodes", "drained"),
                q("fleetwatch_drains_waiting", "waiting"),
                q("fleetwatch_drain_cap", "cap"),
            ],
            width=THIRD,
        )
    )
    builder = builder.with_panel(
        state_panel(
            "Drain circuit breaker",
            "Open: drains failed or came too fast, and fleetwatch drains nothing until it closes.",
            [q("fleetwatch_drain_breaker_open", "breaker")],
            mappings=value_text({"0": ("closed", "green"), "1": ("open", "red")}),
            width=THIRD,
        )
    )
    return builder.with_panel(
        timeseries_panel(
            "Actions deferred",
            "Times per rate interval an action was held back to wait (cap, breaker, busy GPU).",
            [q("increase(fleetwatch_actions_deferred_total[$__rate_interval])", "deferred")],
            width=THIRD,
        )
    )


def _checkpoints(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Checkpoint advice"))
    builder = builder.with_panel(
        table_panel(
            "Checkpoint advice per job",
            "Each job's advised checkpoint interval (Young/Daly, from its nodes' failure rate), "
            "its checkpoint cost and the age of its last checkpoint.",
            [
                instant("fleetwatch_job_checkpoint_interval_recommended_seconds"),
                instant("fleetwatch_job_checkpoint_cost_seconds"),
                instant("fleetwatch_job_checkpoint_age_seconds"),
            ],
            hide=("Time", "__name__", "instance"),
            rename={
                "Value #A": "advised interval",
                "Value #B": "checkpoint cost",
                "Value #C": "last checkpoint age",
            },
            unit="s",
            width=HALF,
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Advised checkpoint interval",
            "Young/Daly interval per job (0: its checkpoint cost is not known yet).",
            [q("fleetwatch_job_checkpoint_interval_recommended_seconds", "{{training_job}}")],
            unit="s",
            width=HALF,
        )
    )
    return builder.with_panel(
        timeseries_panel(
            "ETTR per job",
            "Effective training time ratio: what failures and restarts cost each job.",
            [q("fleetwatch_job_ettr_ratio", "{{training_job}}")],
            unit="percentunit",
            width=FULL,
        )
    )


def build() -> dm.Dashboard:
    """The reliability dashboard."""
    builder = new_dashboard(
        "fleetwatch: reliability",
        UID,
        "Failures by category, MTBF, drains and resets, checkpoint advice.",
        tags=["reliability"],
        time_from="now-7d",
        refresh="5m",
    )
    builder = builder.annotation(actions_annotation("Drains and resets", REPAIRS))
    for section in (_failures, _mtbf, _repairs, _checkpoints):
        builder = section(builder)
    return finish(builder)


__all__ = ["UID", "build"]
