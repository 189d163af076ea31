"""A simulated multi-node training job that reports its steps through the real client.

Each rank runs on one GPU of a simulated node. A step's compute time on a rank follows its GPU:
a slowed GPU (``SimGpu.slowdown``) or throttled clocks make that rank slower, and every rank then
waits for the slowest in the collective. Communication time follows the fabric and NVLink: IB
congestion on the job's ports, or an NVLink down on any of its GPUs, stretches it for everyone.
A workload factor slows every rank alike (longer sequences, a heavier model stage): no hardware is
to blame. Reports go to each node's agent through :func:`fleetwatch.jobclient.report_step`, to
the job socket the agent listens on.

Like a real job it dies of the faults that kill one: a GPU of one of its ranks lost, one of its
nodes crashed (``node_up`` says which are), or an IB port of one of its nodes down for longer than
NCCL's timeout (``nccl_timeout_s``). It then reports nothing for ``restart_after_s`` (the
scheduler requeues it) and starts again from its last checkpoint, on the nodes healthy then (a
scheduler leaves out a node with a lost GPU, a crash, a port or an NVLink down), so the steps
since that checkpoint are done again: the collector counts the restart and ETTR falls. Ranks keep
their numbers and the world its size (what a restart in place does); the ranks of a node left
out do not report, so the collector shows them missing. While it
runs, every rank is a compute process on its GPU (NVML lists it), so a GPU reset waits until the
job is gone. Several jobs can share a fleet, each on some of every node's GPUs (``gpus``).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Final

import structlog

from agent.sim.job_hangs import RankHangs
from agent.sim.placement import Placement
from fleetwatch.jobclient import report_step

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

    from agent.sim.devices import SimGpu
    from agent.sim.hardware import SimNode
    from fleetwatch.clock import Clock

FULL_CLOCK_MHZ: Final = 1980
CONGESTION_SCALE: Final = 100_000.0  # xmit waits per second that double communication time
NVLINK_DOWN_FACTOR: Final = 1.6
NVLINK_ERRORS_FACTOR: Final = 1.4  # replays eat NVLink bandwidth while errors keep coming
NVLINK_ERRORS_LAST_S: Final = 10.0  # how long one burst of errors slows communication
PID_BASE: Final = 400_000  # the pids the ranks' compute processes have on their GPUs
DOWN_POLL_S: Final = 0.25  # how often a crashed job looks whether it may start again

log = structlog.get_logger("agent.sim.training")


class SimTrainingJob:
    """Ranks on simulated GPUs, stepping on the clock and reporting each step."""

    def __init__(  # noqa: PLR0913 - the job's shape and pace
        self,
        job_id: str,
        placements: list[Placement],
        clock: Clock,
        *,
        compute_s: float = 0.04,
        comm_s: float = 0.01,
        noise: float = 0.02,
        tokens_per_rank: int = 512,
        params: float = 7e9,
        checkpoint_every: int = 0,
        checkpoint_s: float = 0.5,
        seed: int = 1,
        node_up: Callable[[str], bool] | None = None,
        nccl_timeout_s: float = 30.0,
        restart_after_s: float = 10.0,
        hold_gpus: bool = True,
        processes: bool = False,
    ) -> None:
        """A job over ``placements``; step times are reported as simulated, not as slept.

        ``node_up`` tells a running node from a crashed one (None: nodes never crash);
        ``hold_gpus`` makes each rank a compute process on its GPU while the job runs;
        ``processes`` runs each rank as a process of its own, which the hang faults act on
        (:mod:`agent.sim.job_hangs`; the ranks then always hold their GPUs).
        """
        self.job_id = job_id
        self.allocation = list(placements)  # every GPU the job may run on
        self.placements = placements
        self.clock = clock
        self.node_up = node_up or (lambda _name: True)
        self.nccl_timeout_s = nccl_timeout_s
        self.restart_after_s = restart_after_s
        self.hold_gpus = hold_gpus
        self.crashes = 0
        self.last_crash = ""  # why the job died last
        self.down_until: float | None = None  # monotonic; None while it runs
        self.checkpoint_step = 0  # the step the last checkpoint resumes at
        self._ports_down_since: dict[tuple[str, int], float] = {}
        self._held: list[Placement] = []
        self._procs = RankHangs(job_id, nccl_timeout_s) if processes else None
        self.compute_s = compute_s
        self.comm_s = comm_s
        self.noise = noise
        self.tokens_per_rank = tokens_per_rank
        self.params = params
        self.checkpoint_every = checkpoint_every
        self.checkpoint_s = checkpoint_s
        self.workload = 1.0
        self.step = 0
        self.sent = 0
        self._random = random.Random(seed)  # noqa: S311 - noise, not secrets
        self._nvlink_errors = 0
        self._nvlink_slow_until = 0.0

    @classmethod
    def on_nodes(  # noqa: PLR0913 - the job's shape, and the job's own options
        cls,
        job_id: str,
        nodes: list[SimNode],
        sockets: dict[str, Path],
        clock: Clock,
        *,
        ranks_per_node: int = 8,
        gpus: Iterable[int] | None = None,
        **kwargs: object,
    ) -> SimTrainingJob:
        """One rank per GPU, in node order, on the GPUs ``gpus`` of each node.

        The first ``ranks_per_node`` GPUs when ``gpus`` is None; several jobs can share the
        nodes, each on some of their GPUs.
        """
        placements: list[Placement] = []
        for node in nodes:
            indices = range(min(ranks_per_node, len(node.gpus))) if gpus is None else gpus
            for gpu in indices:
                placements.append(Placement(len(placements), node, gpu, sockets[node.name]))
        return cls(job_id, placements, clock, **kwargs)  # type: ignore[arg-type]

    # ---- life and death ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the job steps (not crashed and waiting for its restart)."""
        return self.down_until is None

    def _node_healthy(self, node: SimNode, now: float) -> bool:
        """Whether a scheduler's health check lets a restarted job onto the node.

        Nothing that kills a job (a lost GPU, a crash, a port down past the NCCL timeout) and
        no NVLink down.
        """
        if self._node_fault(node, now):
            return False
        gpus = [node.gpus[p.gpu] for p in self.allocation if p.node is node]
        return all(all(g.nvlink_up) and not g.wedged for g in gpus)

    def _node_fault(self, node: SimNode, now: float) -> str:
        if not self.node_up(node.name):
            return f"{node.name} crashed"
        for index, gpu in enumerate(node.gpus):
            if gpu.lost and any(p.node is node and p.gpu == index for p in self.allocation):
                return f"{node.name} GPU {index} lost"
        self._track_ports(node, now)
        for index, port in enumerate(node.ib_ports):
            since = self._ports_down_since.get((node.name, index))
            if since is not None and now - since >= self.nccl_timeout_s:
                return f"{node.name} IB port {port.device}/{port.port} down past the NCCL timeout"
        return ""

    def _track_ports(self, node: SimNode, now: float) -> None:
        """Note when each of the node's IB ports went down (and forget the ones back up)."""
        for index, port in enumerate(node.ib_ports):
            key = (node.name, index)
            if port.state == "ACTIVE":
                self._ports_down_since.pop(key, None)
            else:
                self._ports_down_since.setdefault(key, now)

    def _fatal(self, now: float) -> str:
        """Why the running job dies now ("" while it may go on)."""
        for node in {id(p.node): p.node for p in self.placements}.values():
            if why := self._node_fault(node, now):
                return why
        return ""

    def _hold(self) -> None:
        """The ranks become compute processes on their GPUs (a reset of one waits)."""
        if self._procs is not None:
            self._procs.hold(self.placements)
            self._held = list(self.placements)
            return
        if not self.hold_gpus:
            return
        for p in self.placements:
            pids = p.node.gpus[p.gpu].processes
            pid = PID_BASE + p.rank
            if pid not in pids:
                pids.append(pid)
        self._held = list(self.placements)

    def _release(self, *, ending: bool = False) -> None:
        """The ranks' processes exit (the job died or stopped; ``ending``: it ends normally)."""
        if self._procs is not None:
            self._procs.release(ending=ending)
            self._held = []
            return
        for p in self._held:
            pids = p.node.gpus[p.gpu].processes
            if PID_BASE + p.rank in pids:
                pids.remove(PID_BASE + p.rank)
        self._held = []

    def _crash(self, why: str, now: float) -> None:
        self.crashes += 1
        self.last_crash = why
        self._release()
        self.down_until = now + self.restart_after_s
        log.info("sim_job_crashed", job=self.job_id, why=why, step=self.step)

    def _try_restart(self, now: float) -> bool:
        """Start again from the last checkpoint on the healthy nodes, once the delay is over."""
        if self.down_until is None or now < self.down_until:
            return self.down_until is None
        healthy = {id(p.node) for p in self.allocation if self._node_healthy(p.node, now)}
        placements = [p for p in self.allocation if id(p.node) in healthy]
        if not placements:
            self.down_until = now + self.restart_after_s  # nothing to run on: wait again
            return False
        self.placements = placements
        self.step = self.checkpoint_step
        self.down_until = None
        self._hold()
        log.info("sim_job_restarted", job=self.job_id, step=self.step, ranks=len(self.placements))
        return True

    def stop(self) -> None:
        """The job ends: its processes leave the GPUs."""
        self._release(ending=True)

    def _compute(self, gpu: SimGpu) -> float:
        clock = gpu.sm_clock_mhz or FULL_CLOCK_MHZ
        factor = gpu.slowdown * max(1.0, FULL_CLOCK_MHZ / clock) * self.workload
        return self.compute_s * factor * (1 + self._random.gauss(0, self.noise))

    def _comm(self) -> float:
        nodes = {p.node.name: p.node for p in self.placements}
        waits = max(
            (port.xmit_wait_per_s for n in nodes.values() for port in n.ib_ports),
            default=0.0,
        )
        factor = 1 + waits / CONGESTION_SCALE
        gpus = [p.node.gpus[p.gpu] for p in self.placements]
        if any(not all(g.nvlink_up) for g in gpus):
            factor *= NVLINK_DOWN_FACTOR
        errors = sum(sum(link) for g in gpus for link in g.nvlink_errors)
        now = self.clock.monotonic()
        if errors > self._nvlink_errors:
            self._nvlink_slow_until = now + NVLINK_ERRORS_LAST_S
        self._nvlink_errors = errors
        if now < self._nvlink_slow_until:
            factor *= NVLINK_ERRORS_FACTOR
        return self.comm_s * factor * (1 + self._random.gauss(0, self.noise))

    def _held_back(self, now: float) -> bool:
        """Whether no step runs now: a fault killed the job, or holds its ranks (processes)."""
        if self._procs is None:
            if why := self._fatal(now):
                self._crash(why, now)
                return True
            return False
        for node in {id(p.node): p.node for p in self.placements}.values():
            self._track_ports(node, now)
        verdict = self._procs.check(
            self.placements, self.step, now, self.node_up, self._ports_down_since
        )
        if verdict:
            self._crash(verdict, now)
        return verdict is not None

    def run_step(self) -> float:
        """Run (simulate) one step on every rank and report it; return the step time.

        A job that dies of a fault now reports nothing and returns 0; so does a job waiting for
        its restart, until it starts again.
        """
        mono = self.clock.monotonic()
        if not self._try_restart(mono):
            return 0.0
        if not self._held and (self.hold_gpus or self._procs is not None):
            self._hold()
        if self._held_back(mono):
            return 0.0
        live = [p for p in self.placements if not p.node.gpus[p.gpu].lost]
        computes = {p.rank: self._compute(p.node.gpus[p.gpu]) for p in live}
        step_time = max(computes.values(), default=0.0) + self._comm()
        checkpoint = None
        now = self.clock.now()
        if self.checkpoint_every and self.step and self.step % self.checkpoint_every == 0:
            checkpoint = (now - self.checkpoint_s, now)
            self.checkpoint_step = self.step
        world = len(self.allocation)
        for p in live:
            if self._procs is not None:
                report = self._report(p, step_time, computes[p.rank], checkpoint)
                self.sent += self._procs.report(p.rank, report)
                continue
            sent = report_step(
                self.job_id,
                p.rank,
                self.step,
                step_time,
                self.tokens_per_rank,
                compute_time=computes[p.rank],
                checkpoint=checkpoint,
                gpu=p.gpu,
                world_size=world,
                params=self.params,
                socket_path=str(p.socket),
            )
            self.sent += sent
        self.step += 1
        return step_time

    def _report(
        self,
        p: Placement,
        step_time: float,
        compute: float,
        checkpoint: tuple[float, float] | None,
    ) -> dict[str, object]:
        """The step report a rank process sends (report_step's arguments)."""
        return {
            "step": self.step,
            "step_time": step_time,
            "tokens": self.tokens_per_rank,
            "compute_time": compute,
            "checkpoint": list(checkpoint) if checkpoint else None,
            "gpu": p.gpu,
            "world_size": len(self.allocation),
            "params": self.params,
        }

    async def run(self, steps: int | None = None, *, pace: float = 1.0) -> None:
        """Step until cancelled (or ``steps`` done), sleeping each step's time times ``pace``.

        The ranks' processes leave their GPUs when it ends.
        """
        try:
            while steps is None or self.step < steps:
                step_time = self.run_step()
                await self.clock.sleep(step_time * pace if self.running else DOWN_POLL_S)
        finally:
            self._release(ending=True)
