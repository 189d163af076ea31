"""mTLS between real agents and a real collector on loopback, with certificates from our CA."""

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.agent import Agent
from agent.config import AgentConfig
from agent.exceptions import ConfigError as AgentConfigError
from agent.main import build_agent
from agent.sim.cluster import sim_hardware
from agent.sim.hardware import SimNode
from cli.main import main
from collector.exceptions import ConfigError
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_for_more, wait_until
from fleetwatch.wire import settings
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from tests.tls_pki import Pki, make_pki

pytestmark = pytest.mark.integration

# The collector's certificate names a host and the loopback address agents dial.
COLLECTOR_HOSTS = "collector.test,127.0.0.1"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def rogue(tmp_path: Path) -> Pki:
    """Another CA, which the collector does not trust."""
    return make_pki(tmp_path / "rogue")


@pytest.fixture
async def collector(collector_config, pki: Pki) -> AsyncIterator[CollectorService]:
    service = CollectorService(collector_config(**pki.collector(COLLECTOR_HOSTS)), SystemClock())
    await service.start()
    try:
        yield service
    finally:
        await service.stop(grace=None)


@contextlib.asynccontextmanager
async def running_agent(
    tmp_path: Path, collector: CollectorService, node: str, **tls: object
) -> AsyncIterator[tuple[SimNode, Agent]]:
    clock = SystemClock()
    sim = SimNode(node, tmp_path / "nodes" / node / "sys", clock)
    cfg = AgentConfig(
        collector=f"127.0.0.1:{collector.grpc_port}",
        node=node,
        poll_interval=0.05,
        heartbeat_interval=0.2,
        backoff_initial=0.05,
        backoff_max=0.2,
        counter_interval=1.0,
        state_dir=None,
        job_socket=None,
        **tls,  # type: ignore[arg-type]
    )
    agent = build_agent(cfg, sim_hardware(sim), clock)
    task = asyncio.create_task(agent.run())
    try:
        yield sim, agent
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def channel_credentials(files: dict[str, Path] | None, ca: Path) -> grpc.ChannelCredentials:
    if files is None:  # a client that checks the server but has no certificate of its own
        return grpc.ssl_channel_credentials(ca.read_bytes())
    return grpc.ssl_channel_credentials(
        ca.read_bytes(), files["tls_key"].read_bytes(), files["tls_cert"].read_bytes()
    )


async def raw_hello(port: int, credentials: grpc.ChannelCredentials, node: str) -> object:
    """Send a Hello for ``node`` over TLS; return the first reply or the error that ended it."""
    hello = pb.Hello(node=node, boot_id="b-1", protocol_version=1)
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(
            settings.STREAM_METHOD,
        )()
        try:
            await call.write(pb.AgentMessage(hello=hello).SerializeToString())
            first = await asyncio.wait_for(call.read(), 10)
            call.cancel()
        except grpc.aio.AioRpcError as exc:
            return exc
        return first


def rejected(collector: CollectorService) -> dict[str, float]:
    url = f"http://127.0.0.1:{collector.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "fleetwatch_collector_messages_rejected_total"
    }


class TestMutualTls:
    async def test_agent_with_its_node_certificate_streams_events(self, collector, pki, tmp_path):
        """An agent with its node's certificate connects over mTLS and its events are
        journaled and acked."""
        async with running_agent(tmp_path, collector, "node-1", **pki.node("node-1")) as (
            sim,
            agent,
        ):
            await wait_until(lambda: agent.link.connected, what="agent connected")
            sim.xid(2, 13)
            await wait_until(lambda: collector.reader.count() >= 1, what="event journaled")
            await wait_until(lambda: len(agent.outbox) == 0, what="event acked")
        rows = collector.reader.events(node="node-1")
        assert [(r.kind, r.xid) for r in rows] == [("xid", 13)]
        assert collector.stats.rejected_snapshot() == {}

    async def test_server_name_overrides_the_dialled_host(self, collector, pki, tmp_path):
        """tls_server_name makes the agent expect that name in the collector's certificate:
        a name it carries connects, another does not."""
        files = pki.node("node-1")
        async with running_agent(
            tmp_path, collector, "node-1", tls_server_name="collector.test", **files
        ) as (_, agent):
            await wait_until(lambda: agent.link.connected, what="agent connected")
        async with running_agent(
            tmp_path, collector, "node-1", tls_server_name="elsewhere.test", **files
        ) as (_, agent):
            await wait_until(lambda: agent.link.failures >= 2, what="failed handshakes")
            assert agent.link.connections == 0

    async def test_hello_for_another_node_is_denied_and_counted(self, collector, pki, tmp_path):
        """A node's certificate cannot speak for another node: PERMISSION_DENIED, counted as
        "identity" in /metrics, and the real node's stream is not replaced."""
        async with running_agent(tmp_path, collector, "node-1", **pki.node("node-1")) as (
            _,
            agent,
        ):
            await wait_until(lambda: agent.link.connected, what="node-1 connected")
            impostor = channel_credentials(pki.node("node-2"), pki.ca_cert)
            err = await raw_hello(collector.grpc_port, impostor, "node-1")
            assert isinstance(err, grpc.aio.AioRpcError)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "for node 'node-1', but the client certificate names 'node-2'" in (
                err.details() or ""
            )
            assert rejected(collector) == {"identity": 1.0}
            # node-1's stream goes on: a message read on it after the impostor's, polls later.
            heard = collector.fleet.snapshot()["node-1"].last_seen_mono
            await wait_until(
                lambda: collector.fleet.snapshot()["node-1"].last_seen_mono > heard,
                what="node-1 heard from again",
            )
            await wait_for_more(lambda: agent.polls, 6, what="the agent's polls")
            assert agent.link.connections == 1  # never superseded by the impostor
            assert collector.fleet.snapshot()["node-1"].connected

    async def test_an_agent_whose_certificate_names_another_node_gets_nowhere(
        self, collector, pki, tmp_path
    ):
        """Started with another node's certificate, the agent refuses to start (naming both);
        its Hello, sent anyway, is refused by the collector."""
        with pytest.raises(AgentConfigError, match="is for node-2, not for node node-1"):
            async with running_agent(tmp_path, collector, "node-1", **pki.node("node-2")):
                pass
        own = await raw_hello(
            collector.grpc_port, channel_credentials(pki.node("node-2"), pki.ca_cert), "node-2"
        )
        assert isinstance(own, bytes)  # the Welcome: its own name is fine
        assert "node-1" not in collector.fleet.snapshot()

    async def test_certificate_from_another_ca_cannot_connect(self, collector, pki, rogue):
        """A client certificate the client CA did not sign fails the TLS handshake: no stream
        ever reaches the collector."""
        # The client trusts the collector's CA, so only its own certificate is wrong.
        creds = channel_credentials(rogue.node("node-1"), pki.ca_cert)
        err = await raw_hello(collector.grpc_port, creds, "node-1")
        assert isinstance(err, grpc.aio.AioRpcError)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert collector.stats.streams_total == 0

    async def test_client_without_certificate_cannot_connect(self, collector, pki):
        """TLS without a client certificate, and plaintext, are both refused before any
        stream starts."""
        err = await raw_hello(collector.grpc_port, channel_credentials(None, pki.ca_cert), "node-1")
        assert isinstance(err, grpc.aio.AioRpcError)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.insecure_channel(f"127.0.0.1:{collector.grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as plain:
                await channel.stream_stream(settings.STREAM_METHOD)().read()
        assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
        assert collector.stats.streams_total == 0


class TestPlaintextMustBeExplicit:
    def test_collector_refuses_a_public_address_without_tls(self, collector_config):
        """Listening on 0.0.0.0 with no TLS keys fails at once, naming the keys and insecure."""
        with pytest.raises(
            ConfigError, match=r"listen 0\.0\.0\.0:0 is not a loopback address"
        ) as exc:
            CollectorService(collector_config(listen="0.0.0.0:0"), SystemClock())
        assert "tls_cert, tls_key and tls_client_ca" in str(exc.value)
        assert "insecure = true" in str(exc.value)

    def test_collector_command_says_so_in_one_line(self, capsys, tmp_path):
        """`fleetwatch collector --listen 0.0.0.0:...` without TLS exits 2 with one line."""
        args = ["--listen", "0.0.0.0:0", "--http", "127.0.0.1:0", "--journal", str(tmp_path / "j")]
        code = main(["collector", *args])
        err = capsys.readouterr().err.splitlines()
        assert code == 2
        assert err[-1].startswith(
            "fleetwatch collector: collector config: listen 0.0.0.0:0 is not a loopback address"
        )

    async def test_insecure_true_allows_plaintext(self, collector_config):
        """insecure = true is the operator's explicit choice: the collector then serves."""
        service = CollectorService(
            collector_config(listen="0.0.0.0:0", insecure=True), SystemClock()
        )
        await service.start()
        try:
            assert service.grpc_port > 0
        finally:
            await service.stop(grace=None)

    def test_agent_refuses_a_remote_collector_without_tls(self, tmp_path):
        """An agent pointed at a non-loopback collector without TLS fails to build, unless
        insecure = true."""
        clock = SystemClock()
        sim = SimNode("node-1", tmp_path / "sys", clock)
        cfg = AgentConfig(
            collector="10.20.0.5:7070", node="node-1", state_dir=None, job_socket=None
        )
        with pytest.raises(
            AgentConfigError, match=r"collector 10\.20\.0\.5:7070 is not a loopback"
        ):
            build_agent(cfg, sim_hardware(sim), clock)
        cfg = AgentConfig(
            collector="10.20.0.5:7070",
            node="node-1",
            state_dir=None,
            job_socket=None,
            insecure=True,
        )
        assert build_agent(cfg, sim_hardware(sim), clock).link.target == "10.20.0.5:7070"
