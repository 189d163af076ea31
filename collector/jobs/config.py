"""How the collector judges training jobs: the ``[collector.jobs]`` table."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from collector.exceptions import ConfigError
from fleetwatch.config_file import check_number

_POSITIVE = (
    "straggler_margin",
    "straggler_shift",
    "min_drop",
    "drop_threshold",
    "fabric_share",
    "congestion_xmit_wait_per_s",
    "checkpoint_overdue_factor",
    "idle_after_s",
    "forget_after_s",
    "uid_job_share",
    "evidence_ib_errors",
    "evidence_nvlink_errors",
    "hang_factor",
    "hang_floor_s",
    "exit_grace_s",
    "culprit_window_s",
    "checkpoint_floor_s",
)
_COUNTS = (
    "straggler_window_steps",
    "drop_warmup_steps",
    "fabric_min_nodes",
    "max_jobs",
    "max_ranks",
    "ranks_per_node",
)


@dataclass(frozen=True, slots=True)
class JobsConfig:
    """Thresholds of the job correlator (all have defaults an operator rarely changes)."""

    # A rank whose compute time stays this share above the job's median over the window.
    straggler_margin: float = 0.10
    straggler_window_steps: int = 20
    # Fail-slow: a sustained shift of this share above the rank's peers, found by a CUSUM, is a
    # straggler too (named once its window median is over half of it, and many noise units).
    straggler_shift: float = 0.05
    # A sustained throughput drop of at least this share, found by change-point detection.
    min_drop: float = 0.05
    drop_threshold: float = 6.0
    drop_warmup_steps: int = 30
    # Congestion or IB errors on at least this share of a job's nodes (and this many nodes) is
    # the fabric's doing.
    fabric_share: float = 0.25
    fabric_min_nodes: int = 3
    congestion_xmit_wait_per_s: float = 100_000.0
    # Error counters that grew less than this over the evidence window are no evidence: a
    # healthy link logs a few (IB: symbol and receive errors of one port, each; NVLink: replay
    # and CRC errors of one link, together).
    evidence_ib_errors: float = 100.0
    evidence_nvlink_errors: float = 100.0
    # A checkpoint older than this many recommended intervals is overdue.
    checkpoint_overdue_factor: float = 3.0
    # A job with no report for this long has ended; it is forgotten after forget_after_s.
    idle_after_s: float = 600.0
    forget_after_s: float = 3600.0
    max_jobs: int = 1000
    max_ranks: int = 100_000
    # Ranks (of all jobs together) one node's reports may hold: each costs 2-3 series, and a
    # node of 8 GPUs runs 8 ranks of a job, so this is room for several jobs' ranks a GPU, not
    # for a node's made-up ranks (its agent also bounds each local user's, docs/jobs.md).
    ranks_per_node: int = 64
    # One uid's jobs may hold at most this share of max_jobs (Slurm jobs count for their uid).
    uid_job_share: float = 0.1
    # A job whose rank processes are all there but finished no step for max(hang_factor x its
    # p99 step time, hang_floor_s) is hung; one with no step for exit_grace_s since a rank's
    # process ended without saying ok, failed (docs/jobs.md "Hangs").
    hang_factor: float = 5.0
    hang_floor_s: float = 30.0
    exit_grace_s: float = 10.0
    # Of the ranks gone in a failed job, those that went within this of the first are its
    # culprits; the later ones were ended by the failure (NCCL's watchdog, the launcher). Two
    # agent polls (5 s each by default): ranks gone together may be seen one poll apart.
    culprit_window_s: float = 10.0
    # An announced checkpoint adds max(3 x the job's longest checkpoint, this) to the deadline.
    checkpoint_floor_s: float = 600.0

    def __post_init__(self) -> None:
        """Reject values that cannot work, naming the key."""
        for key in _POSITIVE:
            check_number(getattr(self, key), f"jobs.{key}", ConfigError)
        for key in _COUNTS:
            check_number(
                getattr(self, key),
                f"jobs.{key}",
                ConfigError,
                minimum=1,
                inclusive=True,
                integer=True,
            )
        for key in ("straggler_margin", "straggler_shift", "min_drop", "fabric_share"):
            if getattr(self, key) >= 1:
                msg = f"collector.jobs: {key} is a share and must be below 1"
                raise ConfigError(msg)
        if self.uid_job_share > 1:
            msg = "collector.jobs: uid_job_share is a share of max_jobs and must be at most 1"
            raise ConfigError(msg)

    @property
    def jobs_per_uid(self) -> int:
        """How many jobs one uid's reports may hold at once."""
        return max(1, int(self.max_jobs * self.uid_job_share))

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> JobsConfig:
        """Build from the TOML table; unknown keys are an error that names them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            known_keys = ", ".join(sorted(known))
            msg = f"collector.jobs: unknown keys {', '.join(unknown)}; known: {known_keys}"
            raise ConfigError(msg)
        return cls(**table)
