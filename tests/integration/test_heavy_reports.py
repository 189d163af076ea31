"""A fleet's first Reports, arriving together, are worked off a share of each loop turn.

After a restart thousands of nodes send their first Report (1,500 samples each) within seconds;
run as they came, they made one turn of the event loop seconds long. Each is applied whole, in
its stream's order, some of them at a later turn. Real gRPC streams to a real collector.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc
import pytest

from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.model import Target, sample_to_pb
from fleetwatch.testing import made_up_hello
from fleetwatch.wire import settings
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

NODES = 48
SIGNALS = ("temperature_celsius", "power_watts", "sm_clock_mhz", "memory_clock_mhz")


def first_report(hello: pb.Hello, value: int) -> pb.AgentMessage:
    """A first Report as big as a real one: every GPU's signals, many times over."""
    samples = [
        sample_to_pb(Target.gpu(g.uuid), signal, value)
        for _ in range(40)
        for g in hello.gpus
        for signal in SIGNALS
    ]
    return pb.AgentMessage(report=pb.Report(samples=samples))


async def test_first_reports_that_come_together_are_each_applied_some_at_a_later_turn(
    collector_config: Callable[..., CollectorConfig],
):
    service = CollectorService(collector_config(), SystemClock())
    await service.start()
    channels: list[grpc.aio.Channel] = []
    try:
        port = service.grpc_port
        calls = []
        hellos = [made_up_hello(f"n{i:02d}", gpus=8, ib_ports=0) for i in range(NODES)]
        for hello in hellos:
            options = [*settings.client_options(), ("grpc.use_local_subchannel_pool", 1)]
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options)
            channels.append(channel)
            call = channel.stream_stream(
                f"/{settings.SERVICE_NAME}/Stream",
                request_serializer=pb.AgentMessage.SerializeToString,
                response_deserializer=pb.CollectorMessage.FromString,
            )()
            await call.write(pb.AgentMessage(hello=hello))
            welcome = await call.read()
            assert isinstance(welcome, pb.CollectorMessage)
            assert welcome.WhichOneof("body") == "welcome"
            calls.append(call)
        await asyncio.gather(
            *(
                c.write(first_report(h, 60 + i % 20))
                for i, (h, c) in enumerate(zip(hellos, calls, strict=True))
            )
        )
        view = service.fleet.view
        async with asyncio.timeout(30):
            while service.stats.reports < NODES:
                await asyncio.sleep(0.01)
        for i, hello in enumerate(hellos):
            gpu = view()[hello.node].gpus[hello.gpus[0].uuid]
            assert gpu.signals["temperature_celsius"] == 60 + i % 20
        assert service.grpc.registry.heavy.queued > 0  # some waited for a later turn
        assert service.stats.reports_deferred == service.grpc.registry.heavy.queued
        for call in calls:
            call.cancel()
    finally:
        for channel in channels:
            await channel.close()
        await service.stop(grace=None)
