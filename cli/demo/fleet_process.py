"""Part of the demo's simulated fleet, in a process of its own: nodes, their agents, a job.

``fleetwatch demo`` starts one or more of these (``python -m cli.demo.fleet_process``),
each with a share of the nodes, so that the agents' polls do not starve the collector's event
loop (with 256 nodes in the demo's own process, most never got to say Hello). The nodes are
:class:`agent.sim.cluster.SimCluster` nodes (simulated hardware, real agents, real gRPC to the
collector); the agents start spread over one poll interval, as a real fleet's are not in step;
a simulated training job runs on every GPU of the process's nodes, each rank a process of its
own while the job has at most ``--rank-processes`` ranks (the scenario's rank hangs need them).

The pipe: one JSON object per line both ways. This process writes ``{"op": "ready", ...}`` once
its agents run and the job steps, then answers each request from stdin: ``{"op": "inject",
"node", "kind", "params"}`` with ``{"op": "injected"}`` (or ``{"op": "error", "error"}``),
``{"op": "status"}`` with ``{"op": "status", "unacked", "connected", "step", ...}`` and
``{"op": "quit"}`` with ``{"op": "stopped", ...}`` before it exits. Logs go to stderr.

With ``--preflight`` the agents measure pre-flight checks with the simulator's runners (one
:class:`agent.sim.preflight.SimFabric` over this process's nodes), the faults of ``--plant`` (a
JSON list of ``{"node", "kind", "params"}``) are on the hardware before the agents start, and
the job waits for ``{"op": "start_job", "skip": [nodes]}`` (answered with ``{"op":
"job_started", "nodes"}``): a node being qualified runs no job, and the nodes the demo's
placement skips (failed, or one end of a blamed link) run none at all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from agent.sim.cluster import SimCluster
from agent.sim.preflight import SimFabric
from agent.sim.scenario import Fault, FaultKind, ScenarioError, apply_fault
from agent.sim.training import SimTrainingJob
from cli.demo.preflight import UTIL_HOLD_S
from fleetwatch.clock import SystemClock
from fleetwatch.logs import configure_logging

if TYPE_CHECKING:
    from agent.agent import Agent

BUSY_FABRIC_BYTES_PER_S: Final = 20e9  # a training job keeps the fabric busy
SOCKETS_WAIT_S: Final = 10.0  # the job starts once the agents listen, or after this regardless


def say(**fields: object) -> None:
    """One line to the demo."""
    sys.stdout.write(json.dumps(fields, sort_keys=True) + "\n")
    sys.stdout.flush()


class SpreadCluster(SimCluster):
    """A SimCluster whose agents start at random moments within ``spread_s``."""

    def start_spread(self, spread_s: float, rng: random.Random) -> None:
        """Start each agent after a random delay up to ``spread_s``, and the ticker now."""
        for name, agent in self.agents.items():
            delay = rng.uniform(0.0, spread_s)
            self._tasks[name] = asyncio.create_task(self._after(delay, agent), name=f"agent-{name}")
        self._ticker = asyncio.create_task(self._tick(), name="sim-ticker")

    async def _after(self, delay_s: float, agent: Agent) -> None:
        await self._clock.sleep(delay_s)
        await agent.run()


async def stdin_reader() -> asyncio.StreamReader:
    """The demo's requests, read without blocking the loop."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def status(cluster: SimCluster, job: SimTrainingJob | None) -> dict[str, Any]:
    """What the demo asks about this process's share of the fleet."""
    agents = cluster.agents.values()
    return {
        "unacked": cluster.unacked(),
        "connected": sum(a.link.connected for a in agents),
        "nodes": len(cluster.nodes),
        "step": job.step if job is not None else 0,
        "job_crashes": job.crashes if job is not None else 0,
    }


def build(args: argparse.Namespace, clock: SystemClock) -> SpreadCluster:
    """The process's nodes and their agents, with the planted faults on their hardware."""
    fabric = SimFabric({}, seed=args.seed, util_hold_s=UTIL_HOLD_S)
    cluster = SpreadCluster(
        args.nodes.split(","),
        Path(args.root),
        clock,
        args.collector,
        poll_interval=args.poll_interval,
        heartbeat_interval=args.heartbeat_interval,
        ib_traffic_bytes_per_s=BUSY_FABRIC_BYTES_PER_S,
        job_socket_dir=Path(args.sockets),
        preflight=fabric.runners_for if args.preflight else None,
    )
    for raw in json.loads(args.plant):
        fault = Fault(0.0, raw["node"], FaultKind(raw["kind"]), dict(raw["params"]))
        apply_fault(fault, cluster.nodes[fault.node])
    return cluster


class DemoJob:
    """The process's training job: on every node's GPUs, or all but those pre-flight avoids."""

    def __init__(self, args: argparse.Namespace, cluster: SimCluster, clock: SystemClock) -> None:
        """Nothing runs until :meth:`start`."""
        self._args, self._cluster, self._clock = args, cluster, clock
        self.job: SimTrainingJob | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, skip: set[str]) -> None:
        """Start it (once) on the nodes but ``skip``, once their agents listen."""
        args, cluster, clock = self._args, self._cluster, self._clock
        if not args.job or self.job is not None:
            return
        deadline = clock.monotonic() + args.poll_interval + SOCKETS_WAIT_S
        sockets = cluster.job_sockets.values()
        while not all(p.exists() for p in sockets) and clock.monotonic() < deadline:
            await clock.sleep(0.05)
        nodes = [node for name, node in cluster.nodes.items() if name not in skip]
        if not nodes:  # pre-flight left no node for it
            return
        ranks = sum(len(node.gpus) for node in nodes)
        self.job = SimTrainingJob.on_nodes(
            args.job,
            nodes,
            cluster.job_sockets,
            clock,
            processes=ranks <= args.rank_processes,
            compute_s=0.08,
            checkpoint_every=args.checkpoint_every,
            node_up=cluster.running,
            nccl_timeout_s=args.nccl_timeout,
            restart_after_s=args.restart_after,
        )
        self._task = asyncio.create_task(self.job.run(), name="demo-job")

    async def stop(self) -> None:
        """Stop it if it runs."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def serve(args: argparse.Namespace) -> None:
    """Build the nodes, start the agents and the job, then answer the demo until it quits."""
    clock = SystemClock()
    began = time.monotonic()
    cluster = build(args, clock)
    built_s = time.monotonic() - began
    reader = await stdin_reader()
    cluster.start_spread(args.poll_interval, random.Random(args.seed))  # noqa: S311 - timing
    job = DemoJob(args, cluster, clock)
    if not args.preflight:  # with pre-flight, the job waits for start_job
        await job.start(set())
    say(op="ready", nodes=len(cluster.nodes), build_s=round(built_s, 2))
    try:
        while line := await reader.readline():
            msg = json.loads(line)
            op = msg.get("op")
            if op == "start_job":
                skip = set(msg.get("skip", []))
                await job.start(skip)
                say(op="job_started", nodes=len(cluster.nodes) - len(skip & set(cluster.nodes)))
            elif op == "inject":
                try:
                    fault = Fault(0.0, msg["node"], FaultKind(msg["kind"]), dict(msg["params"]))
                    await cluster.inject(fault)
                except (KeyError, ValueError, ScenarioError) as exc:
                    say(op="error", error=f"{type(exc).__name__}: {exc}")
                else:
                    say(op="injected")
            elif op == "status":
                say(op="status", **status(cluster, job.job))
            elif op == "quit":
                break
    finally:
        await job.stop()
        final = status(cluster, job.job)
        await asyncio.gather(*(cluster.crash(name) for name in list(cluster.agents)))
        await cluster.stop()
        say(op="stopped", **final)


def main(argv: list[str] | None = None) -> None:
    """Parse the demo's arguments and serve (stdout is the pipe, stderr the logs)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--collector", required=True, help="host:port of the collector's gRPC")
    parser.add_argument("--root", required=True, help="folder for the nodes' sysfs trees")
    parser.add_argument("--sockets", required=True, help="folder for the job sockets")
    parser.add_argument("--nodes", required=True, help="the nodes' names, comma-separated")
    parser.add_argument("--poll-interval", type=float, default=0.5)
    parser.add_argument("--heartbeat-interval", type=float, default=1.0)
    parser.add_argument("--job", default="", help="a training job on every GPU ('' none)")
    parser.add_argument("--checkpoint-every", type=int, default=40)
    parser.add_argument("--nccl-timeout", type=float, default=3.0)
    parser.add_argument("--restart-after", type=float, default=7.5)
    parser.add_argument(
        "--rank-processes",
        type=int,
        default=64,
        help="a job of at most this many ranks runs each rank as a process (rank hangs need it)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--preflight", action="store_true", help="simulated pre-flight runners")
    parser.add_argument("--plant", default="[]", help="faults on the hardware before it starts")
    args = parser.parse_args(argv)
    configure_logging("error", "console")  # to stderr: stdout is the pipe
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
