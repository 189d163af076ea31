"""Record what real agents on simulated nodes send, for ``bench/collector_ingest.py`` to replay.

Run from the repository root: ``.venv/bin/python bench/ingest/record.py --out FILE``.

A small gRPC server in this process stands in for the collector: it answers each Hello with a
Welcome, acks every event, and keeps every message. Against it run real agents
(:class:`agent.sim.cluster.SimCluster`: real agent code on simulated hardware) polling every
second, with a heartbeat every second (so a node reports once a second, the interval the
benchmark loads the collector at) and the production counter interval:

* one busy node, as a node of a running training job: between polls its GPUs' temperature,
  power and utilisation move and its IB ports carry traffic (``move_hardware`` of
  ``bench/helpers/sim_nodes.py``, as in ``bench/agent_poll.py``); it keeps the production
  self limits, so it also reports its own CPU and memory. Once, its kernel log gets a corrected
  PCIe AER error (lines from ``tests/fixtures/kmsg/aer-corrected.txt``): the event the benchmark
  sends now and then;
* one node per fault of ``bench/fault_to_action.py`` (``bench/helpers/faults.py``: Xid 79, 61,
  119, 120, 13, a row-remap failure): the fault is applied a few seconds in, and the messages of
  the next two seconds are its script.

The agents run on a clock ``--speed`` times faster than the real one (their polls, heartbeats
and counter reads come that much sooner; the times in the messages are rewritten on replay),
so that ``--seconds`` of agent time take a fraction of that.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from agent.config import AgentConfig
from agent.main import build_agent
from agent.sim.cluster import SimCluster, sim_hardware
from agent.sim.kmsg import LEVEL_WARNING
from agent.sim.scenario import Fault
from fleetwatch.logs import configure_logging
from fleetwatch.testing import free_port
from fleetwatch.wire import settings
from fleetwatch.wire.grouped import keyed_samples, sample_count
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for bench.*
from bench.helpers.faults import FAULTS
from bench.helpers.sim_nodes import move_hardware
from bench.ingest.wire import FaultScript, Recording, check_rendering, samples_of

if TYPE_CHECKING:
    from agent.sim.hardware import SimNode

ROOT = Path(__file__).resolve().parents[2]
AER_FIXTURE = ROOT / "tests" / "fixtures" / "kmsg" / "aer-corrected.txt"
BUSY = "rec-busy"
POLL_S = 1.0
FAULT_AT_S = 5.0  # agent seconds after the start: the fault
SCRIPT_S = 2.0  # agent seconds of messages after a fault that make its script
AER_AT_S = 20.0  # agent seconds after the start: the busy node's AER error


class FastClock:
    """Wall and monotonic time running ``speed`` times faster than the real clock."""

    __slots__ = ("_mono0", "_speed", "_wall0")

    def __init__(self, speed: float) -> None:
        self._speed = speed
        self._mono0 = time.monotonic()
        self._wall0 = time.time()

    def now(self) -> float:
        """Wall time, fast."""
        return self._wall0 + (time.monotonic() - self._mono0) * self._speed

    def monotonic(self) -> float:
        """Monotonic time, fast."""
        return self._mono0 + (time.monotonic() - self._mono0) * self._speed

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of this clock."""
        await asyncio.sleep(max(seconds, 0.0) / self._speed)


@dataclass
class Tape:
    """Every message the stand-in collector got, by node, with the agent time it came at."""

    clock: FastClock
    messages: dict[str, list[tuple[float, pb.AgentMessage]]] = field(default_factory=dict)

    async def serve(
        self, _requests: object, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> None:
        """One agent's stream: Welcome, acks, and every message kept."""
        first: object = await context.read()
        if not isinstance(first, bytes):
            return
        hello = pb.AgentMessage.FromString(first).hello
        kept = self.messages.setdefault(hello.node, [])
        kept.append((self.clock.monotonic(), pb.AgentMessage.FromString(first)))
        # As the collector does: the agents send their samples grouped by target.
        welcome = pb.Welcome(journaled=pb.Ack(boot_id=hello.boot_id, seq=0), grouped_reports=True)
        await context.write(pb.CollectorMessage(welcome=welcome).SerializeToString())
        while isinstance(raw := await context.read(), bytes):
            msg = pb.AgentMessage.FromString(raw)
            kept.append((self.clock.monotonic(), msg))
            if msg.WhichOneof("body") == "event":
                ack = pb.Ack(boot_id=hello.boot_id, seq=msg.event.seq)
                await context.write(pb.CollectorMessage(ack=ack).SerializeToString())


def aer_lines() -> list[tuple[int, str]]:
    """(level, text) of the records of the fixture's first corrected AER error."""
    records: list[tuple[int, str]] = []
    for line in AER_FIXTURE.read_text().splitlines():
        if line.startswith(" ") or ";" not in line:
            continue
        head, text = line.split(";", 1)
        if records and "AER:" in text and "error received" in text:
            break
        records.append((int(head.split(",")[0]), text))
    return records


async def move(cluster: SimCluster, clock: FastClock, seconds: float) -> None:
    """Move the busy node's hardware once an agent second; its AER error at AER_AT_S."""
    rng = random.Random(7)
    node: SimNode = cluster.nodes[BUSY]
    began = clock.monotonic()
    aer_done = False
    while clock.monotonic() - began < seconds:
        move_hardware(node, node.sysfs, rng)
        if not aer_done and clock.monotonic() - began >= AER_AT_S:
            for level, text in aer_lines():
                node.kmsg.write(text, level=min(level, LEVEL_WARNING))
            aer_done = True
        await clock.sleep(POLL_S)


def fault_nodes() -> dict[str, str]:
    """Recording node name -> fault name."""
    return {f"rec-fault-{i}": name for i, name in enumerate(FAULTS)}


async def record(
    seconds: float, speed: float, workdir: Path, gauge_interval: float
) -> tuple[Tape, dict[str, int]]:
    clock = FastClock(speed)
    tape = Tape(clock)
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        settings.SERVICE_NAME, {"Stream": grpc.stream_stream_rpc_method_handler(tape.serve)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    faults = fault_nodes()
    cluster = SimCluster(
        [BUSY, *faults],
        workdir,
        clock,
        f"127.0.0.1:{port}",
        poll_interval=POLL_S,
        heartbeat_interval=POLL_S,
        gauge_interval=gauge_interval,
    )
    production = AgentConfig(node=BUSY, state_dir=None, job_socket=None)
    for agent in cluster.agents.values():
        agent.sampler._counter_interval = production.counter_interval  # noqa: SLF001
    # The busy node keeps the production self limits: it reports its own CPU and memory.
    cfg = replace(
        cluster.configs[BUSY],
        memory_max_bytes=production.memory_max_bytes,
        poll_cpu_max_share=production.poll_cpu_max_share,
    )
    busy = build_agent(cfg, sim_hardware(cluster.nodes[BUSY]), clock, fd_budget=cluster.fds)
    busy.sampler._counter_interval = production.counter_interval  # noqa: SLF001
    cluster.agents[BUSY] = busy
    cluster.start()
    mover = asyncio.create_task(move(cluster, clock, seconds))
    await clock.sleep(FAULT_AT_S)
    rng = random.Random(11)
    gpus: dict[str, int] = {}
    for node, name in faults.items():
        kind, params, _ = FAULTS[name]
        gpus[node] = rng.randrange(8)
        await cluster.inject(Fault(0.0, node, kind, {"gpu": gpus[node], **params}))
        tape.messages.setdefault(node, []).append((clock.monotonic(), pb.AgentMessage()))
    await mover
    await cluster.stop()
    await server.stop(0)
    return tape, gpus


def reads_counters(report: pb.Report) -> bool:
    """Whether a report carries the IB counters (read every counter interval, not every poll)."""
    return any(key[0] == pb.TARGET_KIND_IB_PORT for key, _, _ in keyed_samples(report))


def steady_cycle(reports: list[pb.Report]) -> list[pb.Report]:
    """One counter interval of steady reports, the last one reading the counters.

    The polls that read no counters come first, then the last report that read them (the first
    ones after start-up also carry every rate, once). Loaded agents stretch their polls (this
    recording's clock runs fast), so the recording may hold fewer or more polls per counter read
    than production; the cycle has the production share: one counter read every
    ``counter_interval / poll`` reports.
    """
    plain = [r for r in reports if not reads_counters(r)]
    counters = [r for r in reports if reads_counters(r)]
    per_read = round(AgentConfig(node="x", state_dir=None).counter_interval / POLL_S)
    if not counters or len(plain) < per_read - 1:
        msg = (
            f"the recording is too short: {len(plain)} plain reports and {len(counters)} "
            f"that read counters; need {per_read - 1} and 1 (record more --seconds)"
        )
        raise RuntimeError(msg)
    return [*plain[: per_read - 1], counters[-1]]


def build(tape: Tape, gpus: dict[str, int], meta: dict[str, Any]) -> Recording:
    busy = tape.messages[BUSY]
    hello = busy[0][1].hello
    reports = [m.report for _, m in busy if m.WhichOneof("body") == "report"]
    events = [m.event for _, m in busy if m.WhichOneof("body") == "event"]
    aer = [e for e in events if e.kind == pb.EVENT_KIND_PCIE_AER]
    if not aer:
        msg = f"the busy node sent no AER event (events: {[e.kind for e in events]})"
        raise RuntimeError(msg)
    faults = {}
    for node, name in fault_nodes().items():
        kept = tape.messages[node]
        mark = next(i for i, (_, m) in enumerate(kept) if m.WhichOneof("body") is None)
        at = kept[mark][0]
        script: list[tuple[str, bytes]] = []
        for t, m in kept[mark + 1 :]:
            body = m.WhichOneof("body")
            if t - at > SCRIPT_S * 1.0:
                break
            if body == "event":
                script.append(("event", m.event.SerializeToString()))
            elif body == "report" and sample_count(m.report):
                script.append(("report", samples_of(m.report)))
        if not script:
            msg = f"{name}: the agent sent nothing within {SCRIPT_S:g} s of the fault"
            raise RuntimeError(msg)
        uuids = [g.uuid for g in kept[0][1].hello.gpus]
        faults[name] = FaultScript(gpu=gpus[node], uuids=uuids, messages=script)
    return Recording(
        hello=hello.SerializeToString(),
        first=samples_of(reports[0]),
        steady=[samples_of(r) for r in steady_cycle(reports[1:])],
        probe=aer[0].SerializeToString(),
        uuids=[g.uuid for g in hello.gpus],
        faults=faults,
        meta=meta,
    )


def describe(rec: Recording) -> str:
    sizes = [len(s) for s in rec.steady]
    counts = [sample_count(pb.Report.FromString(s)) for s in rec.steady]
    lines = [
        (
            f"recording: first report {sample_count(pb.Report.FromString(rec.first))} samples "
            f"({len(rec.first):,} bytes); {len(rec.steady)} steady reports, "
            f"{min(counts)}-{max(counts)} samples (mean {sum(counts) / len(counts):.1f}), "
            f"{min(sizes)}-{max(sizes)} bytes (mean {sum(sizes) / len(sizes):.0f})"
        ),
    ]
    for name, f in rec.faults.items():
        kinds = []
        for kind, raw in f.messages:
            if kind == "event":
                e = pb.Event.FromString(raw)
                kinds.append(f"event {pb.EventKind.Name(e.kind)} xid {e.xid}")
            else:
                kinds.append(f"report of {sample_count(pb.Report.FromString(raw))} samples")
        lines.append(f"  fault {name} (GPU {f.gpu}): {'; '.join(kinds)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=66.0, help="agent seconds to record")
    parser.add_argument("--speed", type=float, default=4.0, help="agent clock speed-up")
    parser.add_argument(
        "--gauge-interval",
        type=float,
        default=AgentConfig(node="x", state_dir=None).gauge_interval,
        help="the agents' gauge_interval (default the production one; 0: every change travels)",
    )
    args = parser.parse_args()
    configure_logging("warning", "json")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fleetwatch-record-") as tmp:
        tape, gpus = asyncio.run(record(args.seconds, args.speed, Path(tmp), args.gauge_interval))
    meta = {
        "agent_seconds": args.seconds,
        "speed": args.speed,
        "poll_interval_s": POLL_S,
        "heartbeat_interval_s": POLL_S,
        "counter_interval_s": AgentConfig(node="x", state_dir=None).counter_interval,
        "gauge_interval_s": args.gauge_interval,
        "record_wall_s": round(time.monotonic() - began, 1),
    }
    rec = build(tape, gpus, meta)
    check_rendering(rec)
    rec.save(args.out)
    print(describe(rec), flush=True)


if __name__ == "__main__":
    main()
