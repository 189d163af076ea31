"""Job health: one training job (the ``job`` variable), its throughput, ranks and checkpoints.

For the ML engineer who asks why the job slowed down: throughput and efficiency, each rank's step
and compute time (a straggler stands out), which GPUs straggle and what that costs, and the
incidents on the job and on the nodes it runs on. A new panel goes into its place in ``PANELS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from dashboards.common import (
    BLUE,
    FULL,
    SCRAPE,
    actions_annotation,
    incidents_annotation,
    new_dashboard,
    query_variable,
)
from dashboards.panels import Heatmap, Row, Stat, Table, Timeseries

if TYPE_CHECKING:
    from grafana_foundation_sdk.models import dashboard as dm

UID: Final = "fleetwatch-job-health"
J: Final = '{training_job="$job"}'
RANK: Final = "rank {{rank}} ({{node}} GPU {{gpu}})"
# The job's nodes: those with a rank of the job.
ON_NODES: Final = f" and on (node) fleetwatch_job_rank_step_time_seconds{J}"


def _headline(title: str, description: str, suffix: str, unit: str = "short") -> Stat:
    """One of the job's headline figures, ``fleetwatch_job_<suffix>``, six to a row."""
    return Stat(title, description, [f"fleetwatch_job_{suffix}{J}"], unit=unit, width=4, steps=BLUE)


PANELS: Final = (
    Row("Throughput and efficiency"),
    _headline("Tokens/s", "Tokens per second over the recent steps.", "tokens_per_second"),
    _headline("Tokens/s per GPU", "Tokens per second per GPU.", "tokens_per_second_per_gpu"),
    _headline(
        "MFU",
        "Model FLOPs utilisation (0 when the model size is unknown).",
        "mfu_ratio",
        "percentunit",
    ),
    _headline(
        "ETTR",
        "Effective training time ratio: time of steps that moved the job forward / wall time.",
        "ettr_ratio",
        "percentunit",
    ),
    _headline("GPUs", "GPUs (ranks) of the job.", "gpus"),
    _headline("Step", "Highest step finished.", "step"),
    Table(
        "State",
        "running; hung (every rank process there, no step for longer than the job's deadline: "
        "5 x its p99 step time, 30 s at least); failed (a rank process ended without saying "
        "ok); finished; idle. `fleetwatch jobs JOB` names the ranks that stand out "
        "(docs/jobs.md, Hangs).",
        [f"fleetwatch_job_state{J} == 1"],
        hide=(*SCRAPE, "Value", "training_job"),
        width=8,
        no_value="no report",
    ),
    Timeseries(
        "Time since the last step",
        "Seconds since the job last finished a step: a hung job's climbs past its deadline.",
        [(f"fleetwatch_job_silent_seconds{J}", "since the last step")],
        unit="s",
        width=16,
    ),
    Timeseries(
        "Tokens per second",
        "Throughput over the recent steps, and goodput: tokens of steps that moved the job "
        "forward per second of wall time (restarts, gaps and checkpoint stalls cost it).",
        [
            (f"fleetwatch_job_tokens_per_second{J}", "tokens/s"),
            (f"fleetwatch_job_goodput_tokens_per_second{J}", "goodput"),
        ],
    ),
    Timeseries(
        "Tokens per second per GPU",
        "Throughput divided by the job's GPUs.",
        [(f"fleetwatch_job_tokens_per_second_per_gpu{J}", "tokens/s per GPU")],
    ),
    Timeseries(
        "MFU and ETTR",
        "Model FLOPs utilisation and effective training time ratio.",
        [(f"fleetwatch_job_mfu_ratio{J}", "MFU"), (f"fleetwatch_job_ettr_ratio{J}", "ETTR")],
        unit="percentunit",
    ),
    Timeseries(
        "Step time",
        "Median step time over the recent steps.",
        [(f"fleetwatch_job_step_time_seconds{J}", "step time")],
        unit="s",
    ),
    Timeseries(
        "Throughput drop",
        "Share of throughput lost in a detected drop (0: no drop). The incident names the "
        "suspect nodes, or says it is the fabric or no hardware at all.",
        [(f"fleetwatch_job_throughput_drop_ratio{J}", "drop")],
        unit="percentunit",
        width=FULL,
    ),
    Row("Ranks and stragglers"),
    Timeseries(
        "Step time per rank",
        "Each rank's latest step time: in a synchronous job they wait for the slowest.",
        [(f"fleetwatch_job_rank_step_time_seconds{J}", RANK)],
        unit="s",
        width=FULL,
    ),
    Heatmap(
        "Compute time per rank",
        "Each rank's compute time (its step without the wait): a straggler is a hot row.",
        [(f"fleetwatch_job_rank_compute_seconds{J}", "{{node}} GPU {{gpu}} rank {{rank}}")],
        unit="s",
        width=FULL,
        height=12,
    ),
    Timeseries(
        "Stragglers and the GPUs they cost",
        "Ranks computing slower than the job's median by the margin, and the GPUs the job "
        "loses waiting for its slowest straggler (GPU-hours per hour).",
        [
            (f"fleetwatch_job_stragglers{J}", "stragglers"),
            (f"fleetwatch_job_straggler_lost_gpus{J}", "GPUs lost to stragglers"),
        ],
    ),
    Timeseries(
        "Straggler slowdown",
        "How much slower each straggling rank computes than the job's median.",
        [(f"fleetwatch_job_rank_slowdown_ratio{J}", RANK)],
        unit="percentunit",
    ),
    Table(
        "Straggling ranks",
        "The ranks straggling now: node, GPU and slowdown.",
        [f"sort_desc(fleetwatch_job_rank_slowdown_ratio{J})"],
        hide=SCRAPE,
        rename={"Value": "slowdown"},
        unit="percentunit",
        width=FULL,
        no_value="no straggler",
    ),
    Row("Checkpoints"),
    Timeseries(
        "Checkpoint age and advised interval",
        "Time since the last checkpoint ended, against the Young/Daly interval advised from "
        "the failure rate of the job's nodes (0: the checkpoint cost is not known yet).",
        [
            (f"fleetwatch_job_checkpoint_age_seconds{J}", "age"),
            (f"fleetwatch_job_checkpoint_interval_recommended_seconds{J}", "advised interval"),
        ],
        unit="s",
    ),
    Timeseries(
        "Checkpoint cost",
        "Median time a checkpoint takes.",
        [(f"fleetwatch_job_checkpoint_cost_seconds{J}", "cost")],
        unit="s",
    ),
)


def build() -> dm.Dashboard:
    """The job health dashboard."""
    return new_dashboard(
        "fleetwatch: job health",
        UID,
        "One training job: throughput, MFU, ETTR, ranks and stragglers, checkpoints.",
        PANELS,
        tags=["jobs"],
        time_from="now-3h",
        variables=[query_variable("job", "Job", "label_values(fleetwatch_job_step, training_job)")],
        annotations=[
            incidents_annotation("Job incidents", J),
            incidents_annotation("Incidents on the job's nodes", where=ON_NODES),
            actions_annotation("Actions on the job's nodes", where=ON_NODES),
        ],
    )


__all__ = ["UID", "build"]
