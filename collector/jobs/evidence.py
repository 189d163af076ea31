"""A hung job's evidence: each rank's process and stack, asked of the agents of its nodes.

When the job book judges a job hung it hands it to :class:`EvidenceGatherer`, once per hang (a
job asked about is asked again only after it ran again and hung again), and on demand (``POST
/api/v1/jobs/<id>/dump``). The gatherer sends ``DUMP_RANKS`` to every node of the job at once,
through ``ask`` (the composition root's command broker: ``ask(node, job_id)`` answers the
agent's CommandResult, a failed one saying why, or None), and waits at most
``DUMP_TIMEOUT_S`` (plus a little) for each. What came back is read into :class:`Evidence`:
what each node answered and how long it took, each rank's state, wait channel and frames, and
the stacks grouped (:mod:`collector.jobs.stacks`), and where the ranks whose Flight Recorder
answered stand in their collectives (:mod:`collector.jobs.collectives`). The job's suspects are
both's: a rank out of step in its collectives first (with what its stack says), then the ranks
whose stack stands out.

An agent's answer is believed only as far as the wire contract and the job book vouch for it:
an answer that breaks the contract (:func:`~fleetwatch.wire.validate_jobs.validate_rank_dumps`)
is that node's error, and a dump counts only for a rank of the job that its node holds, once; at
most ``ranks_per_node`` dumps of a node and ``MAX_FRAMES`` frames of a thread are read, and every
text is cut to ``MAX_TEXT`` characters.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import structlog

from collector.jobs.collectives import Standing, localise_collectives
from collector.jobs.stacks import Frame, Localisation, RankStack, Thread, localise, pick_thread
from fleetwatch.wire.validate import WireError
from fleetwatch.wire.validate_jobs import validate_rank_dumps

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from collector.jobs.collectives import CollectiveVerdict
    from collector.jobs.state import JobState
    from fleetwatch.clock import Clock
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

    AskDump = Callable[[str, str], Awaitable[pb.CommandResult | None]]

log = structlog.get_logger("collector.jobs")

DUMP_TIMEOUT_S: Final = 15.0  # how long one node's agent has to dump its ranks
GUARD_S: Final = 5.0  # beyond it, a node's ask is cut short whatever the asker does
MAX_GATHERINGS: Final = 8  # jobs whose evidence is gathered at once; the rest wait
MAX_FRAMES: Final = 64  # innermost frames kept of a rank's thread
MAX_THREADS: Final = 256  # threads of a dump looked at
MAX_TEXT: Final = 200
SHOWN_FRAMES: Final = 8  # frames of each rank in the API
RECORDER_LABEL: Final = "flight recorder: "  # a verdict that heard the recorders starts so


@dataclass(frozen=True, slots=True)
class NodeAnswer:
    """What one node's agent answered: how many ranks, how long it took, what went wrong."""

    node: str
    took_s: float
    ranks: int
    error: str  # "" when it answered


@dataclass(frozen=True, slots=True)
class RankEvidence:
    """One rank's dump, as read."""

    rank: int
    node: str
    pid: int
    state: str
    wchan: str
    thread: str  # the thread whose frames say where it waits ("" none)
    frames: tuple[Frame, ...]  # that thread's, innermost first
    error: str
    took_s: float
    collectives: tuple[Standing, ...] = ()  # from its Flight Recorder, one per process group
    recorder_error: str = ""  # why there are none ("" when none were asked)


def merged(stacks: Localisation, recorders: CollectiveVerdict | None) -> Localisation:
    """The stacks' groups, with the suspects and verdict of the recorders first, then stacks'."""
    if recorders is None:
        return stacks
    said = dict(stacks.suspects)
    suspects = [
        (rank, f"{why}; {said[rank]}" if rank in said else why) for rank, why in recorders.suspects
    ]
    named = {rank for rank, _ in suspects}
    suspects += [(r, why) for r, why in stacks.suspects if r not in named]
    verdict = f"{RECORDER_LABEL}{recorders.verdict}; stacks: {stacks.verdict}"
    return Localisation(stacks.groups, stacks.unknown, tuple(suspects), verdict)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One gathering's result for a job."""

    job_id: str
    asked_at: float  # monotonic, when the agents were asked
    gathered_at: float  # Unix seconds, when the last answer came
    took_s: float
    nodes: tuple[NodeAnswer, ...]
    ranks: tuple[RankEvidence, ...]
    stacks: Localisation
    recorders: CollectiveVerdict | None  # None: no rank's Flight Recorder answered
    localisation: Localisation  # the stacks' groups, the suspects and verdict of both (merged)

    def to_json(self) -> dict[str, Any]:
        """The API's ``evidence`` of a job."""
        where = {r.rank: r.node for r in self.ranks}
        both = self.localisation
        return {
            "gathered_at": round(self.gathered_at, 3),
            "took_s": round(self.took_s, 3),
            "nodes": [
                {"node": n.node, "took_s": round(n.took_s, 3), "ranks": n.ranks, "error": n.error}
                for n in self.nodes
            ],
            "groups": [
                {
                    "signature": [f.key() for f in g.signature],
                    "where": g.where,
                    "collective": g.collective,
                    "ranks": list(g.ranks),
                    "count": len(g.ranks),
                }
                for g in self.stacks.groups
            ],
            "unknown": [{"rank": r, "why": why} for r, why in self.stacks.unknown],
            "suspects": [
                {"rank": r, "node": where.get(r, ""), "why": why} for r, why in both.suspects
            ],
            "verdict": both.verdict,
            "flight_recorder": None
            if self.recorders is None
            else {
                "verdict": self.recorders.verdict,
                "ranks": list(self.recorders.reporting),
                "suspects": [{"rank": r, "why": why} for r, why in self.recorders.suspects],
            },
            "ranks": [
                {
                    "rank": r.rank,
                    "node": r.node,
                    "pid": r.pid,
                    "state": r.state,
                    "wchan": r.wchan,
                    "thread": r.thread,
                    "frames": [
                        f"{f.function} ({f.file}:{f.line})" for f in r.frames[:SHOWN_FRAMES]
                    ],
                    "error": r.error,
                    "took_s": round(r.took_s, 3),
                    "collectives": [
                        {
                            "group": c.group,
                            "name": c.name,
                            "last_enqueued": c.enqueued,
                            "last_completed": c.completed,
                            "recent": [f"{op} #{seq}" for seq, op in c.recent],
                        }
                        for c in r.collectives
                    ],
                    "recorder_error": r.recorder_error,
                }
                for r in self.ranks
            ],
        }


def _text(value: str) -> str:
    return value[:MAX_TEXT]


def _thread(stack: pb.ThreadStack) -> Thread:
    frames = tuple(
        Frame(_text(f.function), _text(f.file), f.line) for f in stack.frames[:MAX_FRAMES]
    )
    return Thread(_text(stack.name), stack.active, frames)


def read_dump(node: str, dump: pb.RankDump) -> RankEvidence:
    """One rank's dump, bounded, with the thread that says where it waits."""
    chosen = pick_thread([_thread(t) for t in dump.threads[:MAX_THREADS]])
    error = _text(dump.error)
    if chosen is None and not error:
        error = "the dump holds no frames"
    return RankEvidence(
        rank=dump.rank,
        node=node,
        pid=dump.pid,
        state=_text(dump.state),
        wchan=_text(dump.wchan),
        thread=chosen.name if chosen is not None else "",
        frames=chosen.frames if chosen is not None else (),
        error=error,
        took_s=max(0.0, dump.took_s),
        collectives=tuple(
            Standing(
                group=_text(g.id),
                name=_text(g.name),
                enqueued=g.last_enqueued,
                completed=g.last_completed,
                recent=tuple((c.seq, _text(c.op)) for c in g.recent),
            )
            for g in dump.collectives
        ),
        recorder_error=_text(dump.recorder_error),
    )


def read_answer(
    job: JobState, node: str, result: pb.CommandResult | None, limit: int
) -> tuple[str, list[RankEvidence]]:
    """(the node's error or "", the dumps that count) of one node's answer."""
    if result is None:
        return "no answer", []
    if not result.ok:
        return _text(result.detail) or "the agent could not dump its ranks", []
    try:
        validate_rank_dumps(result)
    except WireError as exc:
        return _text(f"its answer breaks the contract: {exc}"), []
    taken: dict[int, RankEvidence] = {}
    ignored = 0
    for dump in result.dumps[:limit]:
        held = job.ranks.get(dump.rank)
        if dump.job_id != job.job_id or held is None or held.node != node or dump.rank in taken:
            ignored += 1
            continue
        taken[dump.rank] = read_dump(node, dump)
    ignored += max(0, len(result.dumps) - limit)
    error = f"{ignored} dumps ignored (not ranks of the job that {node} holds)" if ignored else ""
    return error, list(taken.values())


def stacks_of(
    job: JobState, ranks: Sequence[RankEvidence], nodes: Sequence[NodeAnswer]
) -> Localisation:
    """The stacks grouped: every rank of the job votes, those without a dump as unknown."""
    found = {r.rank: r for r in ranks}
    failed = {n.node: n.error for n in nodes if n.error and not n.ranks}
    stacks = []
    for rank, held in sorted(job.ranks.items()):
        dump = found.get(rank)
        if dump is not None:
            stacks.append(RankStack(rank, dump.frames, dump.error))
        else:
            why = failed.get(held.node) or f"{held.node} sent no dump of it"
            stacks.append(RankStack(rank, (), f"{held.node}: {why}"))
    return localise(stacks)


class EvidenceGatherer:
    """Asks the agents for a job's evidence: once per hang, and on demand; keeps the latest."""

    def __init__(self, clock: Clock, *, ranks_per_node: int) -> None:
        """Asks nothing until ``ask`` is set (the composition root sets the command broker's)."""
        self._clock = clock
        self._limit = ranks_per_node
        self.ask: AskDump | None = None
        self.found: dict[str, Evidence] = {}  # the latest evidence of each job, by id
        self.shown: dict[str, dict[str, Any]] = {}  # its JSON (never changed once made)
        self._asked: set[str] = set()  # jobs asked about in their current hang
        self._running: dict[str, asyncio.Task[Evidence]] = {}
        self._slots = asyncio.Semaphore(MAX_GATHERINGS)

    def judged(self, job: JobState, state: str) -> None:
        """The job book judged ``job`` (on the event loop): a job newly hung is asked about."""
        if state != "hung":
            self._asked.discard(job.job_id)
            return
        if self.ask is None or job.job_id in self._asked:
            return
        self._asked.add(job.job_id)
        if job.job_id not in self._running:
            self._start(job, self.ask)

    async def gather(self, job: JobState) -> Evidence | None:
        """Gather now (or join the gathering under way); None when nobody can be asked."""
        running = self._running.get(job.job_id)
        if running is None:
            if self.ask is None:
                return None
            running = self._start(job, self.ask)
        return await asyncio.shield(running)

    def forget(self, job_id: str) -> None:
        """The job book forgot the job."""
        self.found.pop(job_id, None)
        self.shown.pop(job_id, None)
        self._asked.discard(job_id)

    async def stop(self) -> None:
        """Cut short the gatherings under way (the collector is stopping)."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _start(self, job: JobState, ask: AskDump) -> asyncio.Task[Evidence]:
        task = asyncio.get_running_loop().create_task(
            self._gather(job, ask), name=f"job-evidence-{job.job_id[:40]}"
        )
        self._running[job.job_id] = task

        def done(finished: asyncio.Task[Evidence]) -> None:
            if self._running.get(job.job_id) is finished:
                del self._running[job.job_id]
            if not finished.cancelled() and finished.exception() is not None:
                log.error("job_evidence_failed", job=job.job_id, exc_info=finished.exception())

        task.add_done_callback(done)
        return task

    async def _gather(self, job: JobState, ask: AskDump) -> Evidence:
        async with self._slots:
            asked_at = self._clock.monotonic()
            nodes = sorted(job.nodes())
            replies = await asyncio.gather(*(self._ask(ask, job, node) for node in nodes))
        answers = tuple(answer for answer, _ in replies)
        ranks = tuple(sorted((r for _, taken in replies for r in taken), key=lambda r: r.rank))
        stacks = stacks_of(job, ranks, answers)
        recorders = localise_collectives({r.rank: r.collectives for r in ranks})
        evidence = Evidence(
            job_id=job.job_id,
            asked_at=asked_at,
            gathered_at=self._clock.now(),
            took_s=max(0.0, self._clock.monotonic() - asked_at),
            nodes=answers,
            ranks=ranks,
            stacks=stacks,
            recorders=recorders,
            localisation=merged(stacks, recorders),
        )
        self.found[job.job_id] = evidence
        self.shown[job.job_id] = evidence.to_json()
        log.info(
            "job_evidence_gathered",
            job=job.job_id,
            nodes=len(answers),
            ranks=len(ranks),
            took_s=round(evidence.took_s, 3),
            failed=[a.node for a in answers if a.error][:8],
            verdict=evidence.localisation.verdict,
        )
        return evidence

    async def _ask(
        self, ask: AskDump, job: JobState, node: str
    ) -> tuple[NodeAnswer, list[RankEvidence]]:
        started = self._clock.monotonic()
        result: pb.CommandResult | None = None
        error = ""
        try:
            async with asyncio.timeout(DUMP_TIMEOUT_S + GUARD_S):
                result = await ask(node, job.job_id)
        except TimeoutError:
            error = f"no answer in {DUMP_TIMEOUT_S + GUARD_S:g} s"
        except Exception as exc:  # one node's failure must not lose the others'
            log.warning("job_evidence_ask_failed", job=job.job_id, node=node, exc_info=exc)
            error = _text(f"{type(exc).__name__}: {exc}")
        took = max(0.0, self._clock.monotonic() - started)
        if error:
            return NodeAnswer(node, took, 0, error), []
        error, taken = read_answer(job, node, result, self._limit)
        if error:
            log.warning("job_evidence_node", job=job.job_id, node=node, error=error)
        return NodeAnswer(node, took, len(taken), error), taken
