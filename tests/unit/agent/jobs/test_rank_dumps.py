"""A job's rank dumps: real rank processes on a real job socket, read in the real /proc."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from agent.jobs.flight_recorder import RecorderChannels
from agent.jobs.listener import JobQueue, serve_job_socket
from agent.jobs.peer_identity import PeerResolver
from agent.jobs.rank_dumps import MAX_ANSWER_BYTES, RankDumps, fit
from agent.jobs.rank_watch import RankWatch, status_uids
from agent.jobs.stacks import PySpyDumper, SimulatedDumper, StackResult, find_py_spy
from fleetwatch.wire.settings import MAX_MESSAGE_BYTES
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate_jobs import MAX_RANK_DUMPS, validate_rank_dumps
from tests.hung_rank import FUNCTION, drop_to, hung_rank
from tests.job_node import INVENTORY

OTHER_UID = 2001


def me() -> tuple[int, int]:
    """This process's pid and start."""
    return os.getpid(), PeerResolver(Path("/proc")).started(os.getpid())


def watching_me(*ranks: int, job: str = "j") -> RankWatch:
    watch = RankWatch(Path("/proc"))
    pid, start = me()
    for rank in ranks:
        watch.saw(job, rank, pid, start, os.getuid())
    return watch


def big_stack() -> list[pb.ThreadStack]:
    """64 threads of 64 frames with long names: some 2 MB, the worst a dump may hold."""
    frame = pb.StackFrame(function="f" * 256, file="/" + "d" * 255, line=1)
    return [
        pb.ThreadStack(name="MainThread" if n == 0 else f"t{n}", frames=[frame] * 64)
        for n in range(64)
    ]


@pytest.fixture
async def job_socket(tmp_path):
    """A real job socket and the queue (with its RankWatch) it feeds."""
    path = tmp_path / "jobs.sock"
    queue = JobQueue()
    transport = await serve_job_socket(path, 0o660, queue, lambda: INVENTORY)
    yield path, queue
    transport.close()


class TestRankDumps:
    async def test_a_hung_rank_read_by_the_real_py_spy(self, job_socket):
        """A real rank reported on the job socket and sleeps: its dump has its state letter,
        its wait channel (where the kernel shows it), and the function it sleeps in."""
        path, queue = job_socket
        async with hung_rank(path, "llama", 3, lambda: queue.received == 1) as proc:
            dumps = RankDumps(queue.ranks, PySpyDumper(find_py_spy()))
            deadline = time.monotonic() + 10
            while True:
                (dump,) = await dumps.dump("llama") or []
                if dump.threads and FUNCTION in {f.function for f in dump.threads[0].frames}:
                    break
                assert time.monotonic() < deadline, dump
                await asyncio.sleep(0.05)
            assert (dump.job_id, dump.rank, dump.pid, dump.error) == ("llama", 3, proc.pid, "")
            assert dump.state == "S"
            shown = Path(f"/proc/{proc.pid}/wchan").read_text().strip()
            assert dump.wchan == ("" if shown == "0" else shown)
            main = dump.threads[0]
            assert main.name == "MainThread"
            assert [f.function for f in main.frames[:2]] == [FUNCTION, "train_step"]
            assert main.frames[0].file == str(path.with_name("hung_rank.py"))
            assert 0 < dump.took_s < 5
            validate_rank_dumps(pb.CommandResult(ok=True, dumps=[dump]))

    async def test_a_rank_that_changed_user_is_not_read(self, job_socket):
        """A rank that reported as root and then became another user keeps its pid and start,
        not its uid: its stack is not read (as after exec'ing a set-user-ID program)."""
        path, queue = job_socket
        async with hung_rank(path, "llama", 0, lambda: queue.received == 1) as proc:
            await drop_to(proc, OTHER_UID)
            assert set(status_uids(Path(f"/proc/{proc.pid}/status").read_text())) == {OTHER_UID}
            dumper = SimulatedDumper()
            (dump,) = await RankDumps(queue.ranks, dumper).dump("llama") or []
        assert dumper.calls == []
        assert dump.pid == proc.pid
        assert dump.threads == []
        assert "no longer the one that reported" in dump.error

    async def test_a_job_with_no_rank_here_has_no_dumps(self):
        """Another job's ranks, or an exited one, are no dumps of this job."""
        watch = watching_me(0, job="other")
        assert await RankDumps(watch, SimulatedDumper()).dump("llama") is None

    async def test_a_process_of_several_ranks_is_read_once(self):
        """One process that reported ranks 0-2 (a simulator) is read once, one dump per rank."""
        dumper = SimulatedDumper()
        dumps = await RankDumps(watching_me(2, 0, 1), dumper).dump("j")
        assert dumps is not None
        assert [d.rank for d in dumps] == [0, 1, 2]
        assert dumper.calls == [os.getpid()]
        assert {len(d.threads) for d in dumps} == {1}

    async def test_at_most_64_ranks_lowest_first(self):
        """70 ranks watched: the answer holds the wire's 64, the lowest."""
        dumps = await RankDumps(watching_me(*range(70)), SimulatedDumper()).dump("j")
        assert dumps is not None
        assert [d.rank for d in dumps] == list(range(MAX_RANK_DUMPS))

    async def test_the_node_answers_within_its_bound(self):
        """A dumper slower than the node's bound: each rank not read in time says so."""
        dumper = SimulatedDumper(delay_s=2.0)
        start = time.monotonic()
        dumps = await RankDumps(watching_me(0), dumper, timeout_s=0.2).dump("j")
        assert time.monotonic() - start < 1.5
        assert dumps is not None
        assert [(d.error, list(d.threads)) for d in dumps] == [
            ("not read within the node's 0.2 s", [])
        ]
        assert dumps[0].took_s >= 0.2

    async def test_a_failing_dumper_is_an_error_not_an_exception(self):
        """A dumper that raises gives the rank an error; the command goes on."""

        def broken(pid: int) -> StackResult:
            raise RuntimeError(pid)

        (dump,) = await RankDumps(watching_me(0), broken).dump("j") or []
        assert dump.error == "the stack dumper failed: RuntimeError"
        assert dump.state in {"R", "S"}  # the state is still read

    async def test_without_a_dumper_state_and_wait_channel_only(self):
        """An agent that reads no stacks still answers each rank's state, saying why no stack."""
        (dump,) = await RankDumps(watching_me(0), None).dump("j") or []
        assert (dump.error, list(dump.threads)) == ("this agent reads no stacks", [])

    async def test_a_rank_of_unknown_uid_is_not_read(self):
        """A process watched without the uid it reported as cannot be told from a stranger."""
        watch = RankWatch(Path("/proc"))
        watch.saw("j", 0, *me())
        dumper = SimulatedDumper()
        (dump,) = await RankDumps(watch, dumper).dump("j") or []
        assert dumper.calls == []
        assert "no longer the one that reported" in dump.error

    async def test_the_answer_fits_one_stream_message(self):
        """64 ranks of the biggest stacks: each cut to its share, main thread first, and the
        answer passes the wire's check."""
        dumps = await RankDumps(watching_me(*range(64)), SimulatedDumper(default=big_stack())).dump(
            "j"
        )
        assert dumps is not None
        result = pb.CommandResult(ok=True, dumps=dumps)
        assert result.ByteSize() <= MAX_ANSWER_BYTES
        assert pb.AgentMessage(command_result=result).ByteSize() < MAX_MESSAGE_BYTES
        assert all(d.threads[0].name == "MainThread" and d.threads[0].frames for d in dumps)
        validate_rank_dumps(result)


class TestFit:
    def test_small_stacks_are_left_alone(self):
        """Stacks within the bound come back as they are, nothing cut."""
        threads = big_stack()[:1]
        assert fit(threads, 1 << 20) == (threads, False)

    def test_threads_go_first_then_outer_frames(self):
        """The last threads go first; when the main thread alone is too big, its innermost
        frames that fit stay."""
        threads = big_stack()
        kept, cut = fit(threads, pb.RankDump(threads=threads[:2]).ByteSize() + 10)
        assert cut
        assert [t.name for t in kept] == ["MainThread", "t1"]
        (main,), cut = fit(threads, 4096)
        assert cut
        assert main.name == "MainThread"
        assert 0 < len(main.frames) < 64
        assert main.frames[0] == threads[0].frames[0]
        assert pb.RankDump(threads=[main]).ByteSize() <= 4096

    def test_nothing_to_cut(self):
        """No threads (a dump that failed): nothing to cut."""
        assert fit([], 10) == ([], False)


class HugeRecorders(RecorderChannels):
    """Every rank answers the most process groups the wire allows, each with long names."""

    async def ask(self, _process: tuple[int, int]) -> tuple[list[pb.CollectiveGroup], str]:
        recent = [pb.Collective(seq=n, op="o" * 64, state="scheduled") for n in range(8)]
        return [
            pb.CollectiveGroup(id=str(n), name="n" * 256, last_enqueued=7, recent=recent)
            for n in range(64)
        ], ""


async def test_the_answer_with_recorders_still_fits_one_stream_message():
    """64 ranks of the biggest stacks and the biggest Flight Recorders: each rank's groups are cut
    to their bound (and say so), and the answer passes the wire's check."""
    dumps = await RankDumps(
        watching_me(*range(64)), SimulatedDumper(default=big_stack()), recorders=HugeRecorders()
    ).dump("j")
    assert dumps is not None
    result = pb.CommandResult(ok=True, dumps=dumps)
    assert pb.AgentMessage(command_result=result).ByteSize() < MAX_MESSAGE_BYTES
    assert all(0 < len(d.collectives) < 64 for d in dumps)
    assert dumps[0].recorder_error.endswith("process groups left out (over 4096 bytes)")
    validate_rank_dumps(result)
