"""Run the demo: a collector, N simulated nodes with real agents, a fault scenario, a live view.

The collector runs the built-in rules (on demo timing, see :mod:`cli.demo.wiring`) and
acts for real: drains and notifications go as signed webhooks to a local receiver, GPU resets go
down the agent's stream to the simulated node, which resets its GPU. The collector has this
process to itself; the simulated nodes, their agents and the training jobs run in processes of
their own (:mod:`cli.demo.fleet_procs`).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from agent.sim.scenario import Fault, Scenario, ScenarioError, load_scenario
from cli.demo.feed import IncidentFeed
from cli.demo.fleet_procs import FleetProcessError, FleetProcesses, FleetSpec, demo_intervals
from cli.demo.preflight import JobPlacement, planted, qualify
from cli.demo.view import (
    action_table,
    count_by,
    event_line,
    events_by_kind,
    fleet_line,
    incident_table,
    job_line,
    node_table,
)
from cli.demo.wiring import (
    RULE_TIME_DIVISOR,
    actions_note,
    demo_actions,
    demo_rules,
    write_secret,
)
from cli.dev.webhook_receiver import Delivery, WebhookReceiver
from collector.config import CollectorConfig
from collector.jobs.config import JobsConfig
from collector.main import CollectorService
from collector.model.node_states import node_state

if TYPE_CHECKING:
    from collector.model.state import NodeState
    from collector.store.events import EventRow
    from collector.store.incidents import ActionRow, IncidentRow
    from fleetwatch.clock import Clock

STATUS_EVERY_S = 2.0
DEMO_JOB = "demo-pretrain"
TICK_S = 0.25
DRAIN_TIMEOUT_S = 5.0
RULES_INTERVAL_S = 0.25
# The demo job checkpoints every this many steps; it dies of a port down for this share of the
# scenario (NCCL's timeout, on demo time) and restarts after this share of it.
DEMO_CHECKPOINT_STEPS = 40
DEMO_NCCL_TIMEOUT_SHARE = 0.15
DEMO_RESTART_SHARE = 0.1
# A job with no step for this share of the scenario is hung (the default floor is 30 s, a whole
# demo), and one whose rank ended without a word for this share is failed.
DEMO_HANG_FLOOR_SHARE = 0.06
DEMO_EXIT_GRACE_SHARE = 0.03
CONNECT_TIMEOUT_S = 120.0  # the scenario starts once every agent is connected, or after this


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
    preflight: bool = False  # qualify the cluster first; the job starts on the nodes that pass


@dataclass(slots=True)
class DemoResult:
    """What the demo saw, for its summary and for tests."""

    faults: list[Fault] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    incidents: list[IncidentRow] = field(default_factory=list)
    actions: list[ActionRow] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)  # fleetwatch_node_state, by node
    lifecycle: dict[str, str] = field(default_factory=dict)  # each node's lifecycle state
    unacked: int = 0
    connected: int = 0  # agents connected at the end (the crashed node's not)
    start_s: float = 0.0  # seconds the simulated nodes took to start
    started_unix: float = 0.0
    jobs: list[dict[str, object]] = field(default_factory=list)
    placement: JobPlacement | None = None  # where the job ran after pre-flight


async def run_demo(opts: DemoOptions, clock: Clock, out: TextIO) -> DemoResult:
    """Play the scenario and print as it goes; return what happened."""
    scenario = load_scenario(opts.scenario)
    stretch = 1.0
    if opts.duration is not None:
        if opts.duration <= 0:
            msg = "the demo needs a positive duration"
            raise ValueError(msg)
        stretch = opts.duration / scenario.duration_s
        scenario = scenario.scaled(opts.duration)
    names = list(scenario.nodes)
    if opts.nodes is not None:
        if opts.nodes < len(names):
            msg = f"scenario {scenario.name!r} needs {len(names)} nodes or more, not {opts.nodes}"
            raise ScenarioError(msg)
        names += [f"node-{i:02d}" for i in range(len(names) + 1, opts.nodes + 1)]
    opts.poll_interval, opts.heartbeat_interval = demo_intervals(
        len(names), opts.poll_interval, opts.heartbeat_interval
    )
    with tempfile.TemporaryDirectory(prefix="fleetwatch-demo-") as tmp:
        workdir = opts.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        secret, secret_file = write_secret(workdir)
        with WebhookReceiver(clock=clock, secret=secret) as receiver:
            rules = demo_rules(workdir, RULE_TIME_DIVISOR / stretch)
            cfg = CollectorConfig(
                listen="127.0.0.1:0",
                http=f"127.0.0.1:{opts.http_port}",
                journal=workdir / "journal.db",
                heartbeat_interval=opts.heartbeat_interval,
                missed_heartbeats=3,
                rules=(rules.path,),
                rules_interval=RULES_INTERVAL_S,
                actions=demo_actions(receiver.url, secret_file),
                jobs=JobsConfig(
                    hang_floor_s=DEMO_HANG_FLOOR_SHARE * scenario.duration_s,
                    exit_grace_s=DEMO_EXIT_GRACE_SHARE * scenario.duration_s,
                    culprit_window_s=max(2 * opts.poll_interval, 1.0),
                ),
            )
            notes = [*rules.describe(), *actions_note(receiver.url)]
            result = await _run(opts, scenario, names, cfg, notes, clock=clock, out=out)
            result.deliveries = receiver.deliveries()
    _summary(result, out)
    return result


async def _run(  # noqa: PLR0913 - the demo's whole set-up
    opts: DemoOptions,
    scenario: Scenario,
    names: list[str],
    cfg: CollectorConfig,
    notes: list[str],
    *,
    clock: Clock,
    out: TextIO,
) -> DemoResult:
    result = DemoResult(faults=list(scenario.faults))
    collector = CollectorService(cfg, clock)
    # The feed takes the dispatcher's place as the incident service's sink and hands every
    # firing on to it: the dispatcher acts as it always does, the feed prints what it did.
    feed = IncidentFeed(
        collector.incidents.sink, collector.journal, collector.evaluator.engine, clock, out
    )
    collector.incidents.sink = feed
    await collector.start()
    # Unix socket paths must stay short (108 bytes): the job sockets get a temp dir of their own.
    sockets = tempfile.TemporaryDirectory(prefix="fwdemo-")
    fleet = FleetProcesses(
        names,
        FleetSpec(
            collector=f"127.0.0.1:{collector.grpc_port}",
            root=cfg.journal.parent / "nodes",
            sockets=Path(sockets.name),
            poll_interval=opts.poll_interval,
            heartbeat_interval=opts.heartbeat_interval,
            job=DEMO_JOB,
            checkpoint_every=DEMO_CHECKPOINT_STEPS,
            nccl_timeout_s=DEMO_NCCL_TIMEOUT_SHARE * scenario.duration_s,
            restart_after_s=DEMO_RESTART_SHARE * scenario.duration_s,
            preflight=opts.preflight,
            plant=planted(names) if opts.preflight else (),
        ),
    )
    _header(scenario, names, cfg, collector.http_port, fleet=fleet, notes=notes, out=out)
    pending = scenario.timeline()
    try:
        print(f"starting the simulated nodes in {len(fleet.groups)} process(es) ...", file=out)
        out.flush()
        began = clock.monotonic()
        await fleet.start()
        # The agents start spread over a poll interval: the scenario waits for all of them.
        connect_until = clock.monotonic() + CONNECT_TIMEOUT_S
        while (status := await fleet.status())["connected"] < len(names):
            if clock.monotonic() >= connect_until:
                break
            await clock.sleep(TICK_S)
        result.start_s = clock.monotonic() - began
        print(
            f"{status['connected']} of {len(names)} nodes connected in {result.start_s:.1f} s;"
            + (" pre-flight first" if opts.preflight else " the scenario starts now"),
            file=out,
        )
        if opts.preflight:
            result.placement = await qualify(collector, out)
            started = await fleet.start_job(result.placement.skip)
            print(
                f"job {DEMO_JOB} started on {started} of {len(names)} nodes"
                if started
                else f"job {DEMO_JOB} not started: pre-flight left no node for it",
                file=out,
            )
            print("\n=== the scenario starts now ===", file=out)
        result.started_unix = clock.now()
        feed.begin()
        await _play(collector, feed, fleet, pending, scenario.duration_s, clock=clock, out=out)
        drain_until = clock.monotonic() + DRAIN_TIMEOUT_S
        while (status := await fleet.status())["unacked"] and clock.monotonic() < drain_until:
            await clock.sleep(TICK_S)
        result.unacked = status["unacked"]
        result.connected = status["connected"]
    finally:
        # The collector's view is taken before the fleet goes: stopping hundreds of agents
        # takes a while, and their silence is not part of the scenario.
        result.jobs = [dict(j) for j in collector.jobs.summaries()]
        await collector.incidents.stop()  # no rule runs while the journal is read
        await feed.poll()
        feed.flush()
        await _final_view(collector, result)
        await fleet.stop()
        sockets.cleanup()
        await collector.stop(grace=None)
    return result


async def _play(  # noqa: PLR0913 - the demo's live loop and what it shows
    collector: CollectorService,
    feed: IncidentFeed,
    fleet: FleetProcesses,
    pending: list[Fault],
    duration_s: float,
    *,
    clock: Clock,
    out: TextIO,
) -> None:
    """Inject the faults on time and print what the collector saw, until the scenario ends."""
    last_status, last_id = -STATUS_EVERY_S, 0
    while (elapsed := feed.elapsed()) < duration_s:
        # What happened since the last round first (events, then the incidents they led
        # to), so that the lines stay in time order; then this round's faults.
        rows = collector.reader.events(after_id=last_id, limit=1000)
        nodes = collector.fleet.snapshot()
        for row in rows:
            print(event_line(row, nodes.get(row.node)), file=out)
            last_id = row.id
        await feed.poll()
        feed.flush()
        if elapsed - last_status >= STATUS_EVERY_S:
            lines = [fleet_line(elapsed, nodes, firing=feed.firing())]
            lines += [job_line(elapsed, j) for j in collector.jobs.summaries()]
            print("\n".join(lines), file=out)
            last_status = elapsed
        while pending and pending[0].at_s <= elapsed:
            fault = pending.pop(0)
            print(f"[{elapsed:5.1f}s] inject: {fault.describe()}", file=out)
            await fleet.inject(fault)
        out.flush()  # live through a pipe too (`make demo | tee demo.log`)
        await clock.sleep(TICK_S)


async def _final_view(collector: CollectorService, result: DemoResult) -> None:
    """What the collector holds at the end: nodes and their states, events, incidents, actions."""
    result.nodes = collector.fleet.snapshot()
    flags = collector.node_flags()
    result.states = {name: node_state(node, flags) for name, node in result.nodes.items()}
    result.lifecycle = {name: collector.lifecycle.state(name).value for name in result.nodes}
    result.events = collector.reader.events(limit=100_000)
    result.incidents = await collector.journal.do(lambda s: s.incidents.incidents(limit=100_000))
    result.actions = await collector.journal.do(lambda s: s.incidents.actions(limit=100_000))


def _header(  # noqa: PLR0913 - what the header shows
    scenario: Scenario,
    names: list[str],
    cfg: CollectorConfig,
    http_port: int,
    *,
    fleet: FleetProcesses,
    notes: list[str],
    out: TextIO,
) -> None:
    base = f"http://127.0.0.1:{http_port}"
    jobs = ", ".join(repr(j) for j in fleet.jobs)
    where = "on every GPU" if len(fleet.jobs) == 1 else "one per fleet process, on every GPU"
    lines = [
        (
            f"fleetwatch demo: {len(names)} simulated nodes (8 GPUs, 18 NVLinks each, "
            f"8 IB ports), scenario {scenario.name!r}, {scenario.duration_s:g} s"
        ),
        f"  metrics    {base}/metrics",
        f"  nodes      {base}/api/v1/nodes",
        f"  events     {base}/api/v1/events",
        f"  jobs       {base}/api/v1/jobs  (simulated jobs {jobs}, {where})",
        (
            f"  fleet      {len(fleet.groups)} process(es); agents poll every "
            f"{fleet.spec.poll_interval:g} s, heartbeat every {fleet.spec.heartbeat_interval:g} s"
        ),
        f"  journal    {cfg.journal}",
        *notes,
        f"  watch      fleetwatch incidents --api {base}",
        f"             fleetwatch actions --api {base}",
    ]
    print("\n".join(lines), file=out)


def _summary(result: DemoResult, out: TextIO) -> None:
    print("\n=== summary ===", file=out)
    print(f"faults injected: {len(result.faults)}", file=out)
    for fault in result.faults:
        print(f"  t={fault.at_s:>5.1f}s  {fault.describe()}", file=out)
    print(f"events journaled: {len(result.events)} ({events_by_kind(result.events)})", file=out)
    print(f"events still unacknowledged in agent outboxes: {result.unacked}", file=out)
    print(
        f"simulated nodes: connected in {result.start_s:.1f} s; {result.connected} of "
        f"{len(result.nodes)} connected at the end",
        file=out,
    )
    t0 = result.started_unix
    print(
        f"incidents: {len(result.incidents)} ({count_by(r.phase for r in result.incidents)})",
        file=out,
    )
    if result.incidents:
        for line in incident_table(result.incidents, t0):
            print(line, file=out)
    print(
        f"actions taken: {len(result.actions)} ({count_by(r.state for r in result.actions)})",
        file=out,
    )
    if result.actions:
        for line in action_table(result.actions, t0):
            print(line, file=out)
    kinds = count_by(str(d.body.get("kind", "?")) for d in result.deliveries)
    print(f"webhooks received (signature checked): {len(result.deliveries)} ({kinds})", file=out)
    for job in result.jobs:
        print(job_line(None, job), file=out)
    print("final fleet health:", file=out)
    for line in node_table(result.nodes, result.states, result.lifecycle):
        print(line, file=out)


def main(opts: DemoOptions, clock: Clock, out: TextIO) -> int:
    """Run the demo to completion; exit status 0 when every event reached the journal.

    A fleet process that fails (its own error is on stderr above) ends the demo with a line
    saying which, and exit status 1.
    """
    try:
        result = asyncio.run(run_demo(opts, clock, out))
    except FleetProcessError as exc:
        print(f"fleetwatch demo: {exc}", file=sys.stderr)
        return 1
    return 0 if result.unacked == 0 else 1
