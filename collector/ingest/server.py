"""The gRPC server: the Fleet stream handler and the standard health service.

The handler takes raw bytes, so judging bad input is ours to do (and to count).

Several grpc.aio servers share the port (``SO_REUSEPORT``: the kernel spreads connections over
them). A grpc.aio server takes up its streams one at a time, each after two or three turns of
the event loop; after a restart, with the loop busy with the first Reports of the nodes already
back, one server took up some 90 streams a second and a 4,096-node fleet queued for 45-50 s
(bench/collector_ingest.py). Each server is one more stream taken up at a time.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import TYPE_CHECKING, Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from collector.exceptions import PortInUseError
from collector.ingest.session import SessionRegistry, StreamSession, handle_stream
from collector.ingest.throttle import DEFAULT_LIMITS
from fleetwatch.wire import settings
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.ingest.throttle import IngestLimits
    from collector.jobs.book import JobBook
    from collector.model.fleet import FleetModel
    from collector.stats import CollectorStats
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock

# gRPC servers sharing the port: streams taken up at once (see the module's docstring). Four
# were enough while gRPC's completions reached the loop one a turn (turns were short); with
# them drained (collector.ingest.grpc_wakeups) a storm's turns last 40-70 ms, and with four
# servers a 4,096-node restart had 147-231 streams cancelled before they were taken up and
# 49-169 agents without a Welcome in 30 s; with sixteen, none (docs/performance.md, tenth).
ACCEPTORS: Final = 16


class FleetServer:
    """Owns the grpc.aio server; sessions share the model, journal and counters."""

    def __init__(  # noqa: PLR0913 - shared collaborators for every session
        self,
        *,
        fleet: FleetModel,
        journal: Journal,
        stats: CollectorStats,
        clock: Clock,
        config: pb.Config,
        xid_class: Callable[[int], str],
        credentials: grpc.ServerCredentials | None = None,
        jobs: JobBook | None = None,
        limits: IngestLimits = DEFAULT_LIMITS,
    ) -> None:
        """Build the server; call :meth:`start` with an address. ``limits``: per-node budgets.

        ``xid_class``: an Xid's class in the collector's catalog in use now; it classes every
        event (the class an agent sends is evidence only).
        """
        self._jobs = jobs
        self._fleet = fleet
        self._journal = journal
        self._stats = stats
        self._clock = clock
        self._config = config
        self._xid_class = xid_class
        self._credentials = credentials
        self.registry = SessionRegistry(limits)
        self.health = health.aio.HealthServicer()
        # Each server's queue of streams not yet taken up holds a fleet: the kernel spreads
        # connections, not streams, and a proxy in front may bring every agent's stream on one.
        options = settings.server_options()
        self.servers = [grpc.aio.server(options=options) for _ in range(ACCEPTORS)]
        # Requests arrive as raw bytes: parsing them in the session lets a malformed or
        # oversized message be counted and answered with a status that says what was wrong.
        handler = grpc.method_handlers_generic_handler(
            settings.SERVICE_NAME,
            {
                "Stream": grpc.stream_stream_rpc_method_handler(
                    self._stream,
                    request_deserializer=None,
                    response_serializer=pb.CollectorMessage.SerializeToString,
                ),
            },
        )
        for server in self.servers:
            server.add_generic_rpc_handlers((handler,))
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)

    @property
    def server(self) -> grpc.aio.Server:
        """The first of the servers (they start and stop together)."""
        return self.servers[0]

    async def _stream(
        self,
        _requests: object,
        context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage],
    ) -> None:
        session = StreamSession(
            fleet=self._fleet,
            journal=self._journal,
            stats=self._stats,
            registry=self.registry,
            clock=self._clock,
            config=self._config,
            xid_class=self._xid_class,
            jobs=self._jobs,
            # With TLS, an agent speaks only for the node its client certificate names.
            verify_identity=self._credentials is not None,
        )
        await handle_stream(session, context)

    async def start(self, address: str) -> int:
        """Listen on ``address`` (host:port; port 0 picks one) and return the bound port.

        The first server binds ``address``; the others the port it got. A Unix socket's
        address gets one server.
        """
        servers = self.servers if not address.startswith("unix:") else self.servers[:1]
        if len(servers) > 1:
            refuse_a_port_in_use(address)
        port = self._bind(servers[0], address)
        host = address.rpartition(":")[0]
        for server in servers[1:]:
            if self._bind(server, f"{host}:{port}") != port:
                msg = f"could not share port {port} of {address} (SO_REUSEPORT)"
                raise RuntimeError(msg)
        self.servers = servers
        for server in servers:
            await server.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        await self.health.set("", serving)
        await self.health.set(settings.SERVICE_NAME, serving)
        return port

    def _bind(self, server: grpc.aio.Server, address: str) -> int:
        if self._credentials is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, self._credentials)

    async def stop(self, grace: float | None) -> None:
        """Say NOT_SERVING, then stop (``grace`` None cancels streams at once)."""
        await self.health.enter_graceful_shutdown()
        await asyncio.gather(*(server.stop(grace) for server in self.servers))


def refuse_a_port_in_use(address: str) -> None:
    """Raise PortInUseError when another socket listens on ``address``'s port (not port 0).

    The servers share their port with ``SO_REUSEPORT``, and gRPC sets it on every listener: a
    second collector of the same user started on the same port would share the first's
    connections, each taking some of the fleet, instead of failing to bind. A probe bound
    without ``SO_REUSEPORT`` (with ``SO_REUSEADDR``, so that connections of a collector just
    killed do not count) fails only where a socket listens.
    """
    host, _, port_text = address.rpartition(":")
    if not port_text.isdigit() or int(port_text) == 0:
        return
    port = int(port_text)
    try:
        found = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError:  # gRPC's bind says what is wrong with the address
        return
    for family, kind, proto, _, where in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(where)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    msg = f"listen {address}: port {port} is in use (another collector?)"
                    raise PortInUseError(msg) from exc
