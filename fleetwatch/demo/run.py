"""Run the demo: a collector, N simulated nodes with real agents, a fault scenario, a live view."""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from agent.sim.cluster import SimCluster
from agent.sim.scenario import Fault, Scenario, ScenarioError, load_scenario
from collector.config import CollectorConfig
from collector.main import CollectorService
from fleetwatch.demo.view import event_line, events_by_kind, fleet_line, node_table

if TYPE_CHECKING:
    from collector.fleet import NodeState
    from collector.store_sqlite import EventRow
    from fleetwatch.clock import Clock

STATUS_EVERY_S = 2.0
TICK_S = 0.25
DRAIN_TIMEOUT_S = 5.0


@dataclass(slots=True)
class DemoOptions:
    """What ``fleetwatch demo`` was asked for."""

    nodes: int | None = None  # None: as many as the scenario names
    duration: float | None = None  # None: the scenario's own
    http_port: int = 0
    workdir: Path | None = None
    scenario: Path | None = None  # None: the built-in demo scenario
    poll_interval: float = 0.5
    heartbeat_interval: float = 1.0


@dataclass(slots=True)
class DemoResult:
    """What the demo saw, for its summary and for tests."""

    faults: list[Fault] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    unacked: int = 0


async def run_demo(opts: DemoOptions, clock: Clock, out: TextIO) -> DemoResult:
    """Play the scenario and print as it goes; return what happened."""
    scenario = load_scenario(opts.scenario)
    if opts.duration is not None:
        if opts.duration <= 0:
            msg = "the demo needs a positive duration"
            raise ValueError(msg)
        scenario = scenario.scaled(opts.duration)
    names = list(scenario.nodes)
    if opts.nodes is not None:
        if opts.nodes < len(names):
            msg = f"scenario {scenario.name!r} needs {len(names)} nodes or more, not {opts.nodes}"
            raise ScenarioError(msg)
        names += [f"node-{i:02d}" for i in range(len(names) + 1, opts.nodes + 1)]
    with tempfile.TemporaryDirectory(prefix="fleetwatch-demo-") as tmp:
        workdir = opts.workdir or Path(tmp)
        return await _run(opts, scenario, names, workdir=workdir, clock=clock, out=out)


async def _run(  # noqa: PLR0913 - the demo's whole set-up
    opts: DemoOptions,
    scenario: Scenario,
    names: list[str],
    *,
    workdir: Path,
    clock: Clock,
    out: TextIO,
) -> DemoResult:
    cfg = CollectorConfig(
        listen="127.0.0.1:0",
        http=f"127.0.0.1:{opts.http_port}",
        journal=workdir / "journal.db",
        heartbeat_interval=opts.heartbeat_interval,
        missed_heartbeats=3,
    )
    collector = CollectorService(cfg, clock)
    await collector.start()
    cluster = SimCluster(
        names,
        workdir / "nodes",
        clock,
        f"127.0.0.1:{collector.grpc_port}",
        poll_interval=opts.poll_interval,
        heartbeat_interval=opts.heartbeat_interval,
        ib_traffic_bytes_per_s=20e9,  # a training job keeps the fabric busy
    )
    base = f"http://127.0.0.1:{collector.http_port}"
    print(
        f"fleetwatch demo: {len(names)} simulated nodes (8 GPUs, 18 NVLinks each, 8 IB ports), "
        f"scenario {scenario.name!r}, {scenario.duration_s:g} s\n"
        f"  metrics  {base}/metrics\n  nodes    {base}/api/v1/nodes\n"
        f"  events   {base}/api/v1/events\n  journal  {cfg.journal}",
        file=out,
    )
    result = DemoResult(faults=list(scenario.faults))
    pending = scenario.timeline()
    cluster.start()
    start = clock.monotonic()
    last_status = -STATUS_EVERY_S
    last_id = 0
    try:
        while (elapsed := clock.monotonic() - start) < scenario.duration_s:
            while pending and pending[0].at_s <= elapsed:
                fault = pending.pop(0)
                print(f"[{elapsed:5.1f}s] inject: {fault.describe()}", file=out)
                await cluster.inject(fault)
            nodes = collector.fleet.snapshot()
            for row in collector.reader.events(after_id=last_id, limit=1000):
                print(event_line(row, nodes.get(row.node)), file=out)
                last_id = row.id
            if elapsed - last_status >= STATUS_EVERY_S:
                print(fleet_line(elapsed, nodes), file=out)
                last_status = elapsed
            await clock.sleep(TICK_S)
        drain_until = clock.monotonic() + DRAIN_TIMEOUT_S
        while cluster.unacked() and clock.monotonic() < drain_until:
            await clock.sleep(TICK_S)
        result.unacked = cluster.unacked()
    finally:
        await cluster.stop()
        nodes = collector.fleet.snapshot()
        result.events = collector.reader.events(limit=100_000)
        await collector.stop(grace=None)
    _summary(result, nodes, out)
    return result


def _summary(result: DemoResult, nodes: dict[str, NodeState], out: TextIO) -> None:
    print("\n=== summary ===", file=out)
    print(f"faults injected: {len(result.faults)}", file=out)
    for fault in result.faults:
        print(f"  t={fault.at_s:>5.1f}s  {fault.describe()}", file=out)
    print(f"events journaled: {len(result.events)} ({events_by_kind(result.events)})", file=out)
    print(f"events still unacknowledged in agent outboxes: {result.unacked}", file=out)
    print("final fleet health:", file=out)
    for line in node_table(nodes):
        print(line, file=out)


def main(opts: DemoOptions, clock: Clock, out: TextIO) -> int:
    """Run the demo to completion; exit status 0 when every event reached the journal."""
    result = asyncio.run(run_demo(opts, clock, out))
    return 0 if result.unacked == 0 else 1
