"""A restart storm: thousands of Hellos arrive while the collector's event loop is busy.

gRPC keeps the calls its server has not taken up yet in a queue, and by default cancels those
beyond 3,000 at once: after a restart each of those agents saw CANCELLED within a second and
backed off, longer each time, and that was the restart's long tail. The collector's queue holds
a fleet (``fleetwatch.wire.settings.MAX_PENDING_STREAMS``): every Hello waits its turn.
"""

import asyncio
import threading
import time

import grpc
import pytest

from collector.main import CollectorService
from fleetwatch.testing import made_up_hello
from fleetwatch.wire import settings
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

pytestmark = pytest.mark.integration

HELLOS = 3_300  # past gRPC's default of 3,000 waiting calls


async def hello_on(channel: grpc.aio.Channel, i: int, outcomes: dict[str, int]) -> None:
    """Node ``i``'s Hello on a stream of its own; count its Welcome, or its error."""
    call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(settings.STREAM_METHOD)()
    hello = made_up_hello(f"storm-{i:05d}", gpus=0, nvlinks=0, ib_ports=0)
    try:
        await call.write(pb.AgentMessage(hello=hello).SerializeToString())
        raw = await call.read()
        assert isinstance(raw, bytes)
        body = pb.CollectorMessage.FromString(raw).WhichOneof("body") or "nothing"
        outcomes[body] = outcomes.get(body, 0) + 1
    except grpc.aio.AioRpcError as exc:
        outcomes[exc.code().name] = outcomes.get(exc.code().name, 0) + 1
    finally:
        call.cancel()


async def say_hellos(port: int, outcomes: dict[str, int]) -> None:
    """Every node's Hello, each on a stream of its own (on one connection)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.gather(*(hello_on(channel, i, outcomes) for i in range(HELLOS)))


async def test_a_storm_of_hellos_waits_its_turn_and_none_is_cancelled(
    collector: CollectorService,
):
    outcomes: dict[str, int] = {}
    sender = threading.Thread(
        target=lambda: asyncio.run(say_hellos(collector.grpc_port, outcomes)), daemon=True
    )
    sender.start()
    # The collector's loop (this one) is busy for 5 s, as with a restart's first Reports: no
    # stream is taken up meanwhile, and every Hello that arrives waits in gRPC's queue.
    time.sleep(5.0)  # blocking the loop is the point
    deadline = time.monotonic() + 120
    while sender.is_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not sender.is_alive(), f"the Hellos did not finish: {outcomes}"
    assert outcomes == {"welcome": HELLOS}
