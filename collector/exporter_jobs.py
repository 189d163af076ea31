"""Prometheus metrics of training jobs: throughput, MFU, ETTR, stragglers, drops, checkpoints.

One series per job (label ``job``), plus one per straggling rank; never one per rank of every
job, so a 16k-rank job costs a few dozen series.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client import Metric

    from collector.jobs.book import JobBook

# (metric suffix, job map key, help)
_GAUGES: Final = (
    ("tokens_per_second", "tokens_per_s", "Tokens per second over the recent steps."),
    ("tokens_per_second_per_gpu", "tokens_per_s_per_gpu", "Tokens per second per GPU."),
    ("mfu_ratio", "mfu", "Model FLOPs utilisation (0 when the model size is unknown)."),
    ("step_time_seconds", "step_time_s", "Median step time over the recent steps."),
    ("step", "step", "Highest step finished."),
    ("gpus", "gpus", "GPUs (ranks) of the job."),
    ("ettr_ratio", "ettr", "Effective training time ratio since fleetwatch first saw the job."),
    (
        "goodput_tokens_per_second",
        "goodput_tokens_per_s",
        "Tokens of steps that moved the job forward, per second of wall time.",
    ),
    ("stragglers", "stragglers", "Ranks computing slower than the job's median by the margin."),
    (
        "lost_gpu_hours_per_hour",
        "lost_gpu_hours_per_hour",
        "GPU-hours per hour the job loses waiting for its slowest straggler.",
    ),
    ("throughput_drop_ratio", "drop_share", "Share of throughput lost in a detected drop."),
    ("checkpoint_age_seconds", "checkpoint_age_s", "Time since the job's last checkpoint ended."),
    ("checkpoint_cost_seconds", "checkpoint_cost_s", "Median time a checkpoint takes."),
    (
        "checkpoint_interval_recommended_seconds",
        "checkpoint_interval_s",
        "Young/Daly checkpoint interval from its nodes' failure rate (0: cost unknown).",
    ),
)


class JobsCollector(Collector):
    """Yields job metrics from the job book's last published figures."""

    def __init__(self, jobs: JobBook) -> None:
        """Read from ``jobs``; register with a registry you own."""
        self._jobs = jobs

    def describe(self) -> list[Metric]:
        """Skip the registration-time collect (families are dynamic)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Render every family."""
        jobs = [j for j in self._jobs.summaries() if j["active"]]
        for suffix, key, doc in _GAUGES:
            family = GaugeMetricFamily(f"fleetwatch_job_{suffix}", doc, labels=["job"])
            for job in jobs:
                family.add_metric([job["id"]], float(job[key]))
            yield family
        slow = GaugeMetricFamily(
            "fleetwatch_job_rank_slowdown_ratio",
            "A straggling rank's compute time over the job's median, minus 1.",
            labels=["job", "rank", "node", "gpu"],
        )
        for job in jobs:
            for rank in self._jobs.ranks(job["id"]):
                if rank["straggler"] and rank["compute_ratio"] is not None:
                    gpu = "" if rank["gpu"] is None else str(rank["gpu"])
                    slow.add_metric(
                        [job["id"], str(rank["rank"]), rank["node"], gpu],
                        rank["compute_ratio"] - 1,
                    )
        yield slow
        yield CounterMetricFamily(
            "fleetwatch_job_reports",
            "Step reports taken into jobs.",
            value=self._jobs.reports,
        )
