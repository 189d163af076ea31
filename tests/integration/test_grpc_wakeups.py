"""gRPC's completions reach a busy event loop in bursts, not one per turn.

grpcio's asyncio stack wakes the loop with a byte per completion and its reader takes one byte
a turn; once 278 bytes pile up its poller thread blocks, and completions then come one per turn
of the loop. A collector restart (thousands of streams at once) stalled the nodes already back
for ten seconds that way. Real gRPC streams on loopback; the loop kept busy 2 ms a turn.
"""

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from collector.ingest.grpc_wakeups import DrainedWakeups, drain_wakeups

pytestmark = pytest.mark.integration

STREAMS = 400  # open streams; one message each way on every one makes four completions each
METHOD = "/test.Echo/Stream"


async def _echo(requests: AsyncIterator[bytes], _context: object) -> AsyncIterator[bytes]:
    async for raw in requests:
        yield raw


async def _turns_for_a_burst(*, drained: bool) -> tuple[int, DrainedWakeups | None]:
    """Loop turns taken while every one of ``STREAMS`` streams echoes one message."""
    server = grpc.aio.server()
    echo: grpc.RpcMethodHandler[bytes, bytes] = grpc.stream_stream_rpc_method_handler(_echo)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Echo", {"Stream": echo}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    wakeups = drain_wakeups(asyncio.get_running_loop()) if drained else None
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    calls: list[grpc.aio.StreamStreamCall[bytes, bytes]] = [
        channel.stream_stream(METHOD)() for _ in range(STREAMS)
    ]
    try:
        for call in calls:
            await call.write(b"hello")
            assert await call.read() == b"hello"
        turns = 0
        done = False

        async def busy() -> None:  # a loop with work to do: 2 ms each turn
            nonlocal turns
            while not done:
                time.sleep(0.002)
                turns += 1
                await asyncio.sleep(0)

        async def one(call: grpc.aio.StreamStreamCall[bytes, bytes]) -> object:
            await call.write(b"again")
            return await call.read()

        worker = asyncio.create_task(busy())
        answers = await asyncio.gather(*(one(c) for c in calls))
        done = True
        await worker
        assert answers == [b"again"] * STREAMS
        return turns, wakeups
    finally:
        for call in calls:
            call.cancel()
        await channel.close()
        await server.stop(0)


async def test_a_burst_of_completions_reaches_the_loop_in_a_few_turns():
    turns, wakeups = await _turns_for_a_burst(drained=True)
    assert wakeups is not None, "gRPC's wakeup reader was not found"
    assert wakeups.drained > 0  # the burst's surplus bytes were read
    assert turns < STREAMS / 4, f"{turns} turns for {STREAMS} echoes"


async def test_without_the_drain_the_burst_takes_a_turn_a_completion():
    """What the drain is for: the same burst, gRPC's reader as it comes (this test fails, and
    the drain can go, once grpcio reads every byte it has written)."""
    turns, _ = await _turns_for_a_burst(drained=False)
    assert turns >= STREAMS, f"{turns} turns for {STREAMS} echoes"


async def test_the_drain_is_found_once():
    server = grpc.aio.server()
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        loop = asyncio.get_running_loop()
        first = drain_wakeups(loop)
        assert first is not None
        assert drain_wakeups(loop) is first
    finally:
        await server.stop(0)
