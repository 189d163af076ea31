"""A simulated multi-node training job that reports its steps through the real client.

Each rank runs on one GPU of a simulated node. A step's compute time on a rank follows its GPU:
a slowed GPU (``SimGpu.slowdown``) or throttled clocks make that rank slower, and every rank then
waits for the slowest in the collective. Communication time follows the fabric and NVLink: IB
congestion on the job's ports, or an NVLink down on any of its GPUs, stretches it for everyone.
A workload factor slows every rank alike (longer sequences, a heavier model stage): no hardware is
to blame. Reports go to each node's agent through :func:`fleetwatch.jobclient.report_step`, to
the job socket the agent listens on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from fleetwatch.jobclient import report_step

if TYPE_CHECKING:
    from pathlib import Path

    from agent.sim.devices import SimGpu
    from agent.sim.hardware import SimNode
    from fleetwatch.clock import Clock

FULL_CLOCK_MHZ: Final = 1980
CONGESTION_SCALE: Final = 100_000.0  # xmit waits per second that double communication time
NVLINK_DOWN_FACTOR: Final = 1.6
NVLINK_ERRORS_FACTOR: Final = 1.4  # replays eat NVLink bandwidth while errors keep coming
NVLINK_ERRORS_LAST_S: Final = 10.0  # how long one burst of errors slows communication


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one rank runs, and where its node's agent listens."""

    rank: int
    node: SimNode
    gpu: int
    socket: Path


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
    ) -> None:
        """A job over ``placements``; step times are reported as simulated, not as slept."""
        self.job_id = job_id
        self.placements = placements
        self.clock = clock
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
    def on_nodes(
        cls,
        job_id: str,
        nodes: list[SimNode],
        sockets: dict[str, Path],
        clock: Clock,
        *,
        ranks_per_node: int = 8,
        **kwargs: float,
    ) -> SimTrainingJob:
        """One rank per GPU (the first ``ranks_per_node`` of each node), in node order."""
        placements: list[Placement] = []
        for node in nodes:
            for gpu in range(min(ranks_per_node, len(node.gpus))):
                placements.append(Placement(len(placements), node, gpu, sockets[node.name]))
        return cls(job_id, placements, clock, **kwargs)  # type: ignore[arg-type]

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

    def run_step(self) -> float:
        """Run (simulate) one step on every rank and report it; return the step time."""
        live = [p for p in self.placements if not p.node.gpus[p.gpu].lost]
        computes = {p.rank: self._compute(p.node.gpus[p.gpu]) for p in live}
        step_time = max(computes.values(), default=0.0) + self._comm()
        checkpoint = None
        now = self.clock.now()
        if self.checkpoint_every and self.step and self.step % self.checkpoint_every == 0:
            checkpoint = (now - self.checkpoint_s, now)
        world = len(self.placements)
        for p in live:
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

    async def run(self, steps: int | None = None, *, pace: float = 1.0) -> None:
        """Step until cancelled (or ``steps`` done), sleeping each step's time times ``pace``."""
        while steps is None or self.step < steps:
            step_time = self.run_step()
            await self.clock.sleep(step_time * pace)
