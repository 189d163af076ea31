"""A real collector and eight simulated agents over gRPC on loopback."""

import asyncio
import functools
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client.parser import text_string_to_metric_families

from agent.sim.cluster import SimCluster
from collector.main import CollectorService
from collector.model.state import NodeState
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_for_more, wait_until
from fleetwatch.wire import settings
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

pytestmark = pytest.mark.integration

NODES = [f"node-{i}" for i in range(1, 9)]


@pytest.fixture
async def cluster(collector: CollectorService, tmp_path: Path) -> AsyncIterator[SimCluster]:
    sim = SimCluster(
        NODES,
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{collector.grpc_port}",
        poll_interval=0.05,
        heartbeat_interval=0.2,
        backoff_initial=0.05,
        backoff_max=0.5,
    )
    sim.start()
    await wait_until(
        lambda: sum(n.connected for n in collector.fleet.snapshot().values()) == len(NODES),
        what="all agents connected",
    )
    try:
        yield sim
    finally:
        await sim.stop()


def journal_view(collector: CollectorService) -> Counter[tuple[str, str, str, int]]:
    rows = collector.reader.events(limit=10_000)
    return Counter((r.node, r.kind, r.gpu_uuid or r.device, r.xid) for r in rows)


def scrape(collector: CollectorService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://127.0.0.1:{collector.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get_json(collector: CollectorService, path: str) -> object:
    url = f"http://127.0.0.1:{collector.http_port}{path}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


async def more_polls(cluster: SimCluster, more: int) -> None:
    """Wait until every running agent of ``cluster`` polled ``more`` times from now."""
    for name, agent in cluster.agents.items():
        if cluster.running(name):
            await wait_for_more(
                functools.partial(getattr, agent, "polls"), more, what=f"{name}'s polls"
            )


async def settle(collector: CollectorService, cluster: SimCluster, expected: int) -> None:
    await wait_until(lambda: collector.reader.count() >= expected, what=f"{expected} events")
    await wait_until(lambda: cluster.unacked() == 0, what="every event acked")
    await more_polls(cluster, 6)  # a few more polls: nothing further may appear


class TestEndToEnd:
    async def test_journal_holds_exactly_the_injected_events(self, collector, cluster):
        """Each fault on each node reaches the journal once, with its evidence, and is acked."""
        n = cluster.nodes
        n["node-1"].xid(3, 79)
        n["node-2"].xid(0, 13)
        n["node-3"].nvlink_down(5, 7)
        n["node-4"].ib_port_down(2)
        n["node-6"].pci_remove(1)
        await wait_until(lambda: collector.reader.count() >= 5, what="first faults")
        n["node-4"].ib_port_up(2)
        n["node-5"].xid(7, 48)
        expected = Counter(
            {
                ("node-1", "gpu_lost", n["node-1"].gpus[3].uuid, 79): 1,
                ("node-2", "xid", n["node-2"].gpus[0].uuid, 13): 1,
                ("node-3", "nvlink_down", n["node-3"].gpus[5].uuid, 0): 1,
                ("node-4", "ib_port_down", "mlx5_2", 0): 1,
                ("node-4", "ib_port_up", "mlx5_2", 0): 1,
                ("node-5", "xid", n["node-5"].gpus[7].uuid, 48): 1,
                ("node-6", "gpu_lost", n["node-6"].gpus[1].uuid, 0): 1,
            },
        )
        await settle(collector, cluster, sum(expected.values()))
        assert journal_view(collector) == expected
        rows = collector.reader.events(kind="gpu_lost", node="node-1")
        assert "fallen off the bus" in rows[0].detail
        assert rows[0].xid_class == "bus"
        assert [r.seq for r in collector.reader.events(node="node-4")] == [1, 2]

    async def test_metrics_match_the_model(self, collector, cluster):
        """/metrics, parsed by prometheus-client, says what the fleet model says."""
        n = cluster.nodes
        n["node-1"].xid(3, 79)
        n["node-3"].nvlink_down(5, 7)
        n["node-3"].nvlink_down(5, 8)
        n["node-4"].ib_port_down(2)
        n["node-7"].pcie_replays(2, 41)
        await wait_until(
            lambda: (
                collector.fleet.snapshot()["node-7"]
                .gpus[n["node-7"].gpus[2].uuid]
                .pcie_replay_count
                == 41
            ),
            what="replays reported",
        )
        await settle(collector, cluster, 5)  # the replays also leave an AER report in the log
        m = scrape(collector)
        model = collector.fleet.snapshot()
        for name in NODES:
            assert m["fleetwatch_node_up", (("node", name),)] == 1.0
            assert m["fleetwatch_node_connected", (("node", name),)] == 1.0
            for gpu in model[name].gpus.values():
                labels = (("gpu", str(gpu.index)), ("node", name))
                assert m["fleetwatch_gpu_present", labels] == float(gpu.present)
                assert m["fleetwatch_gpu_nvlinks_down", labels] == gpu.nvlinks_down
                assert m["fleetwatch_gpu_nvlinks", labels] == 18
            for port in model[name].ports.values():
                port_labels = (("device", port.device), ("node", name), ("port", "1"))
                assert m["fleetwatch_ib_port_up", port_labels] == float(port.up)
        assert m["fleetwatch_gpu_present", (("gpu", "3"), ("node", "node-1"))] == 0.0
        assert m["fleetwatch_gpu_nvlinks_down", (("gpu", "5"), ("node", "node-3"))] == 2
        assert (
            m["fleetwatch_ib_port_up", (("device", "mlx5_2"), ("node", "node-4"), ("port", "1"))]
            == 0
        )
        assert (
            m[
                "fleetwatch_ib_port_link_downed_total",
                (("device", "mlx5_2"), ("node", "node-4"), ("port", "1")),
            ]
            == 1
        )
        assert m["fleetwatch_gpu_pcie_replays_total", (("gpu", "2"), ("node", "node-7"))] == 41
        xid_labels = (("class", "bus"), ("gpu", "3"), ("node", "node-1"), ("xid", "79"))
        assert m["fleetwatch_gpu_xid_errors_total", xid_labels] == 1
        assert m["fleetwatch_collector_events_journaled_total", ()] == 5
        aer = collector.reader.events(kind="pcie_aer")
        assert [(r.node, r.gpu_uuid) for r in aer] == [("node-7", n["node-7"].gpus[2].uuid)]
        assert m["fleetwatch_collector_streams_active", ()] == 8

    async def test_json_api(self, collector, cluster):
        """The JSON API lists nodes, details one down to links and ports, and pages events."""
        cluster.nodes["node-2"].nvlink_down(1, 4)
        await settle(collector, cluster, 1)
        nodes = get_json(collector, "/api/v1/nodes")
        assert isinstance(nodes, dict)
        assert sorted(x["name"] for x in nodes["nodes"]) == NODES
        detail = get_json(collector, "/api/v1/nodes/node-2")
        assert isinstance(detail, dict)
        assert detail["gpus"][1]["nvlinks_down"] == [4]
        assert len(detail["ib_ports"]) == 8
        events = get_json(collector, "/api/v1/events?kind=nvlink_down&limit=5")
        assert isinstance(events, dict)
        assert [e["target"]["index"] for e in events["events"]] == [4]
        for bad in (
            "/api/v1/events?limit=0",
            "/api/v1/events?kind=bogus",
            "/api/v1/events?after=x",
        ):
            with pytest.raises(urllib.error.HTTPError) as info:
                get_json(collector, bad)
            info.value.close()
            assert info.value.code == 400
        with pytest.raises(urllib.error.HTTPError) as info:
            get_json(collector, "/api/v1/nodes/nope")
        info.value.close()
        assert info.value.code == 404

    async def test_silent_node_becomes_unreachable_then_returns(self, collector, cluster, tmp_path):
        """A crashed agent is marked unreachable (an event); a restarted one is reachable again
        and its new events are not mistaken for duplicates of the old process's."""
        cluster.nodes["node-8"].xid(0, 13)
        await settle(collector, cluster, 1)
        await cluster.crash("node-8")
        await wait_until(
            lambda: not collector.fleet.snapshot()["node-8"].reachable,
            what="node-8 unreachable",
        )
        assert [r.kind for r in collector.reader.events(node="node-8")] == [
            "xid",
            "node_unreachable",
        ]
        assert scrape(collector)["fleetwatch_node_up", (("node", "node-8"),)] == 0.0
        # Built off the loop: a node's simulated sysfs tree takes a second or more to write on
        # a loaded machine, and a loop held that long leaves the other nodes' heartbeats unread
        # past the collector's silence limit (1.5 s here): they would turn unreachable.
        again = await asyncio.to_thread(
            SimCluster,
            ["node-8"],
            tmp_path / "again",
            SystemClock(),
            f"127.0.0.1:{collector.grpc_port}",
            poll_interval=0.05,
            heartbeat_interval=0.2,
        )
        again.start()
        try:
            await wait_until(lambda: collector.fleet.snapshot()["node-8"].reachable, what="back")
            again.nodes["node-8"].xid(1, 31)
            await wait_until(
                lambda: len(collector.reader.events(node="node-8")) >= 4, what="new event"
            )
            rows = collector.reader.events(node="node-8")
            assert [(r.kind, r.seq) for r in rows] == [
                ("xid", 1),
                ("node_unreachable", None),
                ("node_reachable", None),
                ("xid", 2),
            ]
        finally:
            await again.stop()


async def raw_stream(port: int, messages: list[bytes]) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(
            settings.STREAM_METHOD,
        )()
        try:
            for message in messages:
                await call.write(message)
            while True:
                await call.read()
        except grpc.aio.AioRpcError as exc:
            return exc
    pytest.fail("the collector did not refuse the stream")


class TestBadInput:
    async def test_bad_clients_are_refused_counted_and_others_go_on(self, collector, cluster):
        """Malformed, oversized and out-of-order streams get a clear status and a count; the
        good agents keep streaming and their events keep arriving."""
        port = collector.grpc_port
        garbage = await raw_stream(port, [b"\xff\xfe\xfd\xfc"])
        assert garbage.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid AgentMessage" in (garbage.details() or "")
        oversized = await raw_stream(port, [b"\x12" + b"\x00" * (settings.MAX_MESSAGE_BYTES + 10)])
        assert oversized.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "exceeds" in (oversized.details() or "")
        report_first = pb.AgentMessage(report=pb.Report()).SerializeToString()
        no_hello = await raw_stream(port, [report_first])
        assert no_hello.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "first message must be a Hello" in (no_hello.details() or "")
        bad_hello = pb.AgentMessage(hello=pb.Hello(node="x y", boot_id="b", protocol_version=1))
        refused = await raw_stream(port, [bad_hello.SerializeToString()])
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "node name" in (refused.details() or "")

        m = scrape(collector)
        for reason in ("malformed", "oversized", "protocol", "invalid_hello"):
            assert m["fleetwatch_collector_messages_rejected_total", (("reason", reason),)] == 1
        cluster.nodes["node-3"].xid(2, 13)
        await settle(collector, cluster, 1)
        assert [r.xid for r in collector.reader.events(node="node-3")] == [13]
        assert sum(n.connected for n in collector.fleet.snapshot().values()) == 8

    async def test_out_of_order_event_is_refused_and_nothing_before_it_lost(self, collector):
        """A stream that skips a sequence number is closed; the events before it stay journaled."""
        uuid = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"
        hello = pb.Hello(
            node="rogue",
            boot_id="b-1",
            protocol_version=1,
            gpus=[pb.Gpu(index=0, uuid=uuid, pci_bus_id="0000:18:00.0")],
        )

        def ev(seq: int) -> bytes:
            target = pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=uuid)
            event = pb.Event(seq=seq, time_unix_ms=1, kind=pb.EVENT_KIND_XID, target=target, xid=13)
            return pb.AgentMessage(event=event).SerializeToString()

        err = await raw_stream(
            collector.grpc_port,
            [pb.AgentMessage(hello=hello).SerializeToString(), ev(1), ev(2), ev(4)],
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "seq 4 out of order: expected 3" in (err.details() or "")
        assert [r.seq for r in collector.reader.events(node="rogue")] == [1, 2]


ROGUE_UUID = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"
REJECTED = "fleetwatch_collector_messages_rejected_total"


def rogue_hello(node: str = "rogue") -> bytes:
    gpu = pb.Gpu(index=0, uuid=ROGUE_UUID, pci_bus_id="0000:18:00.0")
    hello = pb.Hello(node=node, boot_id="b-1", protocol_version=1, gpus=[gpu])
    return pb.AgentMessage(hello=hello).SerializeToString()


def rogue_event(seq: int) -> bytes:
    target = pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=ROGUE_UUID)
    event = pb.Event(seq=seq, time_unix_ms=1, kind=pb.EVENT_KIND_XID, target=target, xid=13)
    return pb.AgentMessage(event=event).SerializeToString()


async def acked_stream(port: int, messages: list[bytes], last_seq: int) -> list[int]:
    """Send ``messages``, read until the ack for ``last_seq``, close cleanly; return the acks."""
    acks: list[int] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(
            settings.STREAM_METHOD,
        )()
        for message in messages:
            await call.write(message)
        while not acks or acks[-1] < last_seq:
            raw = await call.read()
            assert isinstance(raw, bytes)
            reply = pb.CollectorMessage.FromString(raw)
            if reply.WhichOneof("body") == "ack":
                acks.append(reply.ack.seq)
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
    return acks


class TestGroupedReports:
    async def test_grouped_samples_are_taken_and_bad_groups_counted(self, collector):
        """The Welcome says grouped_reports; a Report grouped by target lands in the model, and
        a group with uneven columns or an undeclared target is refused and counted by reason
        while the rest of the Report is taken."""
        gpu = pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=ROGUE_UUID)
        good = pb.TargetSamples(
            target=gpu,
            int_signals=["temperature_celsius"],
            int_values=[66],
            real_signals=["power_watts"],
            real_values=[401.5],
        )
        uneven = pb.TargetSamples(target=gpu, int_signals=["sm_clock_mhz"], int_values=[1, 2])
        stranger = pb.TargetSamples(
            target=pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid="GPU-ffffffff-0000"),
            real_signals=["power_watts"],
            real_values=[1.0],
        )
        report = pb.AgentMessage(report=pb.Report(targets=[uneven, good, stranger]))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{collector.grpc_port}") as channel:
            call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(
                settings.STREAM_METHOD,
            )()
            await call.write(rogue_hello())
            raw = await call.read()
            assert isinstance(raw, bytes)
            assert pb.CollectorMessage.FromString(raw).welcome.grouped_reports
            await call.write(report.SerializeToString())
            await call.write(rogue_event(1))  # acked after the Report before it is applied
            while True:
                raw = await call.read()
                assert isinstance(raw, bytes)
                if pb.CollectorMessage.FromString(raw).ack.seq == 1:
                    break
            await call.done_writing()
        signals = collector.fleet.snapshot()["rogue"].gpus[ROGUE_UUID].signals
        assert signals["temperature_celsius"] == 66
        assert signals["power_watts"] == 401.5
        assert "sm_clock_mhz" not in signals
        m = scrape(collector)
        refused = "fleetwatch_collector_samples_rejected_total"
        assert m[refused, (("reason", "uneven_columns"),)] == 2
        assert m[refused, (("reason", "bad_target"),)] == 1


class TestBadNumbers:
    async def test_an_unstorable_seq_is_refused_and_counted_while_others_stream(
        self, collector, cluster
    ):
        """A valid node whose event 1 is journaled opens a new stream with Event(seq=2**63), a
        number no 64-bit column holds, while the other nodes stream Xids: it is refused at the
        door with a status naming the number and counted, its event 1 stays; every other
        node's events are journaled and acked, and none of their streams was ended."""
        port = collector.grpc_port
        assert await acked_stream(port, [rogue_hello(), rogue_event(1)], 1) == [1]
        nodes = cluster.nodes
        for i, name in enumerate(NODES):
            nodes[name].xid(i % 8, 13)
        rogue = asyncio.ensure_future(raw_stream(port, [rogue_hello(), rogue_event(2**63)]))
        for i, name in enumerate(NODES):
            nodes[name].xid(i % 8, 31)
        err = await rogue
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "seq 9223372036854775808 out of range" in (err.details() or "")
        for i, name in enumerate(NODES):
            nodes[name].xid(i % 8, 43)

        def journaled() -> dict[str, list[int]]:
            rows = collector.reader.events(kind="xid", limit=10_000)
            out: dict[str, list[int]] = {}
            for r in rows:
                out.setdefault(r.node, []).append(r.xid)
            return out

        await wait_until(
            lambda: all(len(journaled().get(n, [])) == 3 for n in NODES), what="24 Xids"
        )
        await wait_until(lambda: cluster.unacked() == 0, what="every event acked")
        view = journaled()
        assert all(view[n] == [13, 31, 43] for n in NODES)
        assert view["rogue"] == [13]
        assert [r.seq for r in collector.reader.events(node="rogue")] == [1]
        m = scrape(collector)
        assert (
            m["fleetwatch_collector_messages_rejected_total", (("reason", "invalid_event"),)] == 1
        )
        assert collector.stats.streams_total == len(NODES) + 2  # no good node reconnected
        assert sum(n.connected for n in collector.fleet.snapshot().values()) == len(NODES)

    async def test_a_stream_that_starts_past_a_gap_is_refused(self, collector):
        """Over gRPC: a node's events 1-3 are journaled and acked; its next stream starts at 5.
        The collector refuses it naming the gap (an ack for 5 would say 4 is journaled), counts
        it, and acks nothing; a stream that sends 4 and 5 is then taken."""
        port = collector.grpc_port
        acks = await acked_stream(port, [rogue_hello(), *map(rogue_event, (1, 2, 3))], 3)
        assert acks == [1, 2, 3]
        err = await raw_stream(port, [rogue_hello(), rogue_event(5)])
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "event seq 5 skips 4: the journal holds this boot's events through 3" in (
            err.details() or ""
        )
        assert [r.seq for r in collector.reader.events(node="rogue")] == [1, 2, 3]
        m = scrape(collector)
        assert m[REJECTED, (("reason", "seq_gap"),)] == 1
        assert m["fleetwatch_collector_seq_gaps_total", ()] == 1
        acks = await acked_stream(port, [rogue_hello(), rogue_event(4), rogue_event(5)], 5)
        assert acks == [4, 5]
        assert [r.seq for r in collector.reader.events(node="rogue")] == [1, 2, 3, 4, 5]


class TestHealth:
    async def test_health_service_reports_serving(self, collector):
        """The standard gRPC health service answers SERVING for the Fleet service."""
        async with grpc.aio.insecure_channel(f"127.0.0.1:{collector.grpc_port}") as channel:
            check = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )
            reply = await check(health_pb2.HealthCheckRequest(service=settings.SERVICE_NAME))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

    def test_server_accepts_the_client_keepalive(self):
        """The server's minimum ping interval lets the agent ping as often as it does."""
        client = dict(settings.client_options())
        server = dict(settings.server_options())
        assert (
            client["grpc.keepalive_time_ms"]
            >= server["grpc.http2.min_ping_interval_without_data_ms"]
        )
        assert client["grpc.keepalive_permit_without_calls"] == 1
        assert server["grpc.keepalive_permit_without_calls"] == 1


def ib_rates_in(node: NodeState) -> bool:
    """Whether every IB port of ``node`` has a rate (sent from the second counter read on)."""
    return bool(node.ports) and all(
        any(signal.endswith("_per_second") for signal in port.signals)
        for port in node.ports.values()
    )


class TestChangesOnly:
    async def test_idle_agents_send_heartbeats_but_no_samples(self, collector, cluster):
        """After the first full report, a quiet node costs heartbeats only; one change costs one
        sample."""
        await wait_until(lambda: collector.stats.reports >= 8, what="first reports")
        # A second read of the sysfs counters (a counter interval later) adds their rates.
        await wait_until(
            lambda: (
                len(collector.fleet.view()) == 8
                and all(ib_rates_in(node) for node in collector.fleet.view().values())
            ),
            what="the rates of every IB port",
        )
        samples, reports = collector.stats.samples, collector.stats.reports
        assert samples >= 8 * (8 * 18 + 8)  # at least every NVLink and GPU of every node
        began = time.monotonic()
        await more_polls(cluster, 20)  # at least a second: 20 poll intervals of 0.05 s
        # The collector asked for a heartbeat every 0.5 s: at least one from each node by now.
        await wait_until(lambda: collector.stats.reports >= reports + 8, what="heartbeats")
        elapsed = time.monotonic() - began
        assert collector.stats.samples == samples
        # Heartbeats only, however long the polls took: about one per node each 0.5 s.
        assert collector.stats.reports <= reports + 8 * (2 + elapsed / 0.5)
        cluster.nodes["node-2"].nvlink_errors(4, 9, replay=3, recovery=0, crc=0)
        await wait_until(lambda: collector.stats.samples > samples, what="the change")
        await more_polls(cluster, 6)  # nothing else changed: no other sample may come
        assert collector.stats.samples == samples + 1
