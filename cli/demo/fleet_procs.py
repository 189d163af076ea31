"""The demo's simulated fleet, run in processes of its own (:mod:`cli.demo.fleet_process`).

The collector keeps the demo's process to itself; the nodes, their agents and the training jobs
are shared out over child processes, up to one per CPU and about ``NODES_PER_PROCESS`` nodes
each. Faults go to the process that holds their node. A big fleet polls less often (see
:func:`demo_intervals`): on a 2-core laptop, 256 agents polling twice a second leave no time for
the collector, and none of them for each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from pathlib import Path

    from agent.sim.scenario import Fault

NODES_PER_PROCESS: Final = 64
# A demo of up to this many nodes polls at the demo's own intervals; a bigger one stretches them
# in proportion (256 nodes: 4x, a poll every 2 s and a heartbeat every 4 s).
FULL_RATE_NODES: Final = 64
READY_TIMEOUT_S: Final = 600.0  # building 256 nodes' sysfs trees takes a while on a laptop
ANSWER_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 60.0


class FleetProcessError(RuntimeError):
    """A fleet process did not start, answer or stop as it should; the message says which."""


def demo_intervals(nodes: int, poll_s: float, heartbeat_s: float) -> tuple[float, float]:
    """(poll, heartbeat) intervals for a demo of ``nodes``: stretched past FULL_RATE_NODES."""
    stretch = max(1.0, nodes / FULL_RATE_NODES)
    return poll_s * stretch, heartbeat_s * stretch


def groups_for(
    names: list[str], cpus: int | None = None, per_process: int = NODES_PER_PROCESS
) -> list[list[str]]:
    """The nodes shared out over the processes, in order (the first holds the first nodes).

    About ``per_process`` nodes each, and no more processes than CPUs.
    """
    cpus = cpus or os.cpu_count() or 1
    count = max(1, min(cpus, math.ceil(len(names) / per_process)))
    size = math.ceil(len(names) / count)
    return [names[i : i + size] for i in range(0, len(names), size)]


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """How every fleet process runs its nodes and job."""

    collector: str
    root: Path
    sockets: Path
    poll_interval: float
    heartbeat_interval: float
    job: str  # the first process's job id; the others' get "-2", "-3", ...
    checkpoint_every: int
    nccl_timeout_s: float
    restart_after_s: float
    # A process's job runs each rank as a process of its own (which the scenario's rank hangs
    # act on) when it has at most this many ranks; a bigger one reports from the fleet process.
    rank_processes: int = 64
    # Pre-flight: the simulator's runners, faults planted before the agents start, and a job
    # that waits for start_job (every node in one process: the runners meet in one fabric).
    preflight: bool = False
    plant: tuple[Fault, ...] = ()


@dataclass(slots=True)
class _Child:
    nodes: list[str]
    job: str
    process: asyncio.subprocess.Process

    async def ask(
        self, request: dict[str, Any], wait_s: float = ANSWER_TIMEOUT_S
    ) -> dict[str, Any]:
        stdin, stdout = self.process.stdin, self.process.stdout
        if stdin is None or stdout is None:
            msg = "a fleet process has no pipe"
            raise FleetProcessError(msg)
        stdin.write((json.dumps(request) + "\n").encode())
        await stdin.drain()
        return await self.read(wait_s)

    async def read(self, wait_s: float) -> dict[str, Any]:
        stdout = self.process.stdout
        if stdout is None:
            msg = "a fleet process has no pipe"
            raise FleetProcessError(msg)
        try:
            line = await asyncio.wait_for(stdout.readline(), wait_s)
        except TimeoutError:
            msg = f"the fleet process of {self.nodes[0]}.. did not answer in {wait_s:g} s"
            raise FleetProcessError(msg) from None
        if not line:
            code = await self.process.wait()
            msg = f"the fleet process of {self.nodes[0]}.. ended (exit status {code})"
            raise FleetProcessError(msg)
        answer: dict[str, Any] = json.loads(line)
        return answer


class FleetProcesses:
    """The child processes that hold the demo's simulated nodes."""

    def __init__(
        self,
        names: list[str],
        spec: FleetSpec,
        *,
        cpus: int | None = None,
        per_process: int = NODES_PER_PROCESS,
    ) -> None:
        """Nothing runs until :meth:`start`."""
        self.groups = (
            groups_for(names, 1, len(names))
            if spec.preflight
            else groups_for(names, cpus, per_process)
        )
        self.spec = spec
        self.jobs = [spec.job if i == 0 else f"{spec.job}-{i + 1}" for i in range(len(self.groups))]
        self._children: list[_Child] = []
        self._owner: dict[str, _Child] = {}

    async def start(self) -> float:
        """Start every process; return once each runs its agents (seconds it took)."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        spec = self.spec
        for index, (nodes, job) in enumerate(zip(self.groups, self.jobs, strict=True)):
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-P",  # not the working directory's modules: a stray rules.py there shadows ours
                "-m",
                "cli.demo.fleet_process",
                "--collector",
                spec.collector,
                "--root",
                str(spec.root),
                "--sockets",
                str(spec.sockets),
                "--nodes",
                ",".join(nodes),
                "--poll-interval",
                str(spec.poll_interval),
                "--heartbeat-interval",
                str(spec.heartbeat_interval),
                "--job",
                job,
                "--checkpoint-every",
                str(spec.checkpoint_every),
                "--nccl-timeout",
                str(spec.nccl_timeout_s),
                "--restart-after",
                str(spec.restart_after_s),
                "--rank-processes",
                str(spec.rank_processes),
                "--seed",
                str(index + 1),
                "--plant",
                json.dumps(
                    [
                        {"node": f.node, "kind": f.kind.value, "params": f.params}
                        for f in spec.plant
                        if f.node in nodes
                    ]
                ),
                *(["--preflight"] if spec.preflight else []),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            child = _Child(nodes, job, process)
            self._children.append(child)
            self._owner.update(dict.fromkeys(nodes, child))
        for child in self._children:
            answer = await child.read(READY_TIMEOUT_S)
            if answer.get("op") != "ready":
                msg = f"the fleet process of {child.nodes[0]}.. said {answer} instead of ready"
                raise FleetProcessError(msg)
        return loop.time() - began

    async def inject(self, fault: Fault) -> None:
        """Make ``fault`` happen in the process that holds its node."""
        request = {
            "op": "inject",
            "node": fault.node,
            "kind": fault.kind.value,
            "params": fault.params,
        }
        answer = await self._owner[fault.node].ask(request)
        if answer.get("op") != "injected":
            msg = f"{fault.describe()}: {answer.get('error', answer)}"
            raise FleetProcessError(msg)

    async def start_job(self, skip: set[str]) -> int:
        """Start each process's job on its nodes but ``skip``; the nodes it runs on."""
        started = 0
        for child in self._children:
            answer = await child.ask({"op": "start_job", "skip": sorted(skip)})
            if answer.get("op") != "job_started":
                msg = f"the fleet process of {child.nodes[0]}.. said {answer} to start_job"
                raise FleetProcessError(msg)
            started += int(answer.get("nodes", 0))
        return started

    async def status(self) -> dict[str, int]:
        """Events waiting in the agents' outboxes, agents connected, nodes, summed."""
        total = {"unacked": 0, "connected": 0, "nodes": 0}
        for child in self._children:
            answer = await child.ask({"op": "status"})
            for key in total:
                total[key] += int(answer.get(key, 0))
        return total

    async def stop(self) -> None:
        """Ask every process to stop; kill one that does not in time."""
        for child in self._children:
            process = child.process
            if process.returncode is None and process.stdin is not None:
                with contextlib.suppress(ConnectionError, FleetProcessError):
                    await child.ask({"op": "quit"}, STOP_TIMEOUT_S)
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await process.wait()
