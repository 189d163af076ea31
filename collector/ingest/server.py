"""The gRPC server: the Fleet stream handler and the standard health service.

The handler takes raw bytes, so judging bad input is ours to do (and to count).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from collector.ingest.session import SessionRegistry, StreamSession, handle_stream
from collector.ingest.throttle import DEFAULT_LIMITS
from fleetwatch.wire import settings
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collector.ingest.throttle import IngestLimits
    from collector.jobs.book import JobBook
    from collector.model.fleet import FleetModel
    from collector.stats import CollectorStats
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock


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
        credentials: grpc.ServerCredentials | None = None,
        jobs: JobBook | None = None,
        limits: IngestLimits = DEFAULT_LIMITS,
    ) -> None:
        """Build the server; call :meth:`start` with an address. ``limits``: per-node budgets."""
        self._jobs = jobs
        self._fleet = fleet
        self._journal = journal
        self._stats = stats
        self._clock = clock
        self._config = config
        self._credentials = credentials
        self.registry = SessionRegistry(limits)
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(options=settings.server_options())
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
        self.server.add_generic_rpc_handlers((handler,))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)

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
            jobs=self._jobs,
            # With TLS, an agent speaks only for the node its client certificate names.
            verify_identity=self._credentials is not None,
        )
        await handle_stream(session, context)

    async def start(self, address: str) -> int:
        """Listen on ``address`` (host:port; port 0 picks one) and return the bound port."""
        if self._credentials is None:
            port = self.server.add_insecure_port(address)
        else:
            port = self.server.add_secure_port(address, self._credentials)
        await self.server.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        await self.health.set("", serving)
        await self.health.set(settings.SERVICE_NAME, serving)
        return port

    async def stop(self, grace: float | None) -> None:
        """Say NOT_SERVING, then stop (``grace`` None cancels streams at once)."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
