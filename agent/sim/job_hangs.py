"""How a simulated job whose ranks are processes hangs, fails and is ended by NCCL's watchdog.

A job built with ``processes=True`` (:class:`~agent.sim.training.SimTrainingJob`) runs each rank
as a real process (:mod:`agent.sim.rank_processes`), and a fault on a rank's GPU or node acts on
those processes the way it acts on a real job's, so that the agent and the collector see what
they would see on a real node:

- a rank fault of a scenario (``SimGpu.rank_fault``): ``stop`` sends SIGSTOP; ``exit`` makes the
  rank die of an exception; ``stuck`` makes it sleep before its next collective (its stack on
  its next batch, its Flight Recorder behind); ``desync`` makes it enter a broadcast where its
  peers enter the step's all-reduce;
- a GPU lost: the rank on it dies (its CUDA context is gone); a GPU whose driver is wedged
  (``nvml_hang``): its rank blocks in ``torch.cuda.synchronize`` and never enters the collective;
- an NVLink of a rank's GPU down (Xid 74): the collective stalls with every rank in it, the
  rank on that GPU too (nothing but the hardware tells it apart);
- a node crash: its ranks are gone at once;
- an IB port of one of its nodes down: every rank waits in the collective (nobody stands out)
  until the port is back, or until NCCL's timeout ends the job;
- a stalled filesystem (``job_stall``): every rank on the node's jobs waits outside any
  collective, in the same frame, for the stall's seconds, then the job steps again.

In every case but the stall and a port that comes back, the peers enter the step's all-reduce
and wait in it (their Flight Recorders say so), no rank steps, and after ``nccl_timeout_s`` the
watchdog ends the job: every rank process is killed and the job restarts as any crashed one does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from agent.sim.rank_processes import RankProcesses

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from agent.sim.devices import SimGpu
    from agent.sim.placement import Placement

log = structlog.get_logger("agent.sim.training")

END_WAIT_S = 2.0  # how long a rank told to end is waited for before it is killed


@dataclass(slots=True)
class Hang:
    """Why the job stopped stepping, since when, and until when (None: until the watchdog)."""

    why: str
    since: float
    until: float | None = None
    port: tuple[str, int] | None = None  # an IB port down that holds every rank (node, index)


class RankHangs:
    """A job's rank processes, and the hang or failure the faults under them make."""

    def __init__(self, job_id: str, nccl_timeout_s: float) -> None:
        """No process yet."""
        self.job_id = job_id
        self.nccl_timeout_s = nccl_timeout_s
        self.ranks = RankProcesses(job_id)
        self.hang: Hang | None = None
        self._on_gpu: dict[int, tuple[SimGpu, int]] = {}  # by rank: the GPU it holds, its pid

    # ---- the processes ---------------------------------------------------------------------

    def hold(self, placements: Sequence[Placement]) -> None:
        """Start every rank's process (unless one lives): a compute process on its GPU."""
        for p in placements:
            proc = self.ranks.start(p.rank, p.socket)
            gpu = p.node.gpus[p.gpu]
            held = self._on_gpu.get(p.rank)
            if held is not None and held[1] != proc.pid:
                self._leave(p.rank)
            if proc.pid not in gpu.processes:
                gpu.processes.append(proc.pid)
            self._on_gpu[p.rank] = (gpu, proc.pid)

    def _leave(self, rank: int) -> None:
        gpu, pid = self._on_gpu.pop(rank, (None, 0))
        if gpu is not None and pid in gpu.processes:
            gpu.processes.remove(pid)

    def release(self, *, ending: bool = False) -> None:
        """Every process ends: told to end normally if ``ending`` and none hangs, else killed."""
        if ending and self.hang is None:
            for proc in self.ranks.procs.values():
                proc.tell(op="end")
            deadline = time.monotonic() + END_WAIT_S
            for proc in self.ranks.procs.values():
                proc.wait(max(deadline - time.monotonic(), 0.0))
        self.ranks.kill_all()
        for rank in list(self._on_gpu):
            self._leave(rank)
        self.hang = None

    def report(self, rank: int, report: dict[str, object]) -> bool:
        """Have the rank send its step report; False if it could not be told."""
        proc = self.ranks.procs.get(rank)
        return proc is not None and proc.tell(op="step", report=report)

    def _reap(self) -> None:
        """Ranks whose processes exited leave their GPUs."""
        for rank, proc in list(self.ranks.procs.items()):
            if not proc.alive:
                self._leave(rank)
        self.ranks.reap()

    # ---- hangs -----------------------------------------------------------------------------

    def check(
        self,
        placements: Sequence[Placement],
        step: int,
        now: float,
        node_up: Callable[[str], bool],
        ports_down_since: dict[tuple[str, int], float],
    ) -> str | None:
        """None while the job may step; "" while it is held; why, once NCCL's watchdog ends it.

        ``step`` is the step the job would run next; ``ports_down_since`` when each of its
        nodes' IB ports went down (kept by the job).
        """
        self._reap()
        if self.hang is None:
            self.hang = self._new_hang(placements, step, now, node_up, ports_down_since)
            if self.hang is not None:
                log.info("sim_job_hangs", job=self.job_id, why=self.hang.why, step=step)
        hang = self.hang
        if hang is None:
            return None
        if hang.until is not None:
            if now < hang.until:
                return ""
            self.ranks.unstand()
            self.hang = None
            log.info("sim_job_resumes", job=self.job_id, after=hang.why)
            return None
        if hang.port is not None and hang.port not in ports_down_since:
            self.hang = None  # the port is back before the watchdog fired: the collective ends
            return None
        if now - hang.since >= self.nccl_timeout_s:
            return f"{hang.why}; NCCL's watchdog ended the job after {self.nccl_timeout_s:g} s"
        return ""

    def _new_hang(
        self,
        placements: Sequence[Placement],
        step: int,
        now: float,
        node_up: Callable[[str], bool],
        ports_down_since: dict[tuple[str, int], float],
    ) -> Hang | None:
        """The hang a fault under the job starts now, played on its processes (None: none)."""
        culprits: dict[int, str] = {}  # rank -> what it does instead of entering the collective
        whys: list[str] = []
        for p in placements:
            found = _fault_under(p, node_up)
            if found is not None:
                culprits[p.rank], why = found
                whys.append(why)
        if culprits:
            self._play(placements, culprits, step)
            return Hang("; ".join(dict.fromkeys(whys)), now)
        stalled = [p for p in placements if p.node.stall_until > now]
        if stalled:
            for p in placements:
                self.ranks.stand(p.rank, "stall", p.node.stacks)
            until = max(p.node.stall_until for p in stalled)
            return Hang(f"{stalled[0].node.name} filesystem stalled", now, until=until)
        nodes = {p.node.name for p in placements}
        down = sorted((since, key) for key, since in ports_down_since.items() if key[0] in nodes)
        if down:
            since, (node, index) = down[0]
            self._play(placements, {}, step)
            return Hang(f"{node} IB port mlx5_{index}/1 down", since, port=(node, index))
        return None

    def _play(self, placements: Sequence[Placement], culprits: dict[int, str], step: int) -> None:
        """The culprits do what they do; every other rank enters the step's all-reduce."""
        seq = step + 1  # the next step's all-reduce (a rank records step s's as s + 1)
        for p in placements:
            proc = self.ranks.procs.get(p.rank)
            if proc is None:
                continue
            what = culprits.get(p.rank)
            stacks = p.node.stacks
            if what is None or what == "in_collective":
                proc.tell(op="enter", collective="all_reduce", seq=seq)
            elif what == "stop":
                proc.stop()
            elif what == "gone":
                proc.kill()
            elif what in {"exit", "lost"}:
                error = "CUDA error: unspecified launch failure" if what == "lost" else ""
                proc.tell(op="raise", error=error or "the rank's own failure")
            elif what == "desync":
                self.ranks.stand(p.rank, "desync", stacks)
                proc.tell(op="enter", collective="broadcast", seq=seq)
            else:  # stuck, wedged: it never enters the collective
                self.ranks.stand(p.rank, "stuck" if what == "stuck" else "wedged", stacks)
                proc.tell(op="sleep")


def _fault_under(p: Placement, node_up: Callable[[str], bool]) -> tuple[str, str] | None:
    """What the fault under a rank makes it do, and why (None: nothing is wrong under it).

    A scenario's rank fault is played once: it is taken off the GPU here.
    """
    gpu = p.node.gpus[p.gpu]
    where = f"{p.node.name} GPU {p.gpu}"
    if not node_up(p.node.name):
        return "gone", f"{p.node.name} crashed"
    if gpu.lost:
        return "lost", f"{where} lost"
    if gpu.rank_fault:
        what, gpu.rank_fault = gpu.rank_fault, ""
        return what, f"rank {p.rank} on {where}: {what}"
    if gpu.wedged:
        return "wedged", f"{where} wedged"
    if not all(gpu.nvlink_up):
        return "in_collective", f"{where} NVLink down"  # the transfers over the link stall
    return None
