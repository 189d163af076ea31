"""One training job as the collector sees it: its ranks, where they run, and its finished steps.

Ranks report each step on their own (through the agents of their nodes), so a step is gathered
rank by rank and *finished* once every rank reported it, or once the job has moved two steps past
it (a rank whose report was lost does not hold the job's figures back). A finished step feeds the
straggler detector (ranks' compute times) and the drop detector (the job's tokens per second).

A rank that stops reporting while the others go on (its GPU lost, its node crashed) is *missing*
once the job finished ``MISSING_STEPS`` steps without it, or at once when the fleet says its GPU
or node is gone (:attr:`JobState.gone`, set by the job book). A missing rank is no straggler, and
a step's tokens are scaled up only for reports lost from ranks that are there, never over the
missing ones: the job's tokens/s is what the ranks it has make.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from collector.jobs.changepoint import DropConfig, DropDetector
from collector.jobs.processes import GONE, RankProcess
from collector.jobs.stragglers import StragglerConfig, StragglerDetector

if TYPE_CHECKING:
    from collector.jobs.config import JobsConfig
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

FINISH_LAG: Final = 2  # a step is finished once some rank reports this many steps after it
RESTART_LAG: Final = 10  # a report this far behind the finished steps: the job restarted
MAX_PENDING: Final = 64  # steps gathered at once; older ones are finished with what they have
HISTORY: Final = 600  # finished steps kept (for figures over a window and the drop's onset)
CHECKPOINTS: Final = 16
SMOOTH_STEPS: Final = 9
# A rank is missing once the job finished this many steps since its last report (a live rank
# reports every step; FINISH_LAG of them may be in flight).
MISSING_STEPS: Final = FINISH_LAG + 3


@dataclass(slots=True)
class RankState:
    """Where a rank runs, and its latest report."""

    rank: int
    node: str
    gpu_uuid: str
    step: int = 0
    step_time_s: float = 0.0
    compute_time_s: float | None = None
    last_seen: float = 0.0  # monotonic
    last_report_ms: int = 0  # the rank's own time of its last report (Unix ms)
    finished_at_report: int = 0  # how many steps the job had finished at its last report


@dataclass(slots=True)
class _Gathering:
    """One step's reports as they come in."""

    step_times: dict[int, float] = field(default_factory=dict)
    compute: dict[int, float] = field(default_factory=dict)
    tokens: float = 0.0


@dataclass(frozen=True, slots=True)
class FinishedStep:
    """A step every rank (or all that reported) finished."""

    step: int
    at: float  # monotonic time it was finished
    step_time_s: float  # median over ranks (a synchronous job's ranks agree)
    tokens: float  # summed over ranks, scaled up for ranks whose report was lost
    ranks: int

    @property
    def tokens_per_s(self) -> float:
        """The job's throughput in this step."""
        return self.tokens / self.step_time_s if self.step_time_s > 0 else 0.0


class JobState:
    """A job's ranks, finished steps, detectors and checkpoint history."""

    def __init__(self, job_id: str, config: JobsConfig, now: float, now_unix: float) -> None:
        """A job first heard of at ``now`` (monotonic) / ``now_unix``."""
        self.job_id = job_id
        # Who reports it, from what the agents learned from the kernel ("Slurm job 1234",
        # "uid 1000", "pods of uid 1000"; "" while only agents too old to tell have reported).
        self.owner = ""
        self.uid: int | None = None
        self.first_seen = now
        self.first_seen_unix = now_unix
        self.last_seen = now
        self.world_size = 0
        self.params = 0.0
        self.flops_per_token = 0.0
        self.ranks: dict[int, RankState] = {}
        self.steps: deque[FinishedStep] = deque(maxlen=HISTORY)
        self.max_step = -1  # highest step ever finished: steps at or below it again are repeats
        self._floor = -1  # highest step finished in this run (since the last restart)
        self.restarts = 0
        self.productive_s = 0.0  # time of steps that moved the job forward (for ETTR)
        self.productive_tokens = 0.0
        self.checkpoints: deque[tuple[float, float]] = deque(maxlen=CHECKPOINTS)  # unix s
        self.stragglers = StragglerDetector(
            StragglerConfig(
                margin=config.straggler_margin,
                window_steps=config.straggler_window_steps,
                shift=config.straggler_shift,
            ),
        )
        self.drops = DropDetector(
            DropConfig(
                min_drop=config.min_drop,
                threshold=config.drop_threshold,
                warmup_steps=config.drop_warmup_steps,
            ),
        )
        self.has_compute_times = False
        self.finished = 0  # steps finished, ever (the clock a missing rank is told by)
        self.gone: frozenset[int] = frozenset()  # ranks whose GPU or node the fleet lost
        self._gathering: dict[int, _Gathering] = {}
        self._max_ranks = config.max_ranks
        # each rank's process as its node's agent last described it (collector/jobs/liveness.py)
        self.processes: dict[int, RankProcess] = {}
        self.checkpoint_after: int | None = None  # a rank writes a checkpoint after this step

    @property
    def expected_ranks(self) -> int:
        """How many ranks a step needs: the world size, or every rank seen so far."""
        return max(self.world_size, len(self.ranks))

    @property
    def gpus(self) -> int:
        """GPUs the job runs on (one per rank)."""
        return self.expected_ranks

    def missing(self) -> set[int]:
        """Ranks that stopped reporting while the job went on, or whose GPU or node is gone."""
        lagging = {
            r.rank
            for r in self.ranks.values()
            if self.finished - r.finished_at_report >= MISSING_STEPS
        }
        return lagging | (self.gone & self.ranks.keys())

    def nodes(self) -> set[str]:
        """The nodes the job's ranks run on."""
        return {r.node for r in self.ranks.values()}

    def holder_elsewhere(self, node: str, report: pb.JobStep, now: float, live_s: float) -> str:
        """The node that holds this report's rank if it may not move to ``node``, else "".

        A rank does not move nodes while its holder reported it within ``live_s``, unless the
        job restarted: a new world size, or a reporting process that started after the
        holder's last report (the agent takes the start from the kernel).
        """
        rank = self.ranks.get(report.rank)
        if rank is None or rank.node == node or now - rank.last_seen > live_s:
            return ""
        if report.world_size and self.world_size and report.world_size != self.world_size:
            return ""
        if rank.last_report_ms and report.sender_start_unix_ms > rank.last_report_ms:
            return ""
        return rank.node

    def beyond_world(self, report: pb.JobStep) -> bool:
        """The report names a rank the job's declared world size does not hold."""
        world = report.world_size or self.world_size
        return world > 0 and report.rank >= world

    def take(self, node: str, report: pb.JobStep, now: float) -> list[FinishedStep]:
        """Add one rank's step report; return the steps it finished (oldest first).

        A report with a smaller world size than before drops the ranks above it (the job
        restarted smaller); the caller refuses ranks beyond the world (:meth:`beyond_world`).
        """
        self.last_seen = now
        self._job_fields(report)
        rank = self.ranks.get(report.rank)
        if rank is None:
            if len(self.ranks) >= self._max_ranks:
                return []
            rank = self.ranks[report.rank] = RankState(report.rank, node, report.gpu_uuid)
        rank.node, rank.gpu_uuid = node, report.gpu_uuid or rank.gpu_uuid
        if report.step + RESTART_LAG < self._floor:
            self._restart()  # the job went back to a checkpoint
        rank.step, rank.step_time_s, rank.last_seen = report.step, report.step_time_s, now
        rank.last_report_ms = report.time_unix_ms
        rank.finished_at_report = self.finished
        compute = report.compute_time_s if report.HasField("compute_time_s") else None
        rank.compute_time_s = compute
        if report.step <= self._floor:
            return []  # a late report for a step already finished
        row = self._gathering.setdefault(report.step, _Gathering())
        row.step_times[report.rank] = report.step_time_s
        row.tokens += report.tokens
        if compute is not None:
            row.compute[report.rank] = compute
            self.has_compute_times = True
        return self._finish(now)

    def describe(self, node: str, processes: list[pb.RankProcess], now: float) -> None:
        """``node``'s agent describes rank processes of this job (only ranks it holds count).

        Of two processes of one rank in a report (the one that exited before a restart, and its
        successor), the one that is there counts.
        """
        latest: dict[int, pb.RankProcess] = {}
        for process in processes:
            held = self.ranks.get(process.rank)
            if held is None or held.node != node:
                continue
            seen = latest.get(process.rank)
            if seen is None or seen.state in GONE:
                latest[process.rank] = process
        for rank, process in latest.items():
            before = self.processes.get(rank)
            gone_since = None
            if process.state in GONE:
                was_gone = before is not None and before.gone_since is not None
                gone_since = before.gone_since if was_gone and before else now
            said_since = None
            if process.farewell:
                kept = before is not None and before.farewell == process.farewell
                said_since = before.said_since if kept and before else now
            self.processes[rank] = RankProcess(
                process.state,
                process.cpu_s,
                process.pid,
                now,
                gone_since,
                process.farewell,
                process.wchan,
                said_since,
            )

    def _job_fields(self, report: pb.JobStep) -> None:
        """What a report says of the whole job: its size, model, checkpoints."""
        if report.world_size:
            self._resize(report.world_size)
        if report.params:
            self.params = report.params
        if report.flops_per_token:
            self.flops_per_token = report.flops_per_token
        if report.checkpoint_end_unix_ms:
            self._checkpoint(report.checkpoint_start_unix_ms, report.checkpoint_end_unix_ms)
        if report.checkpointing:  # it holds until a later step than this one finishes
            self.checkpoint_after = max(self.checkpoint_after or 0, report.step)

    def _resize(self, world: int) -> None:
        """The job declares ``world`` ranks: a smaller world (a restart) drops the ranks above."""
        if world < self.world_size:
            for gone in [r for r in self.ranks if r >= world]:
                del self.ranks[gone]
                self.processes.pop(gone, None)
                self.stragglers.forget(gone)
        self.world_size = world

    def _checkpoint(self, start_ms: int, end_ms: int) -> None:
        mark = (start_ms / 1000, end_ms / 1000)
        if mark not in self.checkpoints:
            self.checkpoints.append(mark)

    def _restart(self) -> None:
        """Steps went back: forget what was gathered, keep the detectors' learned levels."""
        self.restarts += 1
        self._gathering.clear()
        self._floor = -1

    def _finish(self, now: float) -> list[FinishedStep]:
        expected = self.expected_ranks
        newest = max(self._gathering)
        done: list[FinishedStep] = []
        for step in sorted(self._gathering):
            row = self._gathering[step]
            complete = len(row.step_times) >= expected
            overtaken = newest - step >= FINISH_LAG or len(self._gathering) > MAX_PENDING
            if not (complete or overtaken):
                break  # steps finish in order
            del self._gathering[step]
            done.append(self._finished(step, row, now))
        return done

    def _finished(self, step: int, row: _Gathering, now: float) -> FinishedStep:
        missing = self.missing()
        # Lost reports of ranks that are there are scaled up; missing ranks add nothing.
        present = max(self.expected_ranks - len(missing), 1)
        reported = len(row.step_times)
        self.finished += 1
        finished = FinishedStep(
            step=step,
            at=now,
            step_time_s=statistics.median(row.step_times.values()),
            tokens=row.tokens * max(present, reported) / reported,
            ranks=reported,
        )
        self.steps.append(finished)
        self._floor = max(self._floor, step)
        if step > self.max_step:
            self.productive_s += finished.step_time_s
            self.productive_tokens += finished.tokens
            self.max_step = step
        self.stragglers.observe(step, row.compute or row.step_times)
        for rank in missing:
            self.stragglers.forget(rank)  # a rank that is not there straggles no more
        # The drop detector sees the median of the last few steps: a pause on any one rank
        # stretches a whole step, and in a big job some rank pauses nearly every step.
        count = min(SMOOTH_STEPS, len(self.steps))
        recent = [self.steps[-i].tokens_per_s for i in range(1, count + 1)]
        self.drops.observe(step, statistics.median(recent))
        return finished
