"""A flood from one node against a real collector on loopback, beside a real (simulated) agent.

The flooder is a raw gRPC client that writes events as fast as the stream takes them: mostly one
Xid over and over, now and then another, and a report of impossible values. The collector holds
it to a small budget; the simulated node's Xids must all be journaled and acked while the flood
goes on, and every event of the flooder's that the journal holds must be there exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import TYPE_CHECKING

import grpc
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.sim.cluster import SimCluster
from collector.export.ingest import IngestCollector
from collector.ingest.throttle import IngestLimits, IngestThrottle
from fleetwatch.clock import SystemClock
from fleetwatch.testing import made_up_hello, made_up_uuid, wait_until
from fleetwatch.wire import settings
from fleetwatch.wire.repeats import seqs_covered
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from collector.main import CollectorService

pytestmark = pytest.mark.integration

FLOODER = "flooder"
LIMITS = IngestLimits(events_per_s=400.0, event_burst=400.0, repeat_burst=50)
HELD_S = 1.0  # how long, at the least, the flooder's stream must have been held back


def flood_event(seq: int, now_ms: int) -> bytes:
    """Xid 13 on GPU 0, except every 100th: Xid 31 on GPU 1 (which ends a coalesced run)."""
    other = seq % 100 == 0
    event = pb.Event(
        seq=seq,
        time_unix_ms=now_ms,
        kind=pb.EVENT_KIND_XID,
        target=pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=made_up_uuid(FLOODER, int(other))),
        xid=31 if other else 13,
        detail=f"NVRM: Xid flood {seq}",
    )
    return pb.AgentMessage(event=event).SerializeToString()


def hostile_report() -> bytes:
    gpu = pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=made_up_uuid(FLOODER, 0))
    samples = [
        pb.Sample(target=gpu, signal="temperature_celsius", real_value=1e12),
        pb.Sample(target=gpu, signal="power_watts", real_value=-5.0),
        pb.Sample(target=gpu, signal="power_watts", real_value=math.nan),
        pb.Sample(target=gpu, signal="sm_clock_mhz", int_value=1410),
    ]
    return pb.AgentMessage(report=pb.Report(samples=samples)).SerializeToString()


class Flooder:
    """Writes events as fast as the stream takes them; keeps the highest ack it gets."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.written = 0
        self.acked = 0

    async def run(self) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(
                settings.STREAM_METHOD
            )()
            hello = made_up_hello(FLOODER, gpus=2, nvlinks=0, ib_ports=0, boot_id="flood-1")
            await call.write(pb.AgentMessage(hello=hello).SerializeToString())
            await call.read()  # the Welcome
            reader = asyncio.create_task(self._acks(call))
            try:
                await call.write(hostile_report())
                now_ms = int(SystemClock().now() * 1000)
                while True:
                    await call.write(flood_event(self.written + 1, now_ms))
                    self.written += 1
            finally:
                reader.cancel()
                call.cancel()

    async def _acks(self, call: grpc.aio.StreamStreamCall[bytes, bytes]) -> None:
        while isinstance(raw := await call.read(), bytes):
            message = pb.CollectorMessage.FromString(raw)
            if message.WhichOneof("body") == "ack":
                self.acked = max(self.acked, message.ack.seq)


@pytest.fixture
async def node(collector: CollectorService, tmp_path: Path) -> AsyncIterator[SimCluster]:
    # Before any stream opens: the service's registry makes every session's budget.
    collector.grpc.registry.throttle = IngestThrottle(LIMITS)
    sim = SimCluster(
        ["node-1"],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{collector.grpc_port}",
        poll_interval=0.05,
        heartbeat_interval=0.2,
        backoff_initial=0.05,
        backoff_max=0.5,
    )
    sim.start()
    await wait_until(lambda: sim.agents["node-1"].link.connected, what="node-1 connected")
    try:
        yield sim
    finally:
        await sim.stop()


def ingest_metrics(collector: CollectorService) -> dict[tuple[str, tuple[str, ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(IngestCollector(collector.grpc.registry.throttle, collector.stats))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.values()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def throttled_s(collector: CollectorService) -> float:
    """How long the flooder's stream has been held back to its event budget so far."""
    key = "fleetwatch_node_ingest_throttled_seconds_total", ("events", FLOODER)
    return ingest_metrics(collector).get(key, 0.0)  # no series before it is first held back


async def test_a_flood_is_throttled_and_coalesced_and_slows_no_other_node(collector, node):
    """While one node floods, another node's Xids are journaled and acked; the flooder is held
    to its budget, its repeats coalesced, and none of its journaled events lost or doubled."""
    flooder = Flooder(collector.grpc_port)
    flood = asyncio.create_task(flooder.run())
    try:
        await wait_until(lambda: flooder.acked > LIMITS.event_burst, what="the flood is in")
        sim = node.nodes["node-1"]
        for gpu, xid in enumerate((13, 31, 43, 48, 63)):
            sim.xid(gpu, xid, f"during the flood {gpu}")
            await asyncio.sleep(0.2)  # spread over the flood: each must get through it
        await wait_until(lambda: node.unacked() == 0, what="node-1's events acked")
        assert not flood.done(), "the flood must still be running"
        await wait_until(
            lambda: throttled_s(collector) > HELD_S, what="the flooder held back for a while"
        )
    finally:
        flood.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flood

    mine = collector.reader.events(node="node-1", kind="xid", limit=100)
    assert sorted(r.xid for r in mine) == [13, 31, 43, 48, 63]

    # Every event of the flooder the journal holds is there once, from 1 up, and at least
    # everything it was acked for. A commit in flight when the flooder left lands all the same:
    # wait for the collector to see its stream end, then for that commit.
    await wait_until(
        lambda: not collector.fleet.snapshot()[FLOODER].connected, what="the flooder's stream ended"
    )
    await collector.grpc.registry.settle(FLOODER)
    rows = collector.reader.events(node=FLOODER, limit=100_000)
    seqs = [s for r in rows if r.seq is not None for s in seqs_covered(r.seq, r.detail)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(seqs) >= flooder.acked
    assert len(rows) < len(seqs) / 5, "alike events are coalesced into few rows"

    # Held to its budget: offered far more than it was let in, at about the budget's rate.
    assert flooder.written > 2 * flooder.acked
    m = ingest_metrics(collector)
    assert m["fleetwatch_node_ingest_throttled_seconds_total", ("events", FLOODER)] > HELD_S
    # a node never held back has no per-node series (the fleet target stays bounded)
    assert ("events", "node-1") not in {k[1] for k in m if k[0].startswith("fleetwatch_node_")}
    coalesced = collector.stats.events_coalesced
    assert m["fleetwatch_node_events_coalesced_total", (FLOODER,)] == coalesced > 0
    assert ("fleetwatch_node_events_coalesced_total", ("node-1",)) not in m
    assert m["fleetwatch_collector_ingest_throttled_total", ("events",)] > 0
    # Its impossible values were refused one by one, and the report's good sample taken.
    assert m["fleetwatch_collector_samples_rejected_total", ("out_of_range",)] == 1
    assert m["fleetwatch_collector_samples_rejected_total", ("negative",)] == 1
    assert m["fleetwatch_collector_samples_rejected_total", ("not_finite",)] == 1
    flood_gpu = collector.fleet.snapshot()[FLOODER].gpus[made_up_uuid(FLOODER, 0)]
    assert flood_gpu.number("sm_clock_mhz") == 1410
    assert flood_gpu.number("temperature_celsius") is None
    # The simulated node's own values are all plausible: nothing else was refused.
    assert sum(collector.stats.samples_rejected.values()) == 3
