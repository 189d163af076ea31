"""Several gRPC servers share the collector's port, so a fleet's streams are taken up in parallel.

A grpc.aio server takes up one stream at a time, each after two or three turns of the event loop;
after a restart, with the loop busy, one server was the restart's bottleneck.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from collector.exceptions import PortInUseError
from collector.ingest.server import ACCEPTORS
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import made_up_hello
from fleetwatch.wire import settings
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

AGENTS = 48


def listening_sockets(port: int) -> int:
    """The kernel's listening TCP sockets on ``port`` (IPv4 and IPv6)."""
    count = 0
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                count += 1
    return count


async def welcome_for(port: int, node: str) -> pb.CollectorMessage:
    """Open a stream on a connection of its own, say Hello, return the collector's answer."""
    options = [*settings.client_options(), ("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.stream_stream(
            f"/{settings.SERVICE_NAME}/Stream",
            request_serializer=pb.AgentMessage.SerializeToString,
            response_deserializer=pb.CollectorMessage.FromString,
        )()
        await call.write(pb.AgentMessage(hello=made_up_hello(node, gpus=1, ib_ports=0)))
        answer = await call.read()
        call.cancel()
        assert isinstance(answer, pb.CollectorMessage)
        return answer


async def test_several_servers_share_the_port_and_every_stream_is_served(
    collector_config: Callable[..., CollectorConfig],
):
    service = CollectorService(collector_config(), SystemClock())
    await service.start()
    try:
        assert ACCEPTORS > 1
        assert listening_sockets(service.grpc_port) == ACCEPTORS
        answers = await asyncio.wait_for(
            asyncio.gather(*(welcome_for(service.grpc_port, f"n{i:02d}") for i in range(AGENTS))),
            60,
        )
        assert [a.WhichOneof("body") for a in answers] == ["welcome"] * AGENTS
        assert len(service.fleet.view()) == AGENTS
    finally:
        await service.stop(grace=None)
    assert listening_sockets(service.grpc_port) == 0  # every server stopped


async def test_a_second_collector_on_the_port_refuses_to_start(
    collector_config: Callable[..., CollectorConfig], tmp_path: Path
):
    """With SO_REUSEPORT, a second collector on the same port would quietly take a share of the
    first's connections: it refuses to start instead, naming the port."""
    first = CollectorService(collector_config(), SystemClock())
    await first.start()
    try:
        port = first.grpc_port
        second = CollectorService(
            collector_config(
                listen=f"127.0.0.1:{port}", http="127.0.0.1:0", journal=tmp_path / "second.db"
            ),
            SystemClock(),
        )
        with pytest.raises(PortInUseError, match=f"port {port} is in use"):
            await second.start()
        await second.stop(grace=None)
        assert listening_sockets(port) == ACCEPTORS  # the first still has all of it
        answer = await welcome_for(port, "still-served")
        assert answer.WhichOneof("body") == "welcome"
    finally:
        await first.stop(grace=None)
