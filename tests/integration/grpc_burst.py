"""Count the event loop's turns while many gRPC streams echo once each, on a busy loop.

Run as ``python -m tests.integration.grpc_burst [--drained]``; prints one JSON line. Each run
is a process of its own: without the drain, gRPC's poller thread ends the burst blocked on its
wakeup socket with bytes unread, a state that later event loops in the same process do not
survive (it crashed a test run that went on in the same process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import TYPE_CHECKING

import grpc

from collector.ingest.grpc_wakeups import drain_wakeups

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

STREAMS = 400  # open streams; one message each way on every one makes four completions each
METHOD = "/test.Echo/Stream"


async def _echo(requests: AsyncIterator[bytes], _context: object) -> AsyncIterator[bytes]:
    async for raw in requests:
        yield raw


async def burst(*, drained: bool) -> dict[str, object]:
    """Loop turns taken while every one of ``STREAMS`` streams echoes one message."""
    server = grpc.aio.server()
    echo: grpc.RpcMethodHandler[bytes, bytes] = grpc.stream_stream_rpc_method_handler(_echo)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Echo", {"Stream": echo}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    loop = asyncio.get_running_loop()
    wakeups = drain_wakeups(loop) if drained else None
    found_again = drain_wakeups(loop) is wakeups if drained else None
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
        return {
            "streams": STREAMS,
            "turns": turns,
            "echoed": sum(a == b"again" for a in answers),
            "found": wakeups is not None,
            "found_again": found_again,
            "drained": wakeups.drained if wakeups is not None else 0,
        }
    finally:
        for call in calls:
            call.cancel()
        await channel.close()
        await server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--drained", action="store_true", help="drain gRPC's wakeup bytes")
    args = parser.parse_args()
    sys.stdout.write(json.dumps(asyncio.run(burst(drained=args.drained))) + "\n")


if __name__ == "__main__":
    main()
