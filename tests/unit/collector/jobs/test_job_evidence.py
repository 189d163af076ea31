"""A hung job's evidence: asked of its nodes' agents once per hang, read, and made its culprits
(collector/jobs/evidence.py, the judge in liveness.py, the book, the metric)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from prometheus_client.registry import CollectorRegistry

from collector.export.jobs import JobsCollector
from collector.jobs.evidence import EvidenceGatherer, read_answer
from collector.testing import JobWorld, job_world
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Callable

SITE = "/usr/lib/python3/dist-packages/torch/distributed"
ALL_REDUCE = [
    pb.StackFrame(function="all_reduce", file=f"{SITE}/distributed_c10d.py", line=3252),
    pb.StackFrame(function="wrapper", file=f"{SITE}/c10d_logger.py", line=83),
    pb.StackFrame(function="all_reduce_gradients", file="/opt/torch_job.py", line=85),
    pb.StackFrame(function="train", file="/opt/torch_job.py", line=131),
]
SLEEPING = [
    pb.StackFrame(function="train", file="/opt/torch_job.py", line=126),
    pb.StackFrame(function="main", file="/opt/torch_job.py", line=170),
]
IN_ALL_REDUCE = "all_reduce (distributed_c10d.py:3252)"


def dump(rank: int, frames: list[pb.StackFrame], job: str = "j", **fields: Any) -> pb.RankDump:
    """A rank's dump as the agent sends it: a pin-memory thread, then the main thread."""
    threads = [
        pb.ThreadStack(name="pin_memory", thread_id=2, active=False, frames=SLEEPING[1:]),
        pb.ThreadStack(name="MainThread", thread_id=1, active=False, frames=frames),
    ]
    values: dict[str, Any] = {
        "job_id": job,
        "rank": rank,
        "pid": 100 + rank,
        "state": "S",
        "wchan": "futex_wait_queue",
        "threads": threads,
        "took_s": 0.25,
    }
    return pb.RankDump(**(values | fields))


class Agents:
    """The nodes' agents, answering DUMP_RANKS from what each rank is doing."""

    def __init__(self, w: JobWorld, frames: Callable[[int], list[pb.StackFrame]]) -> None:
        self.w = w
        self.frames = frames
        self.asked: list[tuple[str, str]] = []
        self.answers: dict[str, pb.CommandResult] = {}  # a node's answer, if not its dumps

    async def ask(self, node: str, job_id: str) -> pb.CommandResult | None:
        self.asked.append((node, job_id))
        await asyncio.sleep(0)
        if node in self.answers:
            return self.answers[node]
        ranks = [r for r in range(self.w.ranks) if self.w.place(r)[0] == node]
        return pb.CommandResult(ok=True, dumps=[dump(r, self.frames(r), job_id) for r in ranks])


def one_sleeps(rank: int) -> list[pb.StackFrame]:
    """Rank 6 sleeps before the all_reduce the others wait in."""
    return SLEEPING if rank == 6 else ALL_REDUCE


def describe(w: JobWorld, states: dict[int, str] | None = None) -> None:
    """Each agent describes its ranks' processes: all waiting in the same place."""
    by_node: dict[str, list[pb.RankProcess]] = {}
    for rank in range(w.ranks):
        state = (states or {}).get(rank, "sleeping")
        process = pb.RankProcess(
            job_id="j", rank=rank, state=state, pid=100 + rank, wchan="futex_wait_queue"
        )
        by_node.setdefault(w.place(rank)[0], []).append(process)
    for node, processes in by_node.items():
        w.book.ingest(node, pb.JobReport(processes=processes))


async def hang(w: JobWorld, seconds: int = 35, states: dict[int, str] | None = None) -> None:
    """No steps for ``seconds`` while the agents describe the processes; publish each second."""
    for _ in range(seconds):
        w.clock.advance(1.0)
        describe(w, states)
        w.book.publish()
        await asyncio.sleep(0)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def hung_world(
    frames: Callable[[int], list[pb.StackFrame]] = one_sleeps,
) -> tuple[JobWorld, Agents]:
    w = job_world()
    agents = Agents(w, frames)
    w.book.evidence.ask = agents.ask
    w.run(range(20))
    describe(w)
    return w, agents


class TestAskingOncePerHang:
    async def test_a_job_newly_hung_is_asked_about_once_on_each_of_its_nodes(self):
        w, agents = hung_world()
        await hang(w, 20)
        assert agents.asked == []  # not hung yet
        await hang(w, 20)
        await settle()
        assert sorted(agents.asked) == [(n, "j") for n in w.nodes]
        await hang(w, 20)
        assert len(agents.asked) == len(w.nodes)  # still the same hang

    async def test_a_job_that_ran_again_and_hangs_again_is_asked_again(self):
        w, agents = hung_world()
        await hang(w)
        await settle()
        w.run(range(20, 22))
        w.book.publish()
        describe(w)
        await hang(w)
        await settle()
        assert len(agents.asked) == 2 * len(w.nodes)

    async def test_nobody_is_asked_without_a_broker(self):
        w = job_world()
        w.run(range(20))
        describe(w)
        await hang(w)
        assert w.job()["state"] == "hung"
        assert w.book.evidence.found == {}
        assert await w.book.dump("j") == {}


class TestCulprits:
    async def test_the_rank_whose_stack_stands_out_is_the_culprit(self):
        """Every process waits on the same futex (the wait channels name nobody): rank 6's
        stack, sleeping before the all_reduce the 7 others wait in, names it."""
        w, _ = hung_world()
        await hang(w)
        await settle()
        job = w.job()
        assert job["state"] == "hung"
        assert job["culprits"] == [
            (
                f"rank 6 on node-d GPU 0: stack: waits in train (torch_job.py:126) while 7 ranks "
                f"wait in {IN_ALL_REDUCE}"
            )
        ]
        assert job["culprit_nodes"] == ["node-d"]
        assert "stacks: rank 6 waits in train (torch_job.py:126) while 7 ranks" in job["summary"]

    async def test_a_rank_named_by_its_process_is_told_with_its_stack(self):
        """Rank 6 is stopped (named first, as before) and its stack stands out too."""
        w, _ = hung_world()
        await hang(w, states={6: "stopped"})
        await settle()
        assert w.job()["culprits"] == [
            (
                f"rank 6 on node-d GPU 0: its process is stopped; stack: waits in train "
                f"(torch_job.py:126) while 7 ranks wait in {IN_ALL_REDUCE}"
            )
        ]

    async def test_every_rank_in_the_collective_names_nobody_and_says_so(self):
        w, _ = hung_world(lambda _r: ALL_REDUCE)
        await hang(w)
        await settle()
        job = w.job()
        assert job["culprits"] == []
        assert f"stacks: no rank stands out: every rank waits in {IN_ALL_REDUCE}" in job["summary"]

    async def test_evidence_of_an_earlier_hang_names_nobody_in_this_one(self):
        """The job ran again and hangs again; until this hang's evidence comes, the last one's
        stacks blame nobody."""
        w, agents = hung_world()
        await hang(w)
        await settle()
        w.run(range(20, 22))
        describe(w)
        agents.frames = lambda _r: ALL_REDUCE
        w.book.evidence.ask = None  # this hang's evidence never comes
        await hang(w)
        assert w.job()["culprits"] == []


class TestEvidence:
    async def test_the_evidence_holds_each_node_and_rank_and_the_groups(self):
        w, _ = hung_world()
        await hang(w)
        await settle()
        w.book.publish()
        evidence = w.book.evidence_of("j")
        assert evidence is not None
        assert [n["node"] for n in evidence["nodes"]] == list(w.nodes)
        assert {n["error"] for n in evidence["nodes"]} == {""}
        assert [(g["ranks"], g["count"], g["where"]) for g in evidence["groups"]] == [
            ([0, 1, 2, 3, 4, 5, 7], 7, IN_ALL_REDUCE),
            ([6], 1, "train (torch_job.py:126)"),
        ]
        assert (
            evidence["groups"][0]["signature"][0] == f"all_reduce@{SITE}/distributed_c10d.py:3252"
        )
        assert evidence["suspects"] == [
            {
                "rank": 6,
                "node": "node-d",
                "why": "stack: waits in train (torch_job.py:126) while 7 ranks wait in "
                f"{IN_ALL_REDUCE}",
            }
        ]
        rank6 = evidence["ranks"][6]
        assert (rank6["node"], rank6["pid"], rank6["state"], rank6["thread"]) == (
            "node-d",
            106,
            "S",
            "MainThread",
        )
        assert rank6["frames"] == [
            "train (/opt/torch_job.py:126)",
            "main (/opt/torch_job.py:170)",
        ]
        # asked as the job was judged hung; the fake clock moved on while the agents answered
        assert 0 < evidence["took_s"] <= 5.0
        assert w.clock.now() - 5.0 <= evidence["gathered_at"] <= w.clock.now()

    async def test_a_node_that_cannot_answer_leaves_its_ranks_unknown(self):
        w, agents = hung_world()
        agents.answers["node-d"] = pb.CommandResult(
            ok=False, detail="no answer from node-d in 15 s"
        )
        await hang(w)
        await settle()
        found = w.book.evidence.found["j"]
        assert [(n.node, n.error) for n in found.nodes][-1] == (
            "node-d",
            "no answer from node-d in 15 s",
        )
        assert found.stacks.unknown == (
            (6, "node-d: no answer from node-d in 15 s"),
            (7, "node-d: no answer from node-d in 15 s"),
        )
        assert found.stacks.suspects == ()  # every rank read waits in the all_reduce
        assert w.job()["culprits"] == []

    async def test_an_ask_that_raises_or_never_answers_is_that_nodes_error_only(self):
        w, agents = hung_world()

        async def broken(node: str, job_id: str) -> pb.CommandResult | None:
            if node == "node-a":
                msg = "stream closed"
                raise ConnectionResetError(msg)
            return await agents.ask(node, job_id)

        w.book.evidence.ask = broken
        await hang(w)
        await settle()
        found = w.book.evidence.found["j"]
        assert found.nodes[0].error == "ConnectionResetError: stream closed"
        assert [r for r, _ in found.stacks.suspects] == [6]

    async def test_on_demand_gathering_answers_the_evidence_and_joins_one_under_way(self):
        w, agents = hung_world()
        first, second = await asyncio.gather(w.book.dump("j"), w.book.dump("j"))
        assert first == second
        assert first is not None
        assert first["verdict"].startswith("rank 6 waits in train")
        assert len(agents.asked) == len(w.nodes)  # one gathering for both
        assert await w.book.dump("no-such-job") is None

    async def test_the_last_gathering_is_exported(self):
        w, _ = hung_world()
        await hang(w)
        await settle()
        w.book.publish()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(JobsCollector(w.book))
        took = registry.get_sample_value("fleetwatch_job_evidence_seconds", {"training_job": "j"})
        assert took == w.book.evidence.found["j"].took_s > 0


class TestReadingAnAnswer:
    def test_only_the_nodes_own_ranks_of_the_job_count_once(self):
        """node-a holds ranks 0 and 1: a dump of node-d's rank 6, of another job, or of rank
        0 again is ignored and counted."""
        w = job_world()
        w.run(range(3))
        result = pb.CommandResult(
            ok=True,
            dumps=[
                dump(0, ALL_REDUCE),
                dump(6, SLEEPING),
                dump(1, ALL_REDUCE, job="other"),
                dump(0, SLEEPING),
                dump(1, ALL_REDUCE),
            ],
        )
        error, taken = read_answer(w.book.jobs["j"], "node-a", result, limit=64)
        assert [(r.rank, r.frames[0].function) for r in taken] == [
            (0, "all_reduce"),
            (1, "all_reduce"),
        ]
        assert error == "3 dumps ignored (not ranks of the job that node-a holds)"

    def test_dumps_and_texts_are_bounded(self):
        w = job_world()
        w.run(range(3))
        frames = [pb.StackFrame(function="f" * 250, file="x.py", line=i) for i in range(64)]
        result = pb.CommandResult(ok=True, dumps=[dump(0, frames), dump(1, frames)])
        error, taken = read_answer(w.book.jobs["j"], "node-a", result, limit=1)
        assert error == "1 dumps ignored (not ranks of the job that node-a holds)"
        (rank,) = taken
        assert len(rank.frames) == 64
        assert len(rank.frames[0].function) == 200

    def test_an_answer_that_breaks_the_contract_is_the_nodes_error(self):
        w = job_world()
        w.run(range(3))
        frames = [pb.StackFrame(function="f", file="x.py", line=i) for i in range(200)]
        result = pb.CommandResult(ok=True, dumps=[dump(0, frames)])
        error, taken = read_answer(w.book.jobs["j"], "node-a", result, limit=64)
        assert taken == []
        assert error.startswith("its answer breaks the contract: job j rank 0 dump: thread")

    def test_a_dump_without_frames_says_so(self):
        w = job_world()
        w.run(range(3))
        result = pb.CommandResult(
            ok=True,
            dumps=[
                pb.RankDump(job_id="j", rank=0, pid=5, state="D", error="py-spy timed out"),
                pb.RankDump(job_id="j", rank=1, pid=6, state="S"),
            ],
        )
        _, taken = read_answer(w.book.jobs["j"], "node-a", result, limit=64)
        assert [(r.rank, r.error) for r in taken] == [
            (0, "py-spy timed out"),
            (1, "the dump holds no frames"),
        ]

    def test_a_refusal_is_the_nodes_error(self):
        w = job_world()
        w.run(range(3))
        refused = pb.CommandResult(ok=False, detail="command kind 3 is not supported by this agent")
        assert read_answer(w.book.jobs["j"], "node-a", refused, limit=64) == (
            "command kind 3 is not supported by this agent",
            [],
        )
        assert read_answer(w.book.jobs["j"], "node-a", None, limit=64) == ("no answer", [])


async def test_stopping_cuts_a_gathering_short():
    w = job_world()
    w.run(range(3))
    never = asyncio.Event()

    async def ask(_node: str, _job: str) -> pb.CommandResult | None:
        await never.wait()
        return None

    gatherer = EvidenceGatherer(w.clock, ranks_per_node=64)
    gatherer.ask = ask
    waiting = asyncio.ensure_future(gatherer.gather(w.book.jobs["j"]))
    await settle()
    await gatherer.stop()
    await settle()
    assert waiting.cancelled() or waiting.done()
    assert gatherer.found == {}


def recorded(rank: int, behind: int = -1) -> list[pb.CollectiveGroup]:
    """Rank ``behind`` entered all_reduce #40 last; the others #41 (the default group)."""
    last = 40 if rank == behind else 41
    recent = [pb.Collective(seq=s, op="all_reduce", state="scheduled") for s in (last - 1, last)]
    return [
        pb.CollectiveGroup(
            id="0",
            name="default_pg",
            last_enqueued=last,
            last_started=-1,
            last_completed=last - 1,
            recent=recent,
        )
    ]


class WithRecorders(Agents):
    """Agents whose ranks serve their Flight Recorder; rank ``behind`` never entered #41."""

    def __init__(self, w: JobWorld, frames: Callable[[int], list[pb.StackFrame]], behind: int):
        super().__init__(w, frames)
        self.behind = behind

    async def ask(self, node: str, job_id: str) -> pb.CommandResult | None:
        result = await super().ask(node, job_id)
        assert result is not None
        for one in result.dumps:
            one.collectives.extend(recorded(one.rank, self.behind))
        return result


class TestFlightRecorder:
    async def test_a_rank_behind_in_its_collectives_is_the_culprit_when_stacks_name_nobody(self):
        w = job_world()
        w.book.evidence.ask = WithRecorders(w, lambda _r: ALL_REDUCE, behind=3).ask
        w.run(range(20))
        describe(w)
        await hang(w)
        await settle()
        job = w.job()
        said = (
            "flight recorder: never entered all_reduce #41 of default_pg that 7 ranks wait in "
            "(its last: all_reduce #40 of default_pg)"
        )
        assert job["culprits"] == [f"rank 3 on node-b GPU 1: {said}"], job["culprits"]
        evidence = w.book.evidence_of("j")
        assert evidence is not None
        assert evidence["flight_recorder"]["suspects"] == [{"rank": 3, "why": said}]
        assert evidence["flight_recorder"]["ranks"] == list(range(8))
        said_first = "flight recorder: rank 3 never entered all_reduce #41"
        assert evidence["verdict"].startswith(said_first)
        assert "; stacks: no rank stands out" in evidence["verdict"]
        ranks = {r["rank"]: r for r in evidence["ranks"]}
        assert ranks[3]["collectives"][0]["recent"] == ["all_reduce #39", "all_reduce #40"]

    async def test_a_rank_both_name_is_told_with_both_reasons(self):
        w = job_world()
        w.book.evidence.ask = WithRecorders(w, one_sleeps, behind=6).ask
        w.run(range(20))
        describe(w)
        await hang(w)
        await settle()
        (culprit,) = w.job()["culprits"]
        assert culprit.startswith("rank 6 on node-d GPU 0: flight recorder: never entered")
        assert "; stack: waits in train (torch_job.py:126)" in culprit

    def test_a_recorder_that_breaks_the_contract_is_the_nodes_error(self):
        w = job_world()
        w.run(range(3))
        bad = dump(0, ALL_REDUCE)
        bad.collectives.extend(recorded(0) * 2)  # the same group twice
        error, taken = read_answer(
            w.book.jobs["j"], "node-a", pb.CommandResult(ok=True, dumps=[bad]), 8
        )
        assert taken == []
        assert "process group '0' twice" in error
