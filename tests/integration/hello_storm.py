"""Send a storm of Hellos to a collector, each on a stream of its own; print what came back.

Run as ``python -m tests.integration.hello_storm PORT COUNT``; prints one JSON line of outcomes
(``{"welcome": 3300}``). A process of its own: gRPC's asyncio stack serves one event loop a
process, and a second loop in a thread of the collector's process could leave a stream that
neither loop finished (a test run hung at the end of test_hello_queue.py that way).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import grpc

from fleetwatch.testing import made_up_hello
from fleetwatch.wire import settings
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb


async def hello_on(channel: grpc.aio.Channel, i: int, outcomes: dict[str, int]) -> None:
    """Node ``i``'s Hello on a stream of its own; count its Welcome, or its error."""
    call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(settings.STREAM_METHOD)()
    hello = made_up_hello(f"storm-{i:05d}", gpus=0, nvlinks=0, ib_ports=0)
    try:
        await call.write(pb.AgentMessage(hello=hello).SerializeToString())
        raw = await call.read()
        body = "nothing"
        if isinstance(raw, bytes):
            body = pb.CollectorMessage.FromString(raw).WhichOneof("body") or "nothing"
        outcomes[body] = outcomes.get(body, 0) + 1
    except grpc.aio.AioRpcError as exc:
        outcomes[exc.code().name] = outcomes.get(exc.code().name, 0) + 1
    finally:
        call.cancel()


async def say_hellos(port: int, count: int) -> dict[str, int]:
    """Every node's Hello, each on a stream of its own (on one connection)."""
    outcomes: dict[str, int] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.gather(*(hello_on(channel, i, outcomes) for i in range(count)))
    return outcomes


def main() -> None:
    """Parse PORT COUNT, send, print the outcomes."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("count", type=int)
    args = parser.parse_args()
    sys.stdout.write(json.dumps(asyncio.run(say_hellos(args.port, args.count))) + "\n")


if __name__ == "__main__":
    main()
