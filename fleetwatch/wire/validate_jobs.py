"""Checks on training-step reports: the agent runs them before forwarding, the collector on receipt.

Every failure is a :class:`~fleetwatch.wire.validate.WireError` with reason ``invalid_job_step``
and a message that names the job, rank and step and the field that was wrong.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Final

from fleetwatch.wire.validate import WireError

if TYPE_CHECKING:
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
    from fleetwatch.wire.validate import Inventory

JOB_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,127}")
# A rank's message to the agent's job socket (docs/jobs.md); longer ones are refused whole.
MAX_DATAGRAM_BYTES: Final = 2048
# Who sent a step, as the agent found it in the sender's cgroup: a Slurm job or a pod's UID.
SCHEDULER_JOB: Final = re.compile(
    r"slurm:[0-9]{1,20}|k8s:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
)
MAX_STEPS_PER_REPORT: Final = 10_000
MAX_PROCESSES_PER_REPORT: Final = 1024  # rank processes an agent watches (docs/jobs.md "Hangs")
# How a rank's process is, as /proc/<pid>/stat says (or gone).
PROCESS_STATES: Final = frozenset(
    {"running", "sleeping", "disk_sleep", "stopped", "zombie", "exited"}
)
MAX_CPU_S: Final = 1e10
FAREWELLS: Final = frozenset({"", "ok", "error"})
WCHAN: Final = re.compile(r"[A-Za-z0-9_.]{0,64}")  # a kernel symbol
MAX_RANKS: Final = 1_000_000
MAX_STEP: Final = 2**53
MAX_SECONDS: Final = 7 * 86400.0  # a step or a checkpoint longer than a week is not a report
MAX_TOKENS: Final = 1e12
MAX_PARAMS: Final = 1e15
MAX_FLOPS_PER_TOKEN: Final = 1e19
REASON: Final = "invalid_job_step"


def _check(ok: bool, where: str, message: str) -> None:  # noqa: FBT001 - reads as an assertion
    if not ok:
        raise WireError(REASON, f"{where}: {message}")


def _bounded(value: float, low: float, high: float) -> bool:
    return math.isfinite(value) and low <= value <= high


def _job_and_rank(job_id: str, rank: int, what: str, which: str) -> str:
    """Check a message's job id and rank; return how its errors name it."""
    _check(
        JOB_ID.fullmatch(job_id) is not None,
        what,
        f"job id {job_id[:80]!r} must be 1-128 letters, digits or ._:/@+=-",
    )
    where = f"job {job_id} rank {rank} {which}"
    _check(rank < MAX_RANKS, where, f"rank above {MAX_RANKS}")
    return where


def validate_job_step(step: pb.JobStep, inventory: Inventory | None = None) -> None:
    """Check one step report; ``inventory`` (the node's GPUs) checks the GPU it names."""
    where = _job_and_rank(step.job_id, step.rank, "job step", f"step {step.step}")
    _check(step.step < MAX_STEP, where, "step number out of range")
    _check(step.time_unix_ms > 0, where, "time_unix_ms must be positive")
    _check(
        _bounded(step.step_time_s, 0.0, MAX_SECONDS) and step.step_time_s > 0,
        where,
        f"step_time_s {step.step_time_s} must be above 0 and at most a week",
    )
    _check(_bounded(step.tokens, 0.0, MAX_TOKENS), where, f"tokens {step.tokens} out of range")
    if step.HasField("compute_time_s"):
        _check(
            _bounded(step.compute_time_s, 0.0, MAX_SECONDS),
            where,
            f"compute_time_s {step.compute_time_s} out of range",
        )
    _check(
        step.world_size <= MAX_RANKS and (step.world_size == 0 or step.rank < step.world_size),
        where,
        f"world_size {step.world_size} does not hold rank {step.rank}",
    )
    _check(_bounded(step.params, 0.0, MAX_PARAMS), where, f"params {step.params} out of range")
    _check(
        _bounded(step.flops_per_token, 0.0, MAX_FLOPS_PER_TOKEN),
        where,
        f"flops_per_token {step.flops_per_token} out of range",
    )
    _check(
        not step.scheduler_job or SCHEDULER_JOB.fullmatch(step.scheduler_job) is not None,
        where,
        f"scheduler_job {step.scheduler_job[:80]!r} must be slurm:<job id> or k8s:<pod uid>",
    )
    _check(
        0 <= step.sender_start_unix_ms < MAX_STEP,
        where,
        f"sender_start_unix_ms {step.sender_start_unix_ms} out of range",
    )
    start, end = step.checkpoint_start_unix_ms, step.checkpoint_end_unix_ms
    _check(
        (start == end == 0) or (0 < start <= end and end - start <= MAX_SECONDS * 1000),
        where,
        f"checkpoint {start}..{end} ms must be 0..0 or a start before its end, within a week",
    )
    if step.gpu_uuid and inventory is not None:
        _check(
            step.gpu_uuid in inventory.nvlinks_by_gpu,
            where,
            f"GPU {step.gpu_uuid[:80]} is not one of this node's",
        )


def validate_job_report(report: pb.JobReport, inventory: Inventory) -> None:
    """Check a JobReport from an agent (a batch of step reports)."""
    _check(
        len(report.steps) <= MAX_STEPS_PER_REPORT,
        "job report",
        f"{len(report.steps)} steps in one report; limit {MAX_STEPS_PER_REPORT}",
    )
    for step in report.steps:
        validate_job_step(step, inventory)
    _check(
        len(report.processes) <= MAX_PROCESSES_PER_REPORT,
        "job report",
        f"{len(report.processes)} rank processes in one report; limit {MAX_PROCESSES_PER_REPORT}",
    )
    for process in report.processes:
        validate_rank_process(process)


def validate_rank_process(process: pb.RankProcess) -> None:
    """Check what an agent says of one rank's process."""
    where = _job_and_rank(process.job_id, process.rank, "rank process", "process")
    _check(
        process.state in PROCESS_STATES,
        where,
        f"state {process.state[:40]!r} is not one of {', '.join(sorted(PROCESS_STATES))}",
    )
    _check(_bounded(process.cpu_s, 0.0, MAX_CPU_S), where, f"cpu_s {process.cpu_s} out of range")
    _check(
        process.farewell in FAREWELLS,
        where,
        f"farewell {process.farewell[:40]!r} must be ok, error or nothing",
    )
    _check(
        WCHAN.fullmatch(process.wchan) is not None,
        where,
        f"wchan {process.wchan[:40]!r} must be a kernel symbol of at most 64 characters",
    )
