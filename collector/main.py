"""The collector's composition root: journal, fleet model, gRPC server, HTTP API, liveness."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import TYPE_CHECKING

import structlog
from prometheus_client.registry import CollectorRegistry

from collector.actions.actuators import LiveActuators, build_actuators
from collector.actions.alertmanager import AlertForwarder
from collector.actions.dispatcher import Dispatcher
from collector.actions.journaling import expand
from collector.api.auth import ChangeGuard
from collector.api.jobs import JobDesk
from collector.api.preflight import PreflightDesk
from collector.api.rules_eval import RulesDesk
from collector.api.server import ApiServer
from collector.commands import CommandBroker
from collector.config import split_host_port
from collector.export.alertmanager import AlertmanagerCollector
from collector.export.catalog import SERIES_PER_NODE_BUDGET
from collector.export.exposition import NodeExposition
from collector.export.fleet import FleetCollector
from collector.export.ingest import IngestCollector
from collector.export.jobs import JobsCollector
from collector.export.lifecycle import LifecycleCollector
from collector.export.preflight import PreflightCollector
from collector.export.rules import RulesCollector
from collector.gc_pauses import start_freezer
from collector.incidents.evaluator import Evaluator
from collector.incidents.history_restore import restore_history
from collector.incidents.lifecycle_watch import LifecycleWatch
from collector.incidents.service import DrainDesk, IncidentService, SilenceBook
from collector.ingest.grpc_wakeups import DrainedWakeups, drain_wakeups
from collector.ingest.server import FleetServer, refuse_a_port_in_use
from collector.ingest.tls import server_credentials
from collector.jobs.book import SLURM_OWNER, JobBook
from collector.model.evidence import build_bundle
from collector.model.fleet import FleetModel
from collector.model.lifecycle import OUT_OF_SERVICE, Lifecycle, State
from collector.model.liveness import LivenessMonitor
from collector.model.node_states import NodeFlags
from collector.model.target_keys import FLEET_KEY
from collector.preflight.holds import PreflightHolds
from collector.preflight.orchestrator import PreflightService
from collector.preflight.requalify import Requalifier
from collector.reliability import Reliability
from collector.reload import (
    LIVE_KEYS,
    ReloadCollector,
    ReloadError,
    SwappableCollector,
    read_candidate,
    rule_changes,
    successor,
)
from collector.stats import CollectorStats
from collector.store.journal import Journal, open_store
from collector.store.peers import PeerHolders, Peers
from fleetwatch.config_file import short_repr
from fleetwatch.reload import ReloadTally, changed_keys, one_line
from fleetwatch.tls import is_loopback
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.engine import Phase
from rules.gates_file import load_gates
from rules.loader import load_rules
from rules.xid_catalog import load_catalog

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import grpc

    from collector.actions.config import ActionsConfig
    from collector.actions.ports import GpuResetter
    from collector.actions.rma import BuildBundle
    from collector.config import CollectorConfig
    from collector.reload import Candidate, ConfigSource
    from collector.store.lifecycle import TransitionRow
    from fleetwatch.clock import Clock
    from fleetwatch.sd_notify import SdNotifier
    from rules.model import Rule

log = structlog.get_logger("collector")


def build_dispatcher(  # noqa: PLR0913 - the composition root passes every collaborator
    cfg: ActionsConfig,
    journal: Journal,
    fleet: FleetModel,
    clock: Clock,
    resetter: GpuResetter | None = None,
    *,
    actuators: LiveActuators,
    gpu_ranks: Callable[[str, int], list[tuple[str, int, str]]] | None = None,
    gpu_job: Callable[[str, int], str | None] | None = None,
    evidence: BuildBundle | None = None,
) -> Dispatcher:
    """The dispatcher with ``cfg``'s safety limits, acting through ``actuators``.

    A reload re-points ``actuators`` at what the new configuration names. ``evidence`` builds
    the bundle an RMA ticket carries.
    """
    return Dispatcher(
        journal=journal,
        fleet=fleet,
        clock=clock,
        safety=cfg.safety,
        drainers=(actuators.drainer,),
        notifier=actuators.notifier,
        resetter=resetter,
        gpu_ranks=gpu_ranks,
        requeuer=actuators.requeuer,
        gpu_job=gpu_job,
        requeue_on=lambda: actuators.requeuer.on,
        rebooters=(actuators.rebooter,),
        ticketer=actuators.ticketer,
        evidence=evidence,
    )


def job_on_gpu(jobs: JobBook, fleet: FleetModel) -> Callable[[str, int], str | None]:
    """``(node, GPU index) -> Slurm job id``: the Slurm job of the rank a GPU rule sees there.

    The culprit's first, as :meth:`JobBook.rank_on` orders them. Only a job that the node's
    kernel placed in a Slurm job (its ranks' cgroup, as the agent read it: the book's owner
    ``Slurm job J``) has one: a job id a rank merely reported names nothing to requeue, since
    any user can report any id. None when no such job runs there.
    """

    def job(node: str, index: int) -> str | None:
        held = fleet.view().get(node)
        gpu = next((g for g in held.gpus.values() if g.index == index), None) if held else None
        found = jobs.rank_on(node, gpu.uuid).get("job") if gpu is not None else None
        state = jobs.jobs.get(str(found)) if found else None
        if state is None or not state.owner.startswith(SLURM_OWNER):
            return None
        return state.owner.removeprefix(SLURM_OWNER)

    return job


class CollectorService:
    """Everything the collector runs, started and stopped together."""

    def __init__(  # noqa: PLR0913, PLR0915 - the composition root: its inputs, every part
        self,
        cfg: CollectorConfig,
        clock: Clock,
        credentials: grpc.ServerCredentials | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        notifier: SdNotifier | None = None,
        set_log_level: Callable[[str], None] | None = None,
    ) -> None:
        """Build the parts; nothing listens until :meth:`start`.

        ``credentials`` None: mTLS from the config's TLS keys, or plaintext where the config
        allows it (ConfigError otherwise). ``environ`` holds the variables the webhook secrets
        and the API token may come from; ``notifier`` tells systemd when the collector is ready
        and pings its watchdog from the event loop (None: not under systemd);
        ``set_log_level`` applies a reloaded ``log_level`` (None: reloads leave logging alone).
        """
        api_token = cfg.api_token(environ or {})  # a bad token file stops the start first
        if credentials is None:
            credentials = server_credentials(cfg.server_tls())
            if credentials is None and cfg.insecure:
                log.warning("grpc_plaintext", listen=cfg.listen, reason="insecure = true")
        self.cfg = cfg
        self.clock = clock
        self._notifier = notifier
        self._environ: Mapping[str, str] = environ or {}
        self._set_log_level = set_log_level
        self.reloads = ReloadTally(last_success_unix=clock.now())
        self._watchdog_task: asyncio.Task[None] | None = None
        self.fleet = FleetModel()
        self.stats = CollectorStats()
        store, self.reader = open_store(cfg.journal_config(), self._environ)
        self.journal = Journal(store, self.stats.journal)
        # The rules' lemon counts and the reliability figures (collector.reliability).
        self.reliability = Reliability(
            journal=self.journal,
            reader=self.reader,
            fleet=self.fleet,
            clock=clock,
            engine=lambda: self.evaluator.engine,  # a reload swaps the evaluator
        )
        self.peers = Peers(
            journal=self.journal,
            clock=clock,
            name=store.collector,
            beat_s=cfg.heartbeat_interval,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        config = pb.Config(
            heartbeat_interval_ms=int(cfg.heartbeat_interval * 1000),
            poll_interval_ms=int(cfg.poll_interval * 1000),
        )
        self.jobs = JobBook(
            config=cfg.jobs, fleet=self.fleet, clock=clock, xid_class=self._xid_class
        )
        self.grpc = FleetServer(
            fleet=self.fleet,
            journal=self.journal,
            stats=self.stats,
            clock=clock,
            config=config,
            xid_class=self._xid_class,  # the catalog the rules read classes every event
            credentials=credentials,
            jobs=self.jobs,
            limits=cfg.ingest,
        )
        broker = CommandBroker(self.grpc.registry, self.fleet)
        # Callback slot: the job book comes before the stream server, and so before the broker
        # that asks a hung job's agents for its ranks' stacks.
        self.jobs.evidence.ask = broker.dump_ranks
        self.actuators = LiveActuators(build_actuators(cfg.actions, clock, environ))
        self.dispatcher = build_dispatcher(
            cfg.actions,
            self.journal,
            self.fleet,
            clock,
            broker,
            actuators=self.actuators,
            gpu_ranks=self.jobs.on_gpu,
            gpu_job=job_on_gpu(self.jobs, self.fleet),
            evidence=functools.partial(build_bundle, self.reader, self.fleet),
        )
        self.ruleset = load_rules(list(cfg.rules))
        self.evaluator = Evaluator(
            rules=self.ruleset,
            fleet=self.fleet,
            catalog=load_catalog(cfg.xid_catalog),
            clock=clock,
            jobs=self.jobs,
            fleet_extras=self.dispatcher.status,
            node_faults=self.reliability.recent.fields,
        )
        # Callback slot: the fleet model exists before the evaluator that reads it, and a
        # reload swaps the evaluator (reload_config), so the model is told whom to notify.
        self.fleet.observer = self.evaluator
        self.registry.register(JobsCollector(self.jobs))
        self.registry.register(
            FleetCollector(
                self.fleet,
                self.stats,
                flags=self.node_flags,
                xid_class=self._xid_class,
                nodes=False,
            )
        )
        self.node_metrics = NodeExposition(
            self.fleet,
            monotonic=clock.monotonic,
            flags=self.node_flags,
            xid_class=self._xid_class,
            render_interval_s=cfg.metrics_render_interval,
            nodes_per_shard=cfg.metrics_shard_samples // SERIES_PER_NODE_BUDGET,
            held_elsewhere=PeerHolders(
                reader=self.reader,
                clock=clock,
                name=store.collector,
                shared=store.shared,
                beat_s=cfg.heartbeat_interval,
            ).held_elsewhere,
        )
        self._rule_metrics = SwappableCollector(RulesCollector(self.evaluator, self.dispatcher))
        self.registry.register(self._rule_metrics)
        self.registry.register(ReloadCollector(self.reloads))
        self.registry.register(IngestCollector(self.grpc.registry.throttle, self.stats))
        holds = PreflightHolds(self.dispatcher, self.journal, clock)
        # Callback slots set by the incident service itself: the evaluator exists before the
        # service whose event and silences it calls (evaluator.on_event, evaluator.silencer).
        self.incidents = IncidentService(
            evaluator=self.evaluator,
            journal=self.journal,
            clock=clock,
            sink=self.dispatcher,
            interval_s=cfg.rules_interval,
            extra_firing=holds.firing,  # its drains wait under the cap like others
        )
        # The service tells it of each firing and resolved incident; it reads which fire now
        # from the evaluator in use (a reload swaps it).
        self.alertmanager = AlertForwarder(
            config=cfg.alertmanager,
            endpoints=cfg.alertmanager.endpoints(self._environ),  # a bad token stops the start
            clock=clock,
            firing=self._firing_rules,
        )
        self.incidents.watchers.append(self.alertmanager)
        self.lifecycle = Lifecycle(self._journal_move, clock, store.collector)
        self.dispatcher.lifecycle = self.lifecycle
        self.incidents.watchers.append(LifecycleWatch(self.lifecycle))
        self.registry.register(LifecycleCollector(self.lifecycle, self.fleet.node_names))
        self.lifecycle.moved.append(self.reliability.recent.moved)
        self.dispatcher.tally.listeners.append(self.reliability.recent.action)
        # a count that moved: its node's rules at the next tick (of the evaluator in use)
        self.reliability.recent.changed.append(lambda n: self.evaluator.note_node(n))  # noqa: PLW0108
        self.registry.register(self.reliability.collector)
        self.registry.register(AlertmanagerCollector(self.alertmanager))
        self.silences = SilenceBook(self.journal, self.incidents)
        self.drains = DrainDesk(self.dispatcher)
        self.preflight = PreflightService(
            fleet=self.fleet,
            sessions=self.grpc.registry,
            journal=self.journal,
            clock=clock,
            book=load_gates(cfg.preflight_gates),
            collector=store.collector,
            holds=holds,
        )
        self.requalifier: Requalifier | None = None
        if cfg.requalify:
            self.requalifier = Requalifier(
                self.preflight,
                self.dispatcher,
                self.lifecycle,
                cfg.requalify,
                self.fleet.node_names,
            )
            self.dispatcher.requalify = self.requalifier.start
            self.fleet.rebooted.append(self.requalifier.booted)
        self.preflight_desk = PreflightDesk(self.preflight, self.dispatcher)
        self.job_desk = JobDesk(self.jobs)
        self.rules_desk = RulesDesk(lambda: self.evaluator, self.dispatcher.would, expand)
        self.registry.register(PreflightCollector(self.preflight, self.stats))
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
            preflight=self.preflight_desk,
            job_desk=self.job_desk,
            rules_desk=self.rules_desk,
            clock=clock,
            jobs=self.jobs,
            node_flags=self.node_flags,
            allowed_hosts=cfg.http_allowed_hosts,
            nodes=self.node_metrics,
            rules=lambda: self.evaluator.rules,  # read at each request: a reload swaps them
            lifecycle=self.lifecycle,
            reliability=self.reliability.answer,
        )
        self.liveness = LivenessMonitor(
            fleet=self.fleet,
            journal=self.journal,
            clock=clock,
            heartbeat_interval=cfg.heartbeat_interval,
            missed=cfg.missed_heartbeats,
            peers=self.peers,
        )
        self.grpc_port = 0
        self._liveness_task: asyncio.Task[None] | None = None
        self._gc_task: asyncio.Task[None] | None = None
        self.wakeups: DrainedWakeups | None = None  # gRPC's wakeup bytes, drained (see there)
        self._beat_task: asyncio.Task[None] | None = None

    @property
    def http_port(self) -> int:
        """The bound HTTP port."""
        return self.http.port

    def _xid_class(self, xid: int) -> str:
        """The class of ``xid`` in the catalog in use now (a reload may replace it)."""
        return self.evaluator.catalog.class_of(xid)

    def _firing_rules(self) -> dict[str, Rule]:
        """The incidents firing now, by id, with their rule."""
        engine = self.evaluator.engine
        return {
            i.id: engine.rules[i.rule] for i in engine.open_incidents() if i.phase == Phase.FIRING
        }

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
        for row in await self.peers.ours(await self.journal.load_nodes()):
            hello = pb.Hello()
            try:
                hello.ParseFromString(row.hello)
            except Exception as exc:  # noqa: BLE001 - one bad row must not stop the collector
                log.warning("node_restore_failed", node=row.name, error=str(exc))
                continue
            self.fleet.restore(
                hello, reachable=row.reachable, mono=mono, unix=unix, grace_s=self.cfg.restart_grace
            )

    async def start(self) -> None:
        """Open the journal, listen, and start watching liveness."""
        refuse_a_port_in_use(self.cfg.listen)  # a taken port fails before any work is done
        self.silences.bind(asyncio.get_running_loop())
        self.drains.bind(asyncio.get_running_loop())
        self.preflight_desk.bind(asyncio.get_running_loop())
        self.job_desk.bind(asyncio.get_running_loop())
        self.rules_desk.bind(asyncio.get_running_loop())
        if self.peers.shared:
            await self.peers.beat()
        await self._restore_nodes()
        if self.peers.shared:  # take up only the incidents and actions of the nodes watched here
            # Callback slot: which nodes are watched here is known only once they are restored.
            held = frozenset(self.fleet.node_names())
            self.dispatcher.owns = self.incidents.owns = lambda node: (
                node in held or node == FLEET_KEY or node.startswith("job/")
            )
        await restore_history(self.journal, self.evaluator, self.clock)
        self.lifecycle.load((await self.journal.do(lambda s: s.lifecycle.current())).values())
        self.lifecycle.start()
        await self.reliability.start()  # before the moves and outcomes that follow
        await self.dispatcher.start()
        for node, incident in sorted(self.dispatcher.drained.items()):  # held from before
            if self.lifecycle.state(node) not in OUT_OF_SERVICE:
                self.lifecycle.move(
                    node, State.DRAINED, actor="journal", incident=incident, reason="held drained"
                )
        await self.incidents.start()
        self.alertmanager.start()  # after the firing incidents taken back were told to it
        await self.preflight.start()
        self.grpc_port = await self.grpc.start(self.cfg.listen)
        self.wakeups = drain_wakeups(asyncio.get_running_loop())
        if self.wakeups is None:
            log.warning(
                "grpc_wakeups_not_drained",
                why="gRPC's asyncio reader was not found (another gRPC engine or version)",
                effect="a burst of completions may reach the loop one per turn",
            )
        self.http.start()
        self._liveness_task = asyncio.create_task(self.liveness.run(), name="liveness")
        self._gc_task = start_freezer(self.clock, self.fleet.connected)
        if self.peers.shared:
            self._beat_task = asyncio.create_task(self.peers.run(), name="collector-beat")
        log.info(
            "collector_started",
            name=self.peers.name,
            grpc_port=self.grpc_port,
            http_port=self.http_port,
            journal=self.journal.where,
            nodes_known=len(self.fleet.node_names()),
        )
        if self._notifier is not None:
            self._notifier.ready(self._serving_status())
            self._watchdog_task = asyncio.create_task(
                self._notifier.keep_alive(self.clock), name="watchdog"
            )

    async def _journal_move(self, row: TransitionRow) -> None:
        """Journal one lifecycle move (the lifecycle's writer task calls it, in order)."""
        await self.journal.do(lambda s: s.lifecycle.add(row))

    def _serving_status(self) -> str:
        """The line ``systemctl status`` shows while the collector serves."""
        status = (
            f"serving: gRPC port {self.grpc_port}, HTTP port {self.http_port}, "
            f"{len(self.fleet.node_names())} nodes known"
        )
        if not self.reloads.successful:
            status += f"; last reload failed, running the files before: {self.reloads.last_error}"
        return status

    def reload(self, source: ConfigSource) -> bool:
        """Read every file again and swap in what may change live; all or nothing.

        Returns whether the new files are in use. A problem in any file leaves everything as it
        was, is logged once (``config_reload_failed``, naming the file and line) and counted in
        ``fleetwatch_config_*``. systemd hears RELOADING=1, then READY=1 with the outcome.
        """
        if self._notifier is not None:
            self._notifier.reloading(self.clock.monotonic(), "reloading configuration")
        try:
            candidate = read_candidate(source, self.cfg, self._environ, self.clock)
        except ReloadError as exc:
            self._reload_failed(exc)
        except Exception as exc:  # a bug must not take the running collector down
            log.exception("config_reload_crashed")
            self.reloads.failure(one_line(f"{type(exc).__name__}: {exc}"))
        else:
            self._apply(candidate)
        if self._notifier is not None:
            self._notifier.ready(self._serving_status())
        return self.reloads.successful

    def _reload_failed(self, exc: ReloadError) -> None:
        first, *more = exc.problems
        error = one_line(str(first))
        log.error(
            "config_reload_failed",
            file=first.file,
            line=first.line,
            column=first.column,
            error=error,
            more=[one_line(str(p)) for p in more],
            kept="the files before",
        )
        self.reloads.failure(error)

    def _apply(self, candidate: Candidate) -> None:
        """Swap in a checked configuration; nothing here can fail halfway."""
        old, cfg = self.cfg, candidate.cfg
        for key, (running, configured) in candidate.needs_restart.items():
            log.warning(
                "config_reload_needs_restart",
                key=key,
                running=short_repr(running),
                configured=short_repr(configured),
            )
        added, removed, changed = rule_changes(self.evaluator.rules, candidate.rules)
        if added or removed or changed:
            evaluator, dropped = successor(self.evaluator, candidate.rules, candidate.catalog)
            self.evaluator = evaluator
            self.fleet.observer = evaluator
            self.incidents.evaluator = evaluator
            self._rule_metrics.inner = RulesCollector(evaluator, self.dispatcher)
            for incident in dropped:
                log.warning(
                    "incident_dropped_with_rule",
                    incident=incident.id,
                    rule=incident.rule,
                    target=incident.target,
                )
        else:
            self.evaluator.catalog = candidate.catalog
        self.dispatcher.safety = cfg.actions.safety
        self.actuators.swap(candidate.actuators)
        self.alertmanager.configure(cfg.alertmanager, candidate.alertmanagers)
        self.incidents.interval_s = cfg.rules_interval
        self.liveness.missed = cfg.missed_heartbeats
        self.liveness.silence_s = cfg.heartbeat_interval * cfg.missed_heartbeats
        if cfg.log_level != old.log_level and self._set_log_level is not None:
            self._set_log_level(cfg.log_level or "info")
        self.cfg = cfg
        self.reloads.success(self.clock.now())
        log.info(
            "config_reloaded",
            changed=changed_keys(old, cfg, LIVE_KEYS),
            rules=len(candidate.rules.rules),
            rules_added=added,
            rules_removed=removed,
            rules_changed=changed,
            needs_restart=sorted(candidate.needs_restart),
        )

    async def stop(self, grace: float | None = 2.0) -> None:
        """Stop serving, then close the journal."""
        if self._notifier is not None:
            self._notifier.stopping()
        for task in (self._watchdog_task, self._liveness_task, self._beat_task, self._gc_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.requalifier is not None:
            await self.requalifier.stop()
        await self.preflight.stop()  # a run cut short is journaled as could_not_run
        await self.jobs.evidence.stop()
        await self.incidents.stop(grace if grace is not None else 0.0)  # then cut actions short
        await self.alertmanager.stop()
        await self.lifecycle.stop()  # what was moved is journaled before the journal closes
        await self.reliability.stop()
        await self.grpc.stop(grace)
        self.http.stop()
        await self.journal.close()
        self.reader.close()
        log.info("collector_stopped")

    async def wait(self) -> None:
        """Wait until the gRPC server terminates."""
        await self.grpc.server.wait_for_termination()
