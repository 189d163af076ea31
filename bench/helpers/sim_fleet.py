"""A simulated fleet in a process of its own, for benchmarks: N nodes, their real agents, a pipe.

``bench/fault_to_action.py`` starts this as a child process. The nodes are
:class:`agent.sim.cluster.SimCluster` nodes (simulated hardware, real agent code, real gRPC
streams to the collector); the agents run with the poll and heartbeat intervals given on the
command line (the agent's production defaults unless told otherwise) and the production
counter interval.

The pipe: one JSON object per line both ways. This process writes to stdout

* ``{"op": "built", ...}`` once the nodes and their sysfs trees exist,
* ``{"op": "started", ...}`` once every agent task runs,
* ``{"op": "injected", "id": ..., "t": <time.time() just before the fault was applied>, ...}``
  for each ``{"op": "inject", "id": ..., "node": ..., "kind": <FaultKind>, "params": {...}}``,
* ``{"op": "status", ...}`` for each ``{"op": "status"}``,
* ``{"op": "stats", ...}`` and exits after ``{"op": "quit"}`` or the end of stdin.

Logs (the agents' own, as JSON) go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.config import AgentConfig
from agent.sim.cluster import SimCluster
from agent.sim.scenario import Fault, FaultKind
from fleetwatch.clock import SystemClock
from fleetwatch.logs import configure_logging

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for bench.*
from bench.helpers.figures import percentile
from bench.helpers.pipe import say, stdin_lines
from bench.helpers.sim_nodes import node_names

if TYPE_CHECKING:
    from agent.agent import Agent

LAG_PROBE_S = 0.1
BUSY_FABRIC_BYTES_PER_S = 20e9  # --busy-fabric: what the demo uses (a training job's traffic)


class LoopLag:
    """How late the event loop wakes a task that sleeps ``LAG_PROBE_S`` (its busyness)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.recording = False
        self.worst = 0.0  # ms, while recording
        self.worst_at = 0.0  # wall time the worst lag ended

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            began = time.monotonic()
            await asyncio.sleep(LAG_PROBE_S)
            if self.recording:
                late = (time.monotonic() - began - LAG_PROBE_S) * 1000
                if late > self.worst:
                    self.worst, self.worst_at = late, time.time()
                self.samples.append(late)

    def summary(self) -> dict[str, float | None]:
        """p50, p99 and max of the lag while recording, in ms."""
        return {
            "loop_lag_p50_ms": _round(percentile(self.samples, 0.5)),
            "loop_lag_p99_ms": _round(percentile(self.samples, 0.99)),
            "loop_lag_max_ms": _round(max(self.samples, default=None)),
            "loop_lag_max_at": round(self.worst_at, 3),
        }


class GcPauses:
    """The longest garbage collection while recording: 256 agents share this process's heap.

    Each real agent has a process (and a heap) of its own; here one full collection walks every
    agent's objects at once, and it stopped this process's loop for 0.4 s, which the benchmark
    then counted as the injection's lateness (not the product's, but the run was not judged).
    """

    def __init__(self) -> None:
        self.recording = False
        self.longest_ms = 0.0
        self.full = 0
        self._began = 0.0

    def install(self) -> None:
        """Time every collection from now on."""
        gc.callbacks.append(self._on_collection)

    def settle(self) -> None:
        """Collect once, then freeze what survives (the fleet as built and connected).

        Later collections walk only what the run allocates, as in 256 processes of one agent
        each.
        """
        gc.collect()
        gc.freeze()

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        if not self.recording:
            return
        self.longest_ms = max(self.longest_ms, (time.perf_counter() - self._began) * 1000)
        self.full += info.get("generation") == 2  # noqa: PLR2004 - the oldest generation


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def status(cluster: SimCluster) -> dict[str, Any]:
    agents = cluster.agents.values()
    return {
        "connected": sum(a.link.connected for a in agents),
        "connections": sum(a.link.connections for a in agents),
        "link_failures": sum(a.link.failures for a in agents),
        "polls": sum(a.polls for a in agents),
        "unacked": cluster.unacked(),
    }


class StaggeredCluster(SimCluster):
    """A SimCluster whose agents start spread over a poll interval, as a real fleet's run.

    Real nodes do not poll in step; agents all started in the same instant would (one process,
    one event loop), and every fault would queue behind a burst of 256 polls.
    """

    def start_spread(self, spread_s: float, rng: random.Random) -> None:
        """Start each agent after a random delay up to ``spread_s``; start the ticker now."""
        for name, agent in self.agents.items():
            self._tasks[name] = asyncio.create_task(
                self._run_after(rng.uniform(0.0, spread_s), agent), name=f"agent-{name}"
            )
        self._ticker = asyncio.create_task(self._tick(), name="sim-ticker")

    async def _run_after(self, delay_s: float, agent: Agent) -> None:
        await self._clock.sleep(delay_s)
        await agent.run()

    async def stop_all(self) -> None:
        """Stop every agent at once (one after another takes long with hundreds), then the rest."""
        await asyncio.gather(*(self.crash(name) for name in list(self._tasks)))
        await self.stop()


async def serve(args: argparse.Namespace) -> None:
    clock = SystemClock()
    began = time.monotonic()
    cluster = StaggeredCluster(
        node_names(args.nodes),
        Path(args.root),
        clock,
        args.collector,
        poll_interval=args.poll_interval,
        heartbeat_interval=args.heartbeat_interval,
        backoff_initial=args.backoff_initial,
        backoff_max=args.backoff_max,
        ib_traffic_bytes_per_s=BUSY_FABRIC_BYTES_PER_S if args.busy_fabric else 0.0,
    )
    # SimCluster reads counters every poll (at least every second); a production agent reads
    # them every counter_interval. Use the production cadence so the agents do production work.
    for agent in cluster.agents.values():
        agent.sampler._counter_interval = args.counter_interval  # noqa: SLF001
    say(op="built", nodes=len(cluster.nodes), build_s=round(time.monotonic() - began, 2))
    lag = LoopLag()
    lag_task = asyncio.create_task(lag.run(), name="loop-lag")
    pauses = GcPauses()
    pauses.install()
    reader = await stdin_lines()
    if args.spread > 0:
        cluster.start_spread(args.spread, random.Random(args.seed))
    else:
        cluster.start()
    say(op="started", t=time.time())
    cpu_mark = cpu_seconds()
    injected = 0
    try:
        while line := await reader.readline():
            msg = json.loads(line)
            op = msg.get("op")
            if op == "inject":
                fault = Fault(0.0, msg["node"], FaultKind(msg["kind"]), dict(msg["params"]))
                t = time.time()
                await cluster.inject(fault)
                injected += 1
                say(op="injected", id=msg["id"], t=t, sent=msg.get("sent"))
            elif op == "status":
                say(op="status", **status(cluster))
            elif op == "settle":  # set up: what stays is frozen (a collection of it is slow)
                pauses.settle()
                say(op="settled")
            elif op == "record":  # from now on, the loop lag and CPU figures count
                lag.samples.clear()
                lag.recording = pauses.recording = True
                cpu_mark = cpu_seconds()
            elif op == "quit":
                break
    finally:
        say(
            op="stats",
            injected=injected,
            cpu_s_since_record=round(cpu_seconds() - cpu_mark, 2),
            loop_lag_samples=len(lag.samples),
            gc_longest_ms=round(pauses.longest_ms, 1),
            gc_full_collections=pauses.full,
            **lag.summary(),
            **status(cluster),
        )
        lag_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lag_task
        await cluster.stop_all()


def main() -> None:
    defaults = AgentConfig(node="bench", state_dir=None, job_socket=None)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--collector", required=True, help="host:port of the collector's gRPC")
    parser.add_argument("--root", required=True, help="folder for the nodes' sysfs trees")
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--poll-interval", type=float, default=defaults.poll_interval)
    parser.add_argument("--heartbeat-interval", type=float, default=defaults.heartbeat_interval)
    parser.add_argument("--counter-interval", type=float, default=defaults.counter_interval)
    parser.add_argument("--backoff-initial", type=float, default=defaults.backoff_initial)
    parser.add_argument("--backoff-max", type=float, default=defaults.backoff_max)
    parser.add_argument(
        "--busy-fabric",
        action="store_true",
        help="IB traffic counters move (the simulator rewrites their files on every tick)",
    )
    parser.add_argument(
        "--spread",
        type=float,
        default=None,
        help="start the agents spread over this many s (default: one poll interval); 0: at once",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    if args.spread is None:
        args.spread = args.poll_interval
    configure_logging(args.log_level, "json")  # to stderr: stdout is the pipe
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
