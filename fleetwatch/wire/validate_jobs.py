"""Step reports and rank dumps checked: by the agent before sending, by the collector on receipt.

Every failure is a :class:`~fleetwatch.wire.validate.WireError` with reason ``invalid_job_step``
(``invalid_rank_dump`` for a ``DUMP_RANKS`` answer) and a message that names the job and rank and
the field that was wrong.
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
# A DUMP_RANKS answer (docs/jobs.md "Hangs: what the agent reads"): one dump per local rank.
MAX_RANK_DUMPS: Final = 64
MAX_DUMP_THREADS: Final = 64
MAX_DUMP_FRAMES: Final = 64  # innermost first
MAX_DUMP_TEXT: Final = 256  # characters of a name, file, function or error
MAX_DUMP_GROUPS: Final = 64  # process groups of a rank's Flight Recorder
MAX_DUMP_RECENT: Final = 16  # collectives of each
MAX_COLLECTIVE_SEQ: Final = 2**53  # sequence numbers: a counter, far below this
DUMP_STATE: Final = re.compile(r"[A-Za-z]")  # /proc/<pid>/stat's state letter
DUMP_REASON: Final = "invalid_rank_dump"


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


def _dump_check(ok: bool, where: str, message: str) -> None:  # noqa: FBT001 - as _check
    if not ok:
        raise WireError(DUMP_REASON, f"{where}: {message}")


def _short(value: str, where: str, what: str) -> None:
    _dump_check(
        len(value) <= MAX_DUMP_TEXT,
        where,
        f"{what} {value[:40]!r}... longer than {MAX_DUMP_TEXT} characters",
    )


def _seq(value: int, where: str, what: str) -> None:
    _dump_check(
        -1 <= value <= MAX_COLLECTIVE_SEQ,
        where,
        f"{what} {value} must be a sequence number from -1 (none) to {MAX_COLLECTIVE_SEQ}",
    )


def _collectives(dump: pb.RankDump, where: str) -> None:
    """A rank's Flight Recorder groups: bounded, short names, plausible sequence numbers."""
    _dump_check(
        len(dump.collectives) <= MAX_DUMP_GROUPS,
        where,
        f"{len(dump.collectives)} process groups; limit {MAX_DUMP_GROUPS}",
    )
    ids = set()
    for group in dump.collectives:
        _short(group.id, where, "process group id")
        _short(group.name, where, "process group name")
        _dump_check(group.id not in ids, where, f"process group {group.id[:40]!r} twice")
        ids.add(group.id)
        _seq(group.last_enqueued, where, "last_enqueued")
        _seq(group.last_started, where, "last_started")
        _seq(group.last_completed, where, "last_completed")
        _dump_check(
            len(group.recent) <= MAX_DUMP_RECENT,
            where,
            f"process group {group.id[:40]!r} has {len(group.recent)} recent collectives; "
            f"limit {MAX_DUMP_RECENT}",
        )
        for collective in group.recent:
            _seq(collective.seq, where, "collective seq")
            _short(collective.op, where, "collective op")
            _short(collective.state, where, "collective state")


def validate_rank_dumps(result: pb.CommandResult) -> None:
    """Check the rank dumps of a ``DUMP_RANKS`` answer: bounded, frames only, plausible."""
    _dump_check(
        len(result.dumps) <= MAX_RANK_DUMPS,
        "rank dumps",
        f"{len(result.dumps)} dumps in one answer; limit {MAX_RANK_DUMPS}",
    )
    for dump in result.dumps:
        _dump_check(
            JOB_ID.fullmatch(dump.job_id) is not None,
            "rank dump",
            f"job id {dump.job_id[:80]!r} must be 1-128 letters, digits or ._:/@+=-",
        )
        where = f"job {dump.job_id} rank {dump.rank} dump"
        _dump_check(dump.rank < MAX_RANKS, where, f"rank above {MAX_RANKS}")
        _dump_check(
            DUMP_STATE.fullmatch(dump.state) is not None,
            where,
            f"state {dump.state[:40]!r} must be one letter, as /proc/<pid>/stat gives it",
        )
        _dump_check(
            WCHAN.fullmatch(dump.wchan) is not None,
            where,
            f"wchan {dump.wchan[:40]!r} must be a kernel symbol of at most 64 characters",
        )
        _short(dump.error, where, "error")
        _short(dump.recorder_error, where, "recorder error")
        _collectives(dump, where)
        _dump_check(
            math.isfinite(dump.took_s) and dump.took_s >= 0,
            where,
            f"took_s {dump.took_s} must be a finite number of seconds, 0 or more",
        )
        _dump_check(
            len(dump.threads) <= MAX_DUMP_THREADS,
            where,
            f"{len(dump.threads)} threads; limit {MAX_DUMP_THREADS}",
        )
        for thread in dump.threads:
            _short(thread.name, where, "thread name")
            _dump_check(
                len(thread.frames) <= MAX_DUMP_FRAMES,
                where,
                f"thread {thread.name[:40]!r} has {len(thread.frames)} frames; "
                f"limit {MAX_DUMP_FRAMES}",
            )
            for frame in thread.frames:
                _short(frame.function, where, "function")
                _short(frame.file, where, "file")
