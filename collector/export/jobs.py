"""Prometheus metrics of training jobs: throughput, MFU, ETTR, stragglers, drops, checkpoints.

One series per job (label ``job``), and per rank its step and compute time: one series per GPU
the job runs on, so a job costs what its GPUs already cost, plus one per straggling rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client.registry import Collector

from collector.export.catalog import catalog, families
from collector.jobs.book import REFUSALS

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client import Metric

    from collector.jobs.book import JobBook

# (metric suffix, job map key)
_GAUGES: Final = (
    ("tokens_per_second", "tokens_per_s"),
    ("tokens_per_second_per_gpu", "tokens_per_s_per_gpu"),
    ("mfu_ratio", "mfu"),
    ("step_time_seconds", "step_time_s"),
    ("step", "step"),
    ("gpus", "gpus"),
    ("ranks_missing", "ranks_missing"),
    ("ettr_ratio", "ettr"),
    ("goodput_tokens_per_second", "goodput_tokens_per_s"),
    ("stragglers", "stragglers"),
    ("straggler_lost_gpus", "lost_gpu_hours_per_hour"),
    ("throughput_drop_ratio", "drop_share"),
    ("checkpoint_age_seconds", "checkpoint_age_s"),
    ("checkpoint_cost_seconds", "checkpoint_cost_s"),
    ("checkpoint_interval_recommended_seconds", "checkpoint_interval_s"),
    ("silent_seconds", "silent_s"),
)
# States whose jobs stay on /metrics after idle_after_s without a report: they still cost GPUs.
_KEPT: Final = frozenset({"hung", "failed"})
# Per-rank gauges: (metric, rank map key).
_RANK_GAUGES: Final = (
    ("fleetwatch_job_rank_step_time_seconds", "step_time_s"),
    ("fleetwatch_job_rank_compute_seconds", "compute_time_s"),
)
_NAMES: Final = tuple(s.name for s in catalog() if s.group == "Training jobs")


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
        f = families(_NAMES)
        for job in self._jobs.summaries():
            if not job["active"] and job["state"] not in _KEPT:
                continue
            for suffix, key in _GAUGES:
                f[f"fleetwatch_job_{suffix}"].add_metric([job["id"]], float(job[key]))
            f["fleetwatch_job_state"].add_metric([job["id"], job["state"]], 1.0)
            evidence = self._jobs.evidence_of(job["id"])
            if evidence is not None:
                f["fleetwatch_job_evidence_seconds"].add_metric([job["id"]], evidence["took_s"])
            for rank in self._jobs.ranks(job["id"]):
                gpu = "" if rank["gpu"] is None else str(rank["gpu"])
                labels = [job["id"], str(rank["rank"]), rank["node"], gpu]
                for metric, key in _RANK_GAUGES:
                    if rank[key] is not None:
                        f[metric].add_metric(labels, float(rank[key]))
                if rank["straggler"] and rank["compute_ratio"] is not None:
                    f["fleetwatch_job_rank_slowdown_ratio"].add_metric(
                        labels, rank["compute_ratio"] - 1
                    )
        f["fleetwatch_job_reports_total"].add_metric([], self._jobs.reports)
        refused = self._jobs.refusals()
        for reason in REFUSALS:
            f["fleetwatch_job_reports_refused_total"].add_metric([reason], refused[reason])
        yield from f.values()
