"""The floor under bench/collector_ingest.py: a collector that does nothing but read.

Run by ``bench/collector_ingest.py --floor`` in the collector's place (``bench/ingest/floor.py
collector --config FILE``, as the real one is started): the same gRPC server options and stream
method, a Welcome for each Hello, every message parsed, every event acked at once; no checks, no
model, no rules, no journal. What the benchmark measures against it is the cost of grpcio's
asyncio server and protobuf parsing alone at each fleet size, the peer the real collector's
figures are compared with.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc

from fleetwatch.wire import settings
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb


class Healthy(BaseHTTPRequestHandler):
    """``/healthz`` and an empty ``/metrics``: what the benchmark asks of a collector."""

    def do_GET(self) -> None:
        """Answer any path."""
        body = b"" if self.path == "/metrics" else b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        """Quiet."""


async def stream(
    _requests: object, context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage]
) -> None:
    """Welcome, then read and parse until the agent goes, acking each event."""
    raw: object = await context.read()
    if not isinstance(raw, bytes):
        return
    boot_id = pb.AgentMessage.FromString(raw).hello.boot_id
    welcome = pb.Welcome(journaled=pb.Ack(boot_id=boot_id, seq=0))
    await context.write(pb.CollectorMessage(welcome=welcome))
    while isinstance(raw := await context.read(), bytes):
        message = pb.AgentMessage.FromString(raw)
        if message.WhichOneof("body") == "event":
            ack = pb.Ack(boot_id=boot_id, seq=message.event.seq)
            await context.write(pb.CollectorMessage(ack=ack))


async def serve(config: Path) -> None:
    """Listen where the collector's configuration says, until killed."""
    with config.open("rb") as f:
        section = tomllib.load(f)["collector"]
    host, port = str(section["http"]).rsplit(":", 1)
    http = ThreadingHTTPServer((host, int(port)), Healthy)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    server = grpc.aio.server(options=settings.server_options())
    handler = grpc.method_handlers_generic_handler(
        settings.SERVICE_NAME,
        {
            "Stream": grpc.stream_stream_rpc_method_handler(
                stream,
                request_deserializer=None,
                response_serializer=pb.CollectorMessage.SerializeToString,
            ),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(str(section["listen"]))
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    """``bench/ingest/floor.py collector --config FILE``."""
    args = sys.argv[1:]
    if len(args) != 3 or args[:2] != ["collector", "--config"]:  # noqa: PLR2004
        sys.exit("usage: bench/ingest/floor.py collector --config FILE")
    asyncio.run(serve(Path(args[2])))


if __name__ == "__main__":
    main()
