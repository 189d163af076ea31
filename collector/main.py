"""The collector's composition root: journal, fleet model, gRPC server, HTTP API, liveness."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import structlog
from prometheus_client.registry import CollectorRegistry

from collector.actions.adapters import SlurmDrainer, WebhookDrainer, WebhookNotifier
from collector.actions.dispatcher import Dispatcher, Drainer, GpuResetter
from collector.actions.slurm import SlurmNodes
from collector.api_auth import ChangeGuard
from collector.commands import CommandBroker
from collector.config import split_host_port
from collector.exporter import FleetCollector
from collector.exporter_jobs import JobsCollector
from collector.exporter_rules import RulesCollector
from collector.fleet import FleetModel
from collector.history_restore import restore_history
from collector.http_api import ApiServer
from collector.incident_service import DrainDesk, IncidentService, SilenceBook
from collector.incidents import Evaluator
from collector.jobs.book import JobBook
from collector.journal import Journal
from collector.liveness import LivenessMonitor
from collector.node_states import NodeFlags
from collector.server import FleetServer
from collector.stats import CollectorStats
from collector.store_sqlite import JournalReader, SqliteStore
from collector.tls import server_credentials
from fleetwatch.tls import is_loopback
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.engine import Phase
from rules.loader import load_rules
from rules.xid_catalog import load_catalog

if TYPE_CHECKING:
    from collections.abc import Mapping

    import grpc

    from collector.actions.config import ActionsConfig
    from collector.config import CollectorConfig
    from fleetwatch.clock import Clock
    from fleetwatch.sd_notify import SdNotifier

log = structlog.get_logger("collector")


def build_dispatcher(  # noqa: PLR0913 - the composition root passes every collaborator
    cfg: ActionsConfig,
    journal: Journal,
    fleet: FleetModel,
    clock: Clock,
    resetter: GpuResetter | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> Dispatcher:
    """The dispatcher with the drain adapters and notify channels the configuration names.

    ``environ`` holds the variables webhook ``secret_env`` keys name (none: no variables).
    """
    env_vars = environ or {}
    drainers: list[Drainer] = []
    if cfg.slurm.enabled:
        env = {"SLURM_CONF": str(cfg.slurm.slurm_conf)} if cfg.slurm.slurm_conf else None
        drainers.append(SlurmDrainer(SlurmNodes(scontrol=cfg.slurm.scontrol, env=env)))
    if cfg.drain_webhook is not None:
        hook = cfg.drain_webhook.sender(clock, "actions.drain_webhook", env_vars)
        drainers.append(WebhookDrainer(hook))
    channels = {
        name: hook.sender(clock, f"actions.notify.{name}", env_vars)
        for name, hook in cfg.notify.items()
    }
    return Dispatcher(
        journal=journal,
        fleet=fleet,
        clock=clock,
        safety=cfg.safety,
        drainers=tuple(drainers),
        notifier=WebhookNotifier(channels) if channels else None,
        resetter=resetter,
    )


class CollectorService:
    """Everything the collector runs, started and stopped together."""

    def __init__(
        self,
        cfg: CollectorConfig,
        clock: Clock,
        credentials: grpc.ServerCredentials | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        notifier: SdNotifier | None = None,
    ) -> None:
        """Build the parts; nothing listens until :meth:`start`.

        ``credentials`` None: mTLS from the config's TLS keys, or plaintext where the config
        allows it (ConfigError otherwise). ``environ`` holds the variables the webhook secrets
        and the API token may come from; ``notifier`` tells systemd when the collector is ready
        and pings its watchdog from the event loop (None: not under systemd).
        """
        api_token = cfg.api_token(environ or {})  # a bad token file stops the start first
        if credentials is None:
            credentials = server_credentials(cfg)
            if credentials is None and cfg.insecure:
                log.warning("grpc_plaintext", listen=cfg.listen, reason="insecure = true")
        self.cfg = cfg
        self.clock = clock
        self._notifier = notifier
        self._watchdog_task: asyncio.Task[None] | None = None
        self.fleet = FleetModel()
        self.stats = CollectorStats()
        self.journal = Journal(SqliteStore(cfg.journal))
        self.reader = JournalReader(cfg.journal)
        self.registry = CollectorRegistry(auto_describe=False)
        config = pb.Config(
            heartbeat_interval_ms=int(cfg.heartbeat_interval * 1000),
            poll_interval_ms=int(cfg.poll_interval * 1000),
        )
        self.jobs = JobBook(config=cfg.jobs, fleet=self.fleet, clock=clock)
        self.grpc = FleetServer(
            fleet=self.fleet,
            journal=self.journal,
            stats=self.stats,
            clock=clock,
            config=config,
            credentials=credentials,
            jobs=self.jobs,
        )
        self.ruleset = load_rules(list(cfg.rules))
        self.evaluator = Evaluator(
            rules=self.ruleset,
            fleet=self.fleet,
            catalog=load_catalog(cfg.xid_catalog),
            clock=clock,
            jobs=self.jobs,
        )
        self.fleet.observer = self.evaluator
        self.registry.register(JobsCollector(self.jobs))
        broker = CommandBroker(self.grpc.registry, self.fleet)
        self.dispatcher = build_dispatcher(
            cfg.actions, self.journal, self.fleet, clock, broker, environ=environ
        )
        self.evaluator.fleet_extras = self.dispatcher.status
        self.registry.register(
            FleetCollector(
                self.fleet,
                self.stats,
                flags=self.node_flags,
                xid_class=self.evaluator.catalog.class_of,
            )
        )
        self.registry.register(RulesCollector(self.evaluator, self.dispatcher))
        self.incidents = IncidentService(
            evaluator=self.evaluator,
            journal=self.journal,
            clock=clock,
            sink=self.dispatcher,
            interval_s=cfg.rules_interval,
        )
        self.silences = SilenceBook(self.journal, self.incidents)
        self.drains = DrainDesk(self.dispatcher)
        host, port = split_host_port(cfg.http, "http")
        guard = ChangeGuard(
            token=api_token,
            listen_host=host,
            refused=self.stats.api_refused,
        )
        if not guard.requires_token and not is_loopback(host):
            log.warning("api_changes_refused", http=cfg.http, reason="no api token configured")
        self.http = ApiServer(
            host=host,
            port=port,
            guard=guard,
            fleet=self.fleet,
            journal=self.reader,
            registry=self.registry,
            silences=self.silences,
            drains=self.drains,
            clock=clock,
            jobs=self.jobs,
            node_flags=self.node_flags,
        )
        self.liveness = LivenessMonitor(
            fleet=self.fleet,
            journal=self.journal,
            clock=clock,
            heartbeat_interval=cfg.heartbeat_interval,
            missed=cfg.missed_heartbeats,
        )
        self.grpc_port = 0
        self._liveness_task: asyncio.Task[None] | None = None

    @property
    def http_port(self) -> int:
        """The bound HTTP port."""
        return self.http.port

    def node_flags(self) -> NodeFlags:
        """Drained, draining and incident-bearing nodes now (called by the scrape thread)."""
        firing = frozenset(
            i.node for i in self.evaluator.engine.open_incidents() if i.phase == Phase.FIRING
        )
        return NodeFlags(
            drained=frozenset(dict(self.dispatcher.drained)),
            draining=frozenset(set(self.dispatcher.draining)),
            firing=firing,
        )

    async def _restore_nodes(self) -> None:
        """Bring back nodes from the journal, so a node that never returns is still noticed."""
        mono, unix = self.clock.monotonic(), self.clock.now()
        for row in await self.journal.load_nodes():
            hello = pb.Hello()
            try:
                hello.ParseFromString(row.hello)
            except Exception as exc:  # noqa: BLE001 - one bad row must not stop the collector
                log.warning("node_restore_failed", node=row.name, error=str(exc))
                continue
            self.fleet.restore(hello, reachable=row.reachable, mono=mono, unix=unix)

    async def start(self) -> None:
        """Open the journal, listen, and start watching liveness."""
        self.silences.bind(asyncio.get_running_loop())
        self.drains.bind(asyncio.get_running_loop())
        await self._restore_nodes()
        await restore_history(self.journal, self.evaluator, self.clock)
        await self.dispatcher.start()
        await self.incidents.start()
        self.grpc_port = await self.grpc.start(self.cfg.listen)
        self.http.start()
        self._liveness_task = asyncio.create_task(self.liveness.run(), name="liveness")
        log.info(
            "collector_started",
            grpc_port=self.grpc_port,
            http_port=self.http_port,
            journal=str(self.cfg.journal),
            nodes_known=len(self.fleet.node_names()),
        )
        if self._notifier is not None:
            self._notifier.ready(
                f"serving: gRPC port {self.grpc_port}, HTTP port {self.http_port}, "
                f"{len(self.fleet.node_names())} nodes known"
            )
            self._watchdog_task = asyncio.create_task(
                self._notifier.keep_alive(self.clock), name="watchdog"
            )

    async def stop(self, grace: float | None = 2.0) -> None:
        """Stop serving, then close the journal."""
        if self._notifier is not None:
            self._notifier.stopping()
        for task in (self._watchdog_task, self._liveness_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.incidents.stop(grace if grace is not None else 0.0)  # then cut actions short
        await self.grpc.stop(grace)
        self.http.stop()
        await self.journal.close()
        log.info("collector_stopped")

    async def wait(self) -> None:
        """Wait until the gRPC server terminates."""
        await self.grpc.server.wait_for_termination()
