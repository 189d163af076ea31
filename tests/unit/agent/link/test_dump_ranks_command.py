"""The collector's DUMP_RANKS command: real rank processes on a real job socket, the real py-spy."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.config import AgentConfig
from agent.jobs.listener import JobQueue
from agent.jobs.peer_identity import PeerResolver
from agent.jobs.rank_dumps import RankDumps
from agent.jobs.stacks import PySpyDumper, SimulatedDumper, StackResult, find_py_spy
from agent.link.commands import CommandRunner
from agent.main import build_agent
from agent.poll.sampler import Sampler
from agent.sim.cluster import sim_hardware
from agent.sim.hardware import SimNode
from agent.sources.nvml import NvmlSource
from agent.sources.sysfs import SysfsReader
from fleetwatch.testing import FakeClock
from fleetwatch.wire.settings import COMMAND_REFUSED
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.xid_catalog import load_catalog
from tests.hung_rank import FUNCTION, hung_rank
from tests.job_node import open_job_socket
from tests.rank_process import deliver, ranks, step_reports

VICTIM, ATTACKER = 2001, 2002


def dump_ranks(job_id: str) -> pb.Command:
    return pb.Command(command_id="d1", kind=pb.COMMAND_KIND_DUMP_RANKS, job_id=job_id)


@pytest.fixture
def sampler(tmp_path: Path) -> Sampler:
    node = SimNode("n", tmp_path / "sys", FakeClock(), gpus=1, nvlinks=1, ib_ports=1)
    sampler = Sampler(
        nvml=NvmlSource(node.nvml),
        sysfs=SysfsReader(node.sysfs.root),
        kmsg=None,
        udev=None,
        catalog=load_catalog(),
        clock=node.clock,
    )
    sampler.discover()
    return sampler


@pytest.fixture
async def job_socket():
    """A real job socket every uid can reach (mode 0666, as shipped), feeding a queue."""
    async with open_job_socket() as opened:
        yield opened


class Recording:
    """The real py-spy dumper, noting each pid it is asked to read."""

    def __init__(self) -> None:
        self.real = PySpyDumper(find_py_spy())
        self.pids: list[int] = []

    def __call__(self, pid: int) -> StackResult:
        self.pids.append(pid)
        return self.real(pid)


class TestDumpRanks:
    async def test_a_hung_rank_is_dumped_with_the_function_it_waits_in(self, sampler, job_socket):
        """A real Python rank reported a step and sleeps in wait_in_collective: the command's
        answer holds its dump, read by the real py-spy, the frame it sleeps in first."""
        path, queue = job_socket
        commands = CommandRunner(sampler, None, RankDumps(queue.ranks, PySpyDumper(find_py_spy())))
        async with hung_rank(path, "llama-7", 5, lambda: queue.received == 1) as proc:
            for _ in range(100):  # the rank may still be on its way into the sleep
                result = await commands.run(dump_ranks("llama-7"))
                threads = result.dumps[0].threads if result.dumps else []
                frames = [f.function for f in threads[0].frames] if threads else []
                if frames[:1] == [FUNCTION]:
                    break
                await asyncio.sleep(0.05)
        assert (result.command_id, result.ok, result.detail) == ("d1", True, "")
        (dump,) = result.dumps
        assert (dump.job_id, dump.rank, dump.pid, dump.error) == ("llama-7", 5, proc.pid, "")
        assert frames[:2] == [FUNCTION, "train_step"]
        assert [t.name for t in dump.threads] == ["MainThread", "watchdog"]

    async def test_only_processes_that_reported_the_job_are_ever_read(self, sampler, job_socket):
        """A hostile local user cannot make the agent read another user's process.

        The command names a job, never a process: the agent reads only the processes its job
        socket saw report that job. Who reported is the kernel's word (SO_PEERCRED, taken at
        connect), so a user can make the agent watch only its own processes; a report naming
        another user's job is refused (job_owned) and watches nothing; and a process is known
        by its pid and start, so a pid reused by someone else's process is not the one watched.
        Here uid 2002 reports its own job and tries to report uid 2001's: asking for 2001's job
        reads 2001's process alone, asking for 2002's reads 2002's alone, and a process that
        never reported (named by its pid as a job id, or not at all) is never read.
        """
        path, queue = job_socket
        recording = Recording()
        commands = CommandRunner(sampler, None, RankDumps(queue.ranks, recording))
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            with ranks(VICTIM, ATTACKER) as (victim, attacker):
                read = lambda: queue.received + sum(queue.refused.values())  # noqa: E731
                await deliver(victim, step_reports("victim-job", range(2), range(1), path), read)
                await deliver(attacker, step_reports("mine", range(1), range(1), path), read)
                await deliver(
                    attacker, step_reports("victim-job", range(2, 4), range(1), path), read
                )
                assert queue.refused == {"job_owned": 2}

                theirs = await commands.run(dump_ranks("victim-job"))
                assert recording.pids == [victim.pid]
                assert {(d.rank, d.pid) for d in theirs.dumps} == {(0, victim.pid), (1, victim.pid)}
                victim_frames = {f.function for t in theirs.dumps[0].threads for f in t.frames}
                assert "_serve" in victim_frames  # tests/rank_process.py, waiting for its parent

                recording.pids.clear()
                mine = await commands.run(dump_ranks("mine"))
                assert recording.pids == [attacker.pid]
                assert [(d.rank, d.pid) for d in mine.dumps] == [(0, attacker.pid)]

                recording.pids.clear()
                for job in (str(bystander.pid), "bystander"):
                    nobody = await commands.run(dump_ranks(job))
                    assert (nobody.ok, list(nobody.dumps)) == (False, [])
                    assert nobody.detail == f"no rank of job {job!r} reported on this node"
                assert recording.pids == []
        finally:
            bystander.kill()
            bystander.wait()

    @pytest.mark.parametrize(
        "job_id", ["", "../../etc", "a b", "-p", "x" * 129, "job;reboot", "job\n--locals"]
    )
    async def test_a_malformed_job_id_is_refused(self, sampler, job_id):
        """Refused for good before anything is read, counted and logged."""
        dumper = SimulatedDumper()
        watch = JobQueue().ranks
        watch.saw(job_id, 0, os.getpid(), PeerResolver(Path("/proc")).started(os.getpid()), 0)
        commands = CommandRunner(sampler, None, RankDumps(watch, dumper))
        with capture_logs() as logs:
            result = await commands.run(dump_ranks(job_id))
        assert (result.ok, result.retry_later, list(result.dumps)) == (False, False, [])
        assert result.detail.startswith(f"{COMMAND_REFUSED}job id ")
        assert commands.refused == {"malformed_job_id": 1}
        assert [e["reason"] for e in logs if e["event"] == "command_refused"] == [
            "malformed_job_id"
        ]
        assert dumper.calls == []

    async def test_an_agent_without_a_job_socket_watches_no_ranks(self, sampler):
        """With the job socket off there is nothing to dump: the answer says why."""
        result = await CommandRunner(sampler, None).run(dump_ranks("llama-7"))
        assert (result.ok, result.detail) == (
            False,
            "this agent watches no ranks (its job socket is off)",
        )

    async def test_a_dump_that_would_break_the_wire_is_not_sent(self, sampler):
        """The agent checks what it sends: 65 frames in a thread is a bug of ours, answered as
        a failure, not sent."""
        frames = [pb.StackFrame(function="f")] * 65
        dumper = SimulatedDumper(default=[pb.ThreadStack(name="MainThread", frames=frames)])
        watch = JobQueue().ranks
        watch.saw("j", 0, os.getpid(), PeerResolver(Path("/proc")).started(os.getpid()), 0)
        result = await CommandRunner(sampler, None, RankDumps(watch, dumper)).run(dump_ranks("j"))
        assert (result.ok, list(result.dumps)) == (False, [])
        assert "the dumps broke the wire contract" in result.detail
        assert "65 frames" in result.detail


async def test_the_agent_wires_the_job_sockets_ranks_to_its_commands(tmp_path):
    """An agent built with a job socket answers DUMP_RANKS from its own rank watch; the
    simulator's hardware reads simulated stacks."""
    clock = FakeClock()
    node = SimNode("node-a", tmp_path / "sys", clock, gpus=1, nvlinks=1, ib_ports=1)
    cfg = AgentConfig(node="node-a", state_dir=None, job_socket=tmp_path / "j.sock")
    hardware = sim_hardware(node)
    assert isinstance(hardware.stacks, SimulatedDumper)
    agent = build_agent(cfg, hardware, clock)
    assert agent.jobs is not None
    start = PeerResolver(Path("/proc")).started(os.getpid())
    agent.jobs.ranks.saw("sim-job", 2, os.getpid(), start, os.getuid())
    commands = agent.link._commands
    assert commands is not None
    result = await commands.run(dump_ranks("sim-job"))
    assert result.ok
    (dump,) = result.dumps
    assert [f.function for f in dump.threads[0].frames] == ["all_reduce", "train_step", "<module>"]
    no_socket = build_agent(dataclasses.replace(cfg, job_socket=None), hardware, clock)
    assert no_socket.link._commands is not None
    assert not (await no_socket.link._commands.run(dump_ranks("sim-job"))).ok
