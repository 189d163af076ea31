"""Job health: one training job (the ``job`` variable), its throughput, ranks and checkpoints.

For the ML engineer who asks why the job slowed down: throughput and efficiency, each rank's step
and compute time (a straggler stands out), which GPUs straggle and what that costs, and the
incidents on the job and on the nodes it runs on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import (
    FULL,
    HALF,
    actions_annotation,
    finish,
    heatmap_panel,
    incidents_annotation,
    instant,
    new_dashboard,
    q,
    query_variable,
    stat_panel,
    table_panel,
    thresholds,
    timeseries_panel,
)

if TYPE_CHECKING:
    from grafana_foundation_sdk.models import dashboard as dm

UID: Final = "fleetwatch-job-health"
J: Final = '{training_job="$job"}'
RANK: Final = "rank {{rank}} ({{node}} GPU {{gpu}})"
# The job's headline figures: (title, description, metric suffix, unit).
HEADLINE: Final = (
    ("Tokens/s", "Tokens per second over the recent steps.", "tokens_per_second", "short"),
    ("Tokens/s per GPU", "Tokens per second per GPU.", "tokens_per_second_per_gpu", "short"),
    (
        "MFU",
        "Model FLOPs utilisation (0 when the model size is unknown).",
        "mfu_ratio",
        "percentunit",
    ),
    (
        "ETTR",
        "Effective training time ratio: time of steps that moved the job forward / wall time.",
        "ettr_ratio",
        "percentunit",
    ),
    ("GPUs", "GPUs (ranks) of the job.", "gpus", "short"),
    ("Step", "Highest step finished.", "step", "short"),
)


def _throughput(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Throughput and efficiency"))
    for title, description, suffix, unit in HEADLINE:
        builder = builder.with_panel(
            stat_panel(
                title,
                description,
                [instant(f"fleetwatch_job_{suffix}{J}")],
                unit=unit,
                width=4,
                steps=thresholds((None, "blue")),
            )
        )
    builder = builder.with_panel(
        timeseries_panel(
            "Tokens per second",
            "Throughput over the recent steps, and goodput: tokens of steps that moved the job "
            "forward per second of wall time (restarts, gaps and checkpoint stalls cost it).",
            [
                q(f"fleetwatch_job_tokens_per_second{J}", "tokens/s"),
                q(f"fleetwatch_job_goodput_tokens_per_second{J}", "goodput"),
            ],
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Tokens per second per GPU",
            "Throughput divided by the job's GPUs.",
            [q(f"fleetwatch_job_tokens_per_second_per_gpu{J}", "tokens/s per GPU")],
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "MFU and ETTR",
            "Model FLOPs utilisation and effective training time ratio.",
            [q(f"fleetwatch_job_mfu_ratio{J}", "MFU"), q(f"fleetwatch_job_ettr_ratio{J}", "ETTR")],
            unit="percentunit",
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Step time",
            "Median step time over the recent steps.",
            [q(f"fleetwatch_job_step_time_seconds{J}", "step time")],
            unit="s",
        )
    )
    return builder.with_panel(
        timeseries_panel(
            "Throughput drop",
            "Share of throughput lost in a detected drop (0: no drop). The incident names the "
            "suspect nodes, or says it is the fabric or no hardware at all.",
            [q(f"fleetwatch_job_throughput_drop_ratio{J}", "drop")],
            unit="percentunit",
            width=FULL,
        )
    )


def _ranks(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Ranks and stragglers"))
    builder = builder.with_panel(
        timeseries_panel(
            "Step time per rank",
            "Each rank's latest step time: in a synchronous job they wait for the slowest.",
            [q(f"fleetwatch_job_rank_step_time_seconds{J}", RANK)],
            unit="s",
            width=FULL,
        )
    )
    builder = builder.with_panel(
        heatmap_panel(
            "Compute time per rank",
            "Each rank's compute time (its step without the wait): a straggler is a hot row.",
            q(f"fleetwatch_job_rank_compute_seconds{J}", "{{node}} GPU {{gpu}} rank {{rank}}"),
            unit="s",
            width=FULL,
        ).height(12)
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Stragglers and the GPUs they cost",
            "Ranks computing slower than the job's median by the margin, and the GPUs the job "
            "loses waiting for its slowest straggler (GPU-hours per hour).",
            [
                q(f"fleetwatch_job_stragglers{J}", "stragglers"),
                q(f"fleetwatch_job_straggler_lost_gpus{J}", "GPUs lost to stragglers"),
            ],
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Straggler slowdown",
            "How much slower each straggling rank computes than the job's median.",
            [q(f"fleetwatch_job_rank_slowdown_ratio{J}", RANK)],
            unit="percentunit",
        )
    )
    return builder.with_panel(
        table_panel(
            "Straggling ranks",
            "The ranks straggling now: node, GPU and slowdown.",
            [instant(f"sort_desc(fleetwatch_job_rank_slowdown_ratio{J})")],
            hide=("Time", "__name__", "job", "instance"),
            rename={"Value": "slowdown"},
            unit="percentunit",
            width=FULL,
            no_value="no straggler",
        )
    )


def _checkpoints(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Checkpoints"))
    builder = builder.with_panel(
        timeseries_panel(
            "Checkpoint age and advised interval",
            "Time since the last checkpoint ended, against the Young/Daly interval advised from "
            "the failure rate of the job's nodes (0: the checkpoint cost is not known yet).",
            [
                q(f"fleetwatch_job_checkpoint_age_seconds{J}", "age"),
                q(f"fleetwatch_job_checkpoint_interval_recommended_seconds{J}", "advised interval"),
            ],
            unit="s",
        )
    )
    return builder.with_panel(
        timeseries_panel(
            "Checkpoint cost",
            "Median time a checkpoint takes.",
            [q(f"fleetwatch_job_checkpoint_cost_seconds{J}", "cost")],
            unit="s",
            width=HALF,
        )
    )


def build() -> dm.Dashboard:
    """The job health dashboard."""
    builder = new_dashboard(
        "fleetwatch: job health",
        UID,
        "One training job: throughput, MFU, ETTR, ranks and stragglers, checkpoints.",
        tags=["jobs"],
        time_from="now-3h",
    )
    builder = builder.with_variable(
        query_variable("job", "Job", "label_values(fleetwatch_job_step, training_job)")
    )
    on_nodes = f" and on (node) fleetwatch_job_rank_step_time_seconds{J}"
    builder = (
        builder.annotation(incidents_annotation("Job incidents", J))
        .annotation(incidents_annotation("Incidents on the job's nodes", where=on_nodes))
        .annotation(actions_annotation("Actions on the job's nodes", where=on_nodes))
    )
    for section in (_throughput, _ranks, _checkpoints):
        builder = section(builder)
    return finish(builder)


__all__ = ["UID", "build"]
