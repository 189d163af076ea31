"""A simulated cluster: real agents (real source code, real gRPC) on simulated hardware."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import structlog

from agent.config import AgentConfig
from agent.main import Hardware, build_agent
from agent.preflight.runners import PreflightRunners
from agent.sim.bmc import SimRedfishService
from agent.sim.hardware import SimNode
from agent.sim.scenario import Fault, FaultKind, apply_fault
from agent.sources.bmc_redfish import RedfishBmc
from agent.sources.sysfs_io import FdBudget

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from agent.agent import Agent
    from agent.jobs.stacks import StackDumper
    from fleetwatch.clock import Clock

log = structlog.get_logger("agent.sim")


# What measures a simulated node's pre-flight checks (agent/sim/preflight.py builds the
# simulator's; tests may pass fixed-value runners): the node's name and hardware in, runners out.
RunnersFor: TypeAlias = "Callable[[str, SimNode], PreflightRunners]"


def sim_hardware(
    node: SimNode, preflight: PreflightRunners | None = None, stacks: StackDumper | None = None
) -> Hardware:
    """The sources of a simulated node, as the agent's composition root takes them.

    The BMC is the agent's own Redfish reader over the simulated BMC's documents; ``preflight``
    measures its pre-flight checks (None: no runners, those checks could not run). A rank's
    stacks are simulated too (the node's :class:`~agent.jobs.stacks.SimulatedDumper`: an
    all-reduce, or where a simulated job's hang left the rank), unless ``stacks`` reads them (the
    rank processes are real: py-spy can).
    """
    return Hardware(
        preflight=preflight or PreflightRunners(),
        nvml=node.nvml,
        sysfs_root=node.sysfs.root,
        kmsg=node.kmsg,
        udev=node.udev,
        boot_id=node.boot_id,
        gpu_reset=lambda gpu: node.reset_gpu(gpu.index),
        bmc=RedfishBmc(SimRedfishService(node.bmc), f"{node.name}-bmc"),
        stacks=stacks or node.stacks,
    )


class SimCluster:
    """Simulated nodes, each with an agent streaming to ``collector`` (or a list of them)."""

    def __init__(  # noqa: PLR0913 - cluster shape and timing
        self,
        names: Iterable[str],
        root: Path,
        clock: Clock,
        collector: str | Sequence[str],
        *,
        poll_interval: float = 0.5,
        heartbeat_interval: float = 1.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 1.0,
        ib_traffic_bytes_per_s: float = 0.0,
        job_socket_dir: Path | None = None,
        state_dir: Path | None = None,
        nvml_call_timeout: float = 5.0,
        preflight: RunnersFor | None = None,
        gauge_interval: float | None = None,
        stacks: StackDumper | None = None,
        proc_root: Path | None = None,
    ) -> None:
        """Build the nodes (and their sysfs trees under ``root``) and their agents.

        Time is compressed here as in the tests: the counters are read every poll of a second or
        more, and a GPU's gauges travel as often (``gauge_interval`` None), unless told.

        Each agent listens for step reports at ``job_socket_dir/<node>.sock`` (``root`` by
        default; a Unix socket path must stay under 108 bytes) and keeps its state (the outbox
        spool) in ``state_dir/<node>`` (None: in memory only). The agents share this process,
        so none of them bounds the process's memory or CPU (``memory_max_bytes`` and
        ``poll_cpu_max_share`` are 0). ``proc_root`` is where every agent reads /proc (None:
        /proc itself), where a test shows its rank processes in a scheduler's cgroup.
        """
        self.nodes: dict[str, SimNode] = {}
        self.agents: dict[str, Agent] = {}
        self.configs: dict[str, AgentConfig] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._clock = clock
        self._tick_s = poll_interval
        self._ticker: asyncio.Task[None] | None = None
        # The agents share one process here: a small shared budget of kept-open sysfs files.
        self.fds = FdBudget(256)
        self._preflight = preflight
        self._stacks = stacks  # None: simulated stacks
        self.job_sockets: dict[str, Path] = {}
        gauge = max(poll_interval, 1.0) if gauge_interval is None else gauge_interval
        for name in names:
            node = SimNode(name, root / name / "sys", clock)
            self.job_sockets[name] = (job_socket_dir or root) / f"{name}.sock"
            for port in node.ib_ports:
                port.traffic_bytes_per_s = ib_traffic_bytes_per_s
            several = not isinstance(collector, str)
            cfg = AgentConfig(
                collector=None if several else str(collector),
                collectors=tuple(collector) if several else None,
                node=name,
                poll_interval=poll_interval,
                heartbeat_interval=heartbeat_interval,
                backoff_initial=backoff_initial,
                backoff_max=backoff_max,
                counter_interval=max(poll_interval, 1.0),
                gauge_interval=gauge,
                state_dir=None if state_dir is None else state_dir / name,
                job_socket=self.job_sockets[name],
                nvml_call_timeout=nvml_call_timeout,
                memory_max_bytes=0,
                poll_cpu_max_share=0.0,
                proc_root=proc_root or Path("/proc"),
            )
            self.nodes[name] = node
            self.configs[name] = cfg
            self.agents[name] = build_agent(
                cfg,
                sim_hardware(node, self._runners(name), self._stacks),
                clock,
                fd_budget=self.fds,
            )

    def _runners(self, name: str) -> PreflightRunners | None:
        if self._preflight is None:
            return None
        return self._preflight(name, self.nodes[name])

    def start(self) -> None:
        """Start every agent, and the clock that moves the simulated hardware's counters."""
        for name, agent in self.agents.items():
            self._tasks[name] = self._run_agent(name, agent)
        self._ticker = asyncio.create_task(self._tick(), name="sim-ticker")

    async def _tick(self) -> None:
        last = self._clock.monotonic()
        while True:
            await self._clock.sleep(self._tick_s)
            now = self._clock.monotonic()
            for name, node in self.nodes.items():
                if self.running(name):
                    node.tick(now - last)
            last = now

    def running(self, name: str) -> bool:
        """True while the node's agent runs."""
        task = self._tasks.get(name)
        return task is not None and not task.done()

    async def crash(self, name: str) -> None:
        """Stop a node's agent without a goodbye, as a crashed node would."""
        task = self._tasks.get(name)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def restart(self, name: str) -> Agent:
        """Crash a node's agent and start a new agent process in its place (same boot)."""
        await self.crash(name)
        agent = build_agent(
            self.configs[name],
            sim_hardware(self.nodes[name], self._runners(name), self._stacks),
            self._clock,
            fd_budget=self.fds,
        )
        self.agents[name] = agent
        self._tasks[name] = self._run_agent(name, agent)
        return agent

    @staticmethod
    def _run_agent(name: str, agent: Agent) -> asyncio.Task[None]:
        """Run an agent; if it dies of an exception, say so (a test would only see silence)."""

        def died(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.error("sim_agent_died", node=name, error=repr(exc), exc_info=exc)

        task = asyncio.create_task(agent.run(), name=f"agent-{name}")
        task.add_done_callback(died)
        return task

    async def inject(self, fault: Fault) -> None:
        """Make a fault happen."""
        if fault.kind == FaultKind.NODE_CRASH:
            await self.crash(fault.node)
        elif fault.kind == FaultKind.AGENT_CUTOFF:
            self.agents[fault.node].link.cut_off(fault.params["seconds"])
        else:
            apply_fault(fault, self.nodes[fault.node])

    def unacked(self) -> int:
        """Events still waiting in the outboxes of running agents."""
        return sum(len(a.outbox) for n, a in self.agents.items() if self.running(n))

    async def stop(self) -> None:
        """Stop every agent and the ticker; NVML calls left hanging return."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        # All at once: each agent's cancellation waits on its own streams and sockets.
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        for node in self.nodes.values():
            node.nvml_hang_clear()
        failed = [e for e in ended if isinstance(e, Exception)]
        if failed:
            raise failed[0]  # as awaiting it alone would (a cancellation is not a failure)
