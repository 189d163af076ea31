"""A simulated job's rank processes: started, told what to do, stopped, killed, reaped.

Each rank of a :class:`~agent.sim.training.SimTrainingJob` with ``processes=True`` is a real
process (:mod:`agent.sim.rank_process`) that the job tells what to do through its stdin, so
that the node's agent sees what it sees of a real rank: a pid of its own on the GPU (NVML lists
it), a state in ``/proc`` (running, sleeping, stopped, gone), its step reports and its Flight
Recorder on the job socket. What py-spy would read of its Python stack is simulated (the rank
runs no training code): the node's :class:`~agent.jobs.stacks.SimulatedDumper` is told the
frames a rank stands in once it stops taking steps (:data:`WAIT_FRAMES`).

Writing to a rank never blocks the caller (a stopped rank does not read): a line that does not
fit the pipe now is dropped, and a rank that is gone is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

import structlog

from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Mapping

    from agent.jobs.stacks import SimulatedDumper

log = structlog.get_logger("agent.sim.ranks")

REAP_S: Final = 2.0  # how long a killed rank is waited for
_SOURCE_ROOT: Final = str(Path(__file__).resolve().parents[2])  # where `agent` is importable


def _frames(*frames: tuple[str, str, int]) -> tuple[pb.ThreadStack, ...]:
    """One main thread, innermost frame first, over the training step."""
    stack = [pb.StackFrame(function=f, file=path, line=line) for f, path, line in frames]
    stack += [
        pb.StackFrame(function="train_step", file="train.py", line=88),
        pb.StackFrame(function="<module>", file="train.py", line=120),
    ]
    return (pb.ThreadStack(name="MainThread", thread_id=1, frames=stack),)


# Where a rank's Python stack stands when it waits (what py-spy would show); the ranks that wait
# in the step's all-reduce keep the dumper's default (agent.jobs.stacks.simulated_stack).
WAIT_FRAMES: Final[Mapping[str, tuple[pb.ThreadStack, ...]]] = {
    # a rank that never reaches its collective: blocked on its next batch
    "stuck": _frames(("_next_data", "torch/utils/data/dataloader.py", 1328)),
    # a rank in another collective than its peers
    "desync": _frames(("broadcast", "torch/distributed/distributed_c10d.py", 2595)),
    # a rank whose GPU is wedged: its last kernel never finishes
    "wedged": _frames(("synchronize", "torch/cuda/__init__.py", 954)),
    # every rank of a job stalled outside any collective: reading from a stalled filesystem
    "stall": _frames(
        ("read", "fsspec/implementations/local.py", 353),
        ("_next_data", "torch/utils/data/dataloader.py", 1328),
    ),
}


class RankProcess:
    """One rank's process, reporting to ``socket`` for ``job``."""

    def __init__(self, socket: Path, job: str, rank: int) -> None:
        """Start it (it reports only when told a step)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_SOURCE_ROOT, env.get("PYTHONPATH", "")) if p
        )
        env.pop("FLEETWATCH_JOB_SOCKET", None)
        self.rank = rank
        self._proc = subprocess.Popen(  # noqa: S603 - our own module, argument list
            # -P: never modules from the working directory (a stray agent.py there shadows ours)
            [sys.executable, "-P", "-m", "agent.sim.rank_process", str(socket), job, str(rank)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a terminal's ^C reaches the demo, which ends its ranks
        )
        assert self._proc.stdin is not None  # noqa: S101 - a pipe we asked for
        os.set_blocking(self._proc.stdin.fileno(), False)
        self.stopped = False

    @property
    def pid(self) -> int:
        """The process's pid."""
        return self._proc.pid

    @property
    def alive(self) -> bool:
        """True until the process has exited (and is reaped here)."""
        return self._proc.poll() is None

    def tell(self, **msg: object) -> bool:
        """Send one instruction; False if it could not go now (full pipe, process gone)."""
        stdin = self._proc.stdin
        if stdin is None or not self.alive:
            return False
        data = (json.dumps(msg) + "\n").encode()
        try:
            written = os.write(stdin.fileno(), data)
        except (BlockingIOError, BrokenPipeError, OSError):
            return False
        return written == len(data)

    def stop(self) -> None:
        """SIGSTOP: the process stays, stopped (``T`` in ``/proc``)."""
        if self.alive:
            os.kill(self.pid, signal.SIGSTOP)
            self.stopped = True

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to exit; True if it did."""
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL, and reap it (a stopped process dies of SIGKILL too)."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(REAP_S)
        self.close()

    def close(self) -> None:
        """Close the pipe to it (once it is gone, or being killed)."""
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()


class RankProcesses:
    """The processes of a job's ranks, by rank, and the frames their stacks stand in."""

    def __init__(self, job: str) -> None:
        """No process yet."""
        self.job = job
        self.procs: dict[int, RankProcess] = {}
        self._stacks: dict[int, SimulatedDumper] = {}  # by pid: whose dumper holds its frames

    def start(self, rank: int, socket: Path) -> RankProcess:
        """The rank's process, started now unless one lives."""
        proc = self.procs.get(rank)
        if proc is None or not proc.alive:
            proc = RankProcess(socket, self.job, rank)
            self.procs[rank] = proc
        return proc

    def stand(self, rank: int, where: str, stacks: SimulatedDumper) -> None:
        """The rank's stack now stands in ``WAIT_FRAMES[where]`` (what py-spy would show)."""
        proc = self.procs.get(rank)
        if proc is not None:
            stacks.stacks[proc.pid] = WAIT_FRAMES[where]
            self._stacks[proc.pid] = stacks

    def unstand(self) -> None:
        """Every rank back in the default frames (it steps again, or it is gone)."""
        for pid, stacks in self._stacks.items():
            stacks.stacks.pop(pid, None)
        self._stacks.clear()

    def kill_all(self) -> None:
        """Kill and reap every process."""
        for proc in self.procs.values():
            proc.kill()
        self.procs.clear()
        self.unstand()

    def reap(self) -> None:
        """Forget processes that exited (reaped by ``alive``, so none stays a zombie)."""
        for rank in [r for r, p in self.procs.items() if not p.alive]:
            self.procs.pop(rank).close()
