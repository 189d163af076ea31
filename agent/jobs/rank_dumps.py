"""A job's rank dumps on this node: each rank process's state, wait channel and Python stacks.

The collector asks for them (``DUMP_RANKS``) when it judges a job hung. Only processes this agent
watches for the job are dumped: those that reported a step of it on the job socket, named by the
kernel (``SO_PEERCRED``) and told apart from a later process with the same pid by their start
(:mod:`agent.jobs.rank_watch`). The command names a job, never a pid. Before and after its stack
is read, a process must still be the one that reported, run by the uid it reported as; a dump
read from a process that changed meanwhile is thrown away.

At most ``MAX_RANK_DUMPS`` ranks (lowest first); a process that reported several ranks is read
once. The processes are read at once on a few threads of our own, each dump bounded by the
dumper (py-spy: 2 s), and the node's whole answer by ``timeout_s`` (10 s): a rank not read by
then says so. The answer must fit one stream message: a rank's stacks beyond its share of
``MAX_ANSWER_BYTES`` lose their last threads (the main one comes first), then outer frames.

Meanwhile each rank that serves its Flight Recorder (:mod:`agent.jobs.flight_recorder`) is asked
where it stands in its process groups' collectives, within a second.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Final

import structlog

from agent.jobs.stacks import StackResult
from fleetwatch.wire.settings import MAX_MESSAGE_BYTES
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate_jobs import MAX_DUMP_TEXT, MAX_RANK_DUMPS

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from agent.jobs.flight_recorder import RecorderChannels
    from agent.jobs.rank_watch import RankNow, RankWatch
    from agent.jobs.stacks import StackDumper

log = structlog.get_logger("agent.jobs")

NODE_TIMEOUT_S: Final = 10.0
WORKERS: Final = 8  # processes read at once (a node's 8 GPUs: one rank each)
MAX_ANSWER_BYTES: Final = MAX_MESSAGE_BYTES * 3 // 4  # the rest: the CommandResult around them
_CHANGED: Final = "the process is no longer the one that reported (it ended, or changed user)"
_NO_DUMPER: Final = "this agent reads no stacks"
_DUMP_FIELDS: Final = 1024  # a dump's bytes beside its threads: job id, error, wchan, ...
RECORDER_BYTES: Final = 4096  # a rank's Flight Recorder groups, at most (the first ones)

_Process = tuple[int, int]  # (pid, start ticks)


def _field_size(length: int) -> int:
    """Bytes of a length-delimited field of ``length`` bytes: tag, length, the bytes."""
    return 1 + max(1, (length.bit_length() + 6) // 7) + length


def fit(threads: Sequence[pb.ThreadStack], max_bytes: int) -> tuple[list[pb.ThreadStack], bool]:
    """The threads that fit in ``max_bytes`` (the first ones), and whether any were cut.

    When the first thread alone is too big, its innermost frames that fit are kept.
    """
    kept: list[pb.ThreadStack] = []
    used = 0
    for thread in threads:
        size = _field_size(thread.ByteSize())
        if used + size > max_bytes:
            break
        kept.append(thread)
        used += size
    if kept or not threads:
        return kept, len(kept) < len(threads)
    first = threads[0]
    cut = pb.ThreadStack(name=first.name, thread_id=first.thread_id, active=first.active)
    room = max_bytes - _field_size(cut.ByteSize()) - 4  # the thread's length grows with it
    for frame in first.frames:
        size = _field_size(frame.ByteSize())
        if size > room:
            break
        cut.frames.append(frame)
        room -= size
    return [cut], True


def fit_groups(
    groups: Sequence[pb.CollectiveGroup], error: str
) -> tuple[list[pb.CollectiveGroup], str]:
    """The first groups that fit in ``RECORDER_BYTES``, and the error saying what was left out."""
    kept: list[pb.CollectiveGroup] = []
    used = 0
    for group in groups:
        used += _field_size(group.ByteSize())
        if used > RECORDER_BYTES:
            left = len(groups) - len(kept)
            return kept, error or f"{left} process groups left out (over {RECORDER_BYTES} bytes)"
        kept.append(group)
    return kept, error


class RankDumps:
    """Dumps the ranks of a job that this node's agent watches, bounded in count, time and size."""

    def __init__(  # noqa: PLR0913 - the seams and bounds a node's dump is made with
        self,
        ranks: RankWatch,
        dumper: StackDumper | None,
        *,
        timeout_s: float = NODE_TIMEOUT_S,
        workers: int = WORKERS,
        monotonic: Callable[[], float] = time.monotonic,
        recorders: RecorderChannels | None = None,
    ) -> None:
        """Read ``ranks``' processes with ``dumper`` (None: state and wait channel only).

        ``recorders``: the ranks' Flight Recorder channels (None: none asked).
        """
        self._ranks = ranks
        self._recorders = recorders
        self._dumper = dumper
        self._timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="rank-dump")
        self._monotonic = monotonic

    def _read(self, rank: RankNow, max_bytes: int) -> tuple[StackResult, float]:
        """One process's stacks cut to ``max_bytes``, and how long reading took (a pool thread)."""
        start = self._monotonic()
        if not self._ranks.same_process(rank.pid, rank.start_ticks, rank.uid):
            return StackResult(error=_CHANGED), 0.0
        if self._dumper is None:
            return StackResult(error=_NO_DUMPER), 0.0
        try:
            result = self._dumper(rank.pid)
        except Exception as exc:  # a dumper's fault must not stop the command (logged)
            log.exception("rank_dump_failed", pid=rank.pid)
            result = StackResult(error=f"the stack dumper failed: {type(exc).__name__}")
        if result.threads and not self._ranks.same_process(rank.pid, rank.start_ticks, rank.uid):
            result = StackResult(error=_CHANGED)  # what was read may be another process's
        threads, cut = fit(result.threads, max_bytes)
        if cut:
            log.info("rank_dump_cut", job=rank.job_id, pid=rank.pid, max_bytes=max_bytes)
            result = StackResult(tuple(threads), result.error)
        return result, max(self._monotonic() - start, 0.0)

    async def dump(self, job_id: str) -> list[pb.RankDump] | None:
        """The job's ranks on this node, dumped; None when none of its processes is watched."""
        ranks = self._ranks.ranks_of(job_id)[:MAX_RANK_DUMPS]
        if not ranks:
            return None
        loop = asyncio.get_running_loop()
        started = self._monotonic()
        share = MAX_ANSWER_BYTES // len(ranks) - _DUMP_FIELDS - RECORDER_BYTES  # its threads
        reads: dict[_Process, asyncio.Future[tuple[StackResult, float]]] = {}
        for rank in ranks:
            key = (rank.pid, rank.start_ticks)
            if key not in reads:
                reads[key] = loop.run_in_executor(self._pool, self._read, rank, share)
        recorded = await self._ask_recorders(list(reads))  # meanwhile the stacks are read
        left = max(0.0, self._timeout_s - (self._monotonic() - started))
        _, late = await asyncio.wait(reads.values(), timeout=left)
        for future in late:
            future.cancel()  # not started: never runs; running: its answer is dropped
        overdue = StackResult(error=f"not read within the node's {self._timeout_s:g} s")
        waited = max(self._monotonic() - started, 0.0)
        dumps = []
        for rank in ranks:
            future = reads[(rank.pid, rank.start_ticks)]
            result, took = (overdue, waited) if future in late else future.result()
            collectives, recorder_error = recorded.get((rank.pid, rank.start_ticks), ([], ""))
            collectives, recorder_error = fit_groups(collectives, recorder_error)
            dumps.append(
                pb.RankDump(
                    job_id=rank.job_id,
                    rank=rank.rank,
                    pid=rank.pid,
                    state=rank.state,
                    wchan=rank.wchan,
                    threads=result.threads,
                    error=result.error[:MAX_DUMP_TEXT],
                    took_s=took,
                    collectives=collectives,
                    recorder_error=recorder_error[:MAX_DUMP_TEXT],
                )
            )
        return dumps

    async def _ask_recorders(
        self, processes: list[_Process]
    ) -> dict[_Process, tuple[list[pb.CollectiveGroup], str]]:
        """Each process's Flight Recorder groups (or why none), asked at once."""
        if self._recorders is None:
            return {}
        answers = await asyncio.gather(*(self._recorders.ask(p) for p in processes))
        return dict(zip(processes, answers, strict=True))
