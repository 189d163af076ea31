"""HTTP: ``/metrics`` for Prometheus and a read-only JSON API, on a thread of its own.

GET /metrics                      Prometheus exposition of every series (text or OpenMetrics)
GET /metrics/fleet                every series but the nodes' (fleet, jobs, incidents, itself)
GET /metrics/shards/<n>           the nodes' series of shard n (collector.export.exposition)
GET /api/v1/scrape_targets        the targets above, for Prometheus' HTTP service discovery
GET /healthz                      "ok" while the collector runs
GET /api/v1/nodes                 every node with a health summary
GET /api/v1/nodes/<name>          one node, down to each NVLink and IB port
GET /api/v1/events?node=&kind=&after=&limit=&order=asc|desc
journaled events, paged by journal id
GET /api/v1/jobs                  training jobs with their throughput, MFU, stragglers, drops
GET /api/v1/jobs/<id>             one job, with each rank's node, GPU and compute-time ratio,
                                  and the evidence last gathered (its ranks' stacks grouped)
POST /api/v1/jobs/<id>/dump       gather that evidence now (:mod:`collector.api.jobs`)

Every request but ``/healthz`` must name the collector in ``Host`` (no DNS rebinding). POST and
DELETE (silences, drain releases: :mod:`collector.api.incidents`; runs, dumps) must come from no
web page of another origin and be ``application/json`` (:mod:`collector.api.browsers`), then
pass the :class:`~collector.api.auth.ChangeGuard`: a bearer token, or loopback when none is set.
Connections are capped and must send their request in time (:mod:`collector.api.connections`).
A change or drain read the event loop does not take up in time is ``503`` with ``Retry-After``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import threading
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

import structlog
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from collector.api import incidents as incidents_api
from collector.api import jobs as jobs_api
from collector.api import preflight as preflight_api
from collector.api.auth import Refusal
from collector.api.browsers import HostNames, content_type_refusal
from collector.api.connections import BoundedHandler, BoundedHTTPServer, ConnectionLimits
from collector.exceptions import CollectorError, ConfigError, LoopBusyError, PortInUseError
from collector.export.exposition import OPENMETRICS, TEXT, gzip_body
from collector.model.node_states import NodeFlags, node_state
from fleetwatch.model import EventKind

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from prometheus_client.registry import CollectorRegistry

    from collector.api.auth import ChangeGuard
    from collector.api.incidents import DrainKeeper, SilenceWriter
    from collector.api.jobs import JobDesk
    from collector.api.preflight import PreflightDesk
    from collector.export.exposition import NodeExposition
    from collector.jobs.book import JobBook
    from collector.model.fleet import FleetModel
    from collector.model.state import NodeState
    from collector.store.events import EventReader, EventRow
    from fleetwatch.clock import Clock

log = structlog.get_logger("collector.http")

MAX_LIMIT: Final = 1000
_KINDS: Final = frozenset(k.value for k in EventKind)
# Seconds a client told the event loop is busy is asked to wait before trying again.
BUSY_RETRY_AFTER_S: Final = 5
# ApiError statuses that mean the request itself is wrong (counted as bad_request).
_BAD_REQUEST: Final = frozenset(
    {HTTPStatus.BAD_REQUEST, HTTPStatus.LENGTH_REQUIRED, HTTPStatus.REQUEST_ENTITY_TOO_LARGE}
)
SHARD_PATH: Final = "/metrics/shards/"
FLEET_PATH: Final = "/metrics/fleet"
CONTENT_TYPES: Final = {TEXT: CONTENT_TYPE_LATEST, OPENMETRICS: openmetrics.CONTENT_TYPE_LATEST}


def exposition_format(accept: str | None) -> str:
    """OpenMetrics when ``Accept`` names it (Prometheus does by default), else the text format."""
    for item in (accept or "").split(","):
        if item.split(";")[0].strip() == "application/openmetrics-text":
            return OPENMETRICS
    return TEXT


def wants_gzip(accept_encoding: str | None) -> bool:
    """Whether ``Accept-Encoding`` takes gzip (and does not refuse it with ``q=0``)."""
    for item in (accept_encoding or "").split(","):
        name, _, params = item.partition(";")
        if name.strip().lower() == "gzip":
            q = params.strip().removeprefix("q=").strip()
            return not q or q.replace("0", "").strip(".") != ""
    return False


def scrape_targets(host: str, shards: list[int]) -> list[dict[str, Any]]:
    """The HTTP service discovery answer: the fleet target, then one target per shard.

    ``host`` is the address the scraper reached the collector by (its ``Host``, checked); a
    shard's target carries a ``shard`` label so that each target's ``up`` is its own.
    """
    targets: list[dict[str, Any]] = [
        {"targets": [host], "labels": {"__metrics_path__": FLEET_PATH}}
    ]
    targets.extend(
        {"targets": [host], "labels": {"__metrics_path__": f"{SHARD_PATH}{n}", "shard": str(n)}}
        for n in shards
    )
    return targets


def local_host_names() -> tuple[str, ...]:
    """This host's own names, which the API accepts in ``Host`` without configuration."""
    return socket.gethostname(), socket.getfqdn()


class BadRequestError(ValueError):
    """A query parameter is wrong; the message says which and why."""


def node_summary(node: NodeState, flags: NodeFlags | None = None) -> dict[str, Any]:
    """The short form used by ``/api/v1/nodes``; ``state`` as in ``fleetwatch_node_state``."""
    return {
        "name": node.name,
        "state": node_state(node, flags or NodeFlags()),
        "boot_id": node.boot_id,
        "reachable": node.reachable,
        "connected": node.connected,
        "last_seen_unix": round(node.last_seen_unix, 3),
        "agent_version": node.agent_version,
        "driver_version": node.driver_version,
        "gpus": len(node.gpus),
        "gpus_lost": sum(1 for g in node.gpus.values() if not g.present),
        "nvlinks_down": sum(g.nvlinks_down for g in node.gpus.values()),
        "ib_ports": len(node.ports),
        "ib_ports_down": sum(1 for p in node.ports.values() if p.state and not p.up),
        "events": dict(node.events),
    }


def node_detail(node: NodeState, flags: NodeFlags | None = None) -> dict[str, Any]:
    """The long form used by ``/api/v1/nodes/<name>``."""
    detail = node_summary(node, flags)
    detail["gpus"] = [
        {
            "index": g.index,
            "uuid": g.uuid,
            "pci_bus_id": g.pci_bus_id,
            "model": g.model,
            "present": g.present,
            "nvlink_count": g.nvlink_count,
            "nvlinks_down": sorted(link for link, up in g.nvlink_up.items() if not up),
            "pcie_replay_count": g.pcie_replay_count,
            "xid_counts": {str(x): c for x, c in sorted(g.xid_counts.items())},
            "last_xid": g.last_xid or None,
            "signals": dict(sorted(g.signals.items())),
            "nvlinks": [
                {"link": link, **dict(sorted(values.items()))}
                for link, values in sorted(g.link_signals.items())
            ],
        }
        for g in sorted(node.gpus.values(), key=lambda g: g.index)
    ]
    detail["ib_ports"] = [
        {
            "device": p.device,
            "port": p.port,
            "rate": p.rate,
            "link_layer": p.link_layer,
            "state": p.state,
            "phys_state": p.phys_state,
            "link_downed": p.link_downed,
            "down_events": p.down_events,
            "signals": dict(sorted(p.signals.items())),
        }
        for p in node.ports.values()
    ]
    detail["other_signals"] = dict(node.other)
    return detail


def event_json(row: EventRow) -> dict[str, Any]:
    """One journaled event as JSON."""
    return {
        "id": row.id,
        "node": row.node,
        "boot_id": row.boot_id or None,
        "seq": row.seq,
        "time_ms": row.time_ms,
        "received_ms": row.received_ms,
        "kind": row.kind,
        "target": {
            "kind": row.target_kind,
            "gpu_uuid": row.gpu_uuid or None,
            "index": row.target_index,
            "device": row.device or None,
        },
        "xid": row.xid or None,
        "xid_class": row.xid_class or None,
        "detail": row.detail,
    }


def _listen_error(host: str, port: int, exc: OSError) -> CollectorError:
    """One line for a bind that failed: the address, and what the kernel said."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return PortInUseError(f"http {where}: port {port} is in use (another collector?)")
    return ConfigError(f"http {where}: cannot listen there: {exc.strerror or exc}")


def _int_param(query: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    values = query.get(name)
    if not values:
        return default
    try:
        value = int(values[-1])
    except ValueError as exc:
        msg = f"query parameter {name}={values[-1][:40]!r} is not an integer"
        raise BadRequestError(msg) from exc
    if not low <= value <= high:
        msg = f"query parameter {name}={value} must be between {low} and {high}"
        raise BadRequestError(msg)
    return value


class ApiServer:
    """Serves HTTP on a daemon thread: reads; changes only silences, drains, runs and dumps."""

    def __init__(  # noqa: PLR0913 - what the API reads, the two things it writes, its limits
        self,
        *,
        host: str,
        port: int,
        guard: ChangeGuard,
        fleet: FleetModel,
        journal: EventReader,
        registry: CollectorRegistry,
        silences: SilenceWriter | None = None,
        drains: DrainKeeper | None = None,
        clock: Clock | None = None,
        jobs: JobBook | None = None,
        node_flags: Callable[[], NodeFlags] = NodeFlags,
        allowed_hosts: Iterable[str] = (),
        local_names: Iterable[str] | None = None,
        limits: ConnectionLimits | None = None,
        nodes: NodeExposition | None = None,
        preflight: PreflightDesk | None = None,
        job_desk: JobDesk | None = None,
    ) -> None:
        """Bind now (so a busy port fails at start-up); serve on :meth:`start`.

        ``guard`` decides who may make changes; ``node_flags`` says which nodes are drained,
        draining or have a firing incident. ``allowed_hosts`` (``http_allowed_hosts``) and
        ``local_names`` (None: :func:`local_host_names`) are the names besides ``host`` that
        ``Host`` may give; ``limits`` bound connections (None: the defaults). ``nodes`` renders
        the nodes' series (None: ``registry`` holds every series, and there are no shards).
        ``job_desk`` gathers a job's evidence on demand (None: ``POST .../dump`` is refused).
        """
        self._guard = guard
        self._jobs = jobs
        self._node_flags = node_flags
        self._fleet = fleet
        self._journal = journal
        self._registry = registry
        self._nodes = nodes
        self._silences = silences
        self._drains = drains
        self._preflight = preflight  # pre-flight runs and checked releases (None: none)
        self._job_desk = job_desk
        self._clock = clock
        self._hosts = HostNames.build(
            listen_host=host,
            allowed=allowed_hosts,
            local_names=local_host_names() if local_names is None else local_names,
        )
        api = self

        class Handler(BoundedHandler):
            def do_GET(self) -> None:  # noqa: N802 - the standard library's name
                api.serve(self, api.handle)

            def do_POST(self) -> None:  # noqa: N802
                api.serve(self, api.handle_change)

            def do_DELETE(self) -> None:  # noqa: N802
                api.serve(self, api.handle_change)

        try:
            self._server = BoundedHTTPServer(
                (host, port), Handler, limits=limits or ConnectionLimits(), refusals=guard.refusals
            )
        except OSError as exc:
            raise _listen_error(host, port, exc) from exc
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when asked for port 0)."""
        return int(self._server.server_address[1])

    @property
    def limits(self) -> ConnectionLimits:
        """How many connections, and how long each may take; new connections use a new value."""
        return self._server.limits

    @limits.setter
    def limits(self, limits: ConnectionLimits) -> None:
        self._server.limits = limits

    def connections(self) -> tuple[int, int]:
        """Connections open now: (still sending their request, being answered)."""
        return self._server.counts()

    def start(self) -> None:
        """Serve in the background."""
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            name="http-api",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port (a server never started: only the port)."""
        if self._thread is not None:  # shutdown() waits for a serve_forever() that never ran
            self._server.shutdown()
        self._server.server_close()

    @staticmethod
    def serve(req: BoundedHandler, route: Callable[[BoundedHandler], None]) -> None:
        """Run ``route``; a client that hung up meanwhile is one quiet log line."""
        try:
            route(req)
        except ConnectionError as exc:  # BrokenPipe, ConnectionReset, ConnectionAborted
            log.info(
                "http_client_gone",
                client=str(req.client_address[0]),
                method=req.command,
                path=urlsplit(req.path).path[:200],
                error=type(exc).__name__,
            )

    def _refuse(
        self,
        req: BoundedHandler,
        refusal: Refusal,
        headers: dict[str, str] | None = None,
        **detail: object,
    ) -> None:
        """Count and log ``refusal``, and answer it as a JSON error."""
        self._guard.refusals.record(
            refusal,
            client=str(req.client_address[0]),
            method=req.command,
            path=urlsplit(req.path).path,
            why=refusal.message,
            **detail,
        )
        self._json(req, refusal.status, {"error": refusal.message}, headers)

    def _refuse_error(self, req: BoundedHandler, exc: Exception) -> None:
        """Answer an error raised while serving a request: a 4xx, a 503 or, for a bug, a 500."""
        if isinstance(exc, BadRequestError):
            self._refuse(req, Refusal(HTTPStatus.BAD_REQUEST, "bad_request", str(exc)))
        elif isinstance(exc, incidents_api.ApiError) and exc.status in _BAD_REQUEST:
            self._refuse(req, Refusal(exc.status, "bad_request", str(exc)))
        elif isinstance(exc, incidents_api.ApiError):
            self._json(req, exc.status, {"error": str(exc)})
        elif isinstance(exc, LoopBusyError):
            refusal = Refusal(HTTPStatus.SERVICE_UNAVAILABLE, "loop_busy", str(exc))
            retry = {"Retry-After": str(BUSY_RETRY_AFTER_S)}
            self._refuse(req, refusal, retry, started=exc.started)
        else:
            log.error("http_request_failed", path=urlsplit(req.path).path[:200], exc_info=exc)
            self._json(req, HTTPStatus.INTERNAL_SERVER_ERROR, {"error": type(exc).__name__})

    def handle(self, req: BoundedHandler) -> None:
        """Route one GET request."""
        if not req.begin_answer():
            return
        url = urlsplit(req.path)
        path = url.path.rstrip("/") or "/"
        if path != "/healthz":  # liveness probes may use any name; "ok" tells a page nothing
            refusal = self._hosts.host_refusal(req.headers.get("Host"))
            if refusal is not None:
                self._refuse(req, refusal, host=str(req.headers.get("Host"))[:100])
                return
        try:
            if path == "/metrics" or path.startswith("/metrics/"):
                self._metrics(req, path)
            elif path == "/api/v1/scrape_targets":
                self._json(req, HTTPStatus.OK, self._scrape_targets(req))
            elif path == "/healthz":
                self._send(req, HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
            else:
                status, body = self._get_json(path, parse_qs(url.query))
                self._json(req, status, body)
        except (ConnectionError, TimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001 - every error is answered; a bug as a 500
            self._refuse_error(req, exc)

    def _metrics(self, req: BoundedHandler, path: str) -> None:
        """``/metrics``, ``/metrics/fleet`` or a shard, in the format and encoding asked for."""
        fmt = exposition_format(req.headers.get("Accept"))
        gzipped = wants_gzip(req.headers.get("Accept-Encoding"))
        if path.startswith(SHARD_PATH):
            number = path.removeprefix(SHARD_PATH)
            body = None
            if self._nodes is not None and number.isdigit() and len(number) < 9:  # noqa: PLR2004
                body = self._nodes.shard(int(number), fmt, gzipped=gzipped)
            if body is None:
                self._json(req, HTTPStatus.NOT_FOUND, {"error": f"no shard {number[:20]!r}"})
                return
            self._send_metrics(req, body, fmt, gzipped=gzipped, done=True)
            return
        if path not in ("/metrics", FLEET_PATH):
            self._json(req, HTTPStatus.NOT_FOUND, {"error": f"no such path {path[:100]!r}"})
            return
        if fmt == OPENMETRICS:
            body = openmetrics.generate_latest(  # type: ignore[no-untyped-call]
                self._registry
            ).removesuffix(b"# EOF\n")
        else:
            body = generate_latest(self._registry)
        if path == "/metrics" and self._nodes is not None:
            body += self._nodes.everything(fmt)
        if fmt == OPENMETRICS:
            body += b"# EOF\n"
        self._send_metrics(req, body, fmt, gzipped=gzipped, done=False)

    def _send_metrics(
        self, req: BoundedHandler, body: bytes, fmt: str, *, gzipped: bool, done: bool
    ) -> None:
        """Send an exposition; ``done``: ``body`` is already gzipped if ``gzipped``."""
        headers = {"Vary": "Accept, Accept-Encoding"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
            if not done:
                body = gzip_body(body)
        self._send(req, HTTPStatus.OK, body, CONTENT_TYPES[fmt], headers)

    def _scrape_targets(self, req: BoundedHandler) -> list[dict[str, Any]]:
        """Prometheus' HTTP SD answer, naming this collector as the scraper reached it."""
        host = str(req.headers.get("Host"))  # checked by handle() already
        shards = self._nodes.shards() if self._nodes is not None else []
        if self._nodes is None:
            return [{"targets": [host], "labels": {}}]
        return scrape_targets(host, shards)

    def _get_json(self, path: str, query: dict[str, list[str]]) -> tuple[HTTPStatus, object]:
        if path == "/api/v1/jobs" or path.startswith("/api/v1/jobs/"):
            return self._jobs_json(unquote(path.removeprefix("/api/v1/jobs").lstrip("/")))
        if path == preflight_api.PREFIX or path.startswith(preflight_api.PREFIX + "/"):
            return preflight_api.get(path, query, self._journal, self._preflight)
        return self._get_fleet_json(path, query)

    def _get_fleet_json(self, path: str, query: dict[str, list[str]]) -> tuple[HTTPStatus, object]:
        if path == "/api/v1/nodes":
            nodes = self._fleet.snapshot()
            flags = self._node_flags()
            return HTTPStatus.OK, {"nodes": [node_summary(n, flags) for n in nodes.values()]}
        if path.startswith("/api/v1/nodes/"):
            name = unquote(path.removeprefix("/api/v1/nodes/"))
            node = self._fleet.snapshot().get(name)
            if node is None:
                return HTTPStatus.NOT_FOUND, {"error": f"no node named {name!r}"}
            return HTTPStatus.OK, node_detail(node, self._node_flags())
        if path == "/api/v1/events":
            return HTTPStatus.OK, self._events(query)
        if path == "/api/v1/drains":
            return self._drains_json()
        return HTTPStatus.OK, incidents_api.get(path, query, self._journal)

    def _jobs_json(self, job_id: str) -> tuple[HTTPStatus, object]:
        jobs = self._jobs.summaries() if self._jobs is not None else []
        if not job_id:
            return HTTPStatus.OK, {"jobs": jobs}
        for job in jobs:
            if job["id"] == job_id:
                ranks = self._jobs.ranks(job_id) if self._jobs is not None else []
                evidence = self._jobs.evidence_of(job_id) if self._jobs is not None else None
                return HTTPStatus.OK, {**job, "rank_detail": ranks, "evidence": evidence}
        return HTTPStatus.NOT_FOUND, {"error": f"no job {job_id!r}"}

    def _drains_json(self) -> tuple[HTTPStatus, object]:
        if self._drains is None:
            return HTTPStatus.NOT_FOUND, {"error": "no actions are configured"}
        return HTTPStatus.OK, self._drains.drains()

    def handle_change(self, req: BoundedHandler) -> None:
        """Route a POST or DELETE (silences, drains, runs, dumps) once every check lets it through.

        In order: ``Host`` (no rebinding), ``Origin`` (no page of another origin), the guard
        (token, or loopback), ``Content-Type`` (JSON); then the body is read and acted on.
        """
        path = urlsplit(req.path).path.rstrip("/")
        try:
            length = incidents_api.body_length(
                req.headers.get_all("Content-Length") or [],
                transfer_encoding=req.headers.get("Transfer-Encoding"),
            )
        except incidents_api.ApiError as exc:
            self._refuse_error(req, exc)
            return
        if not self._admit_change(req, path, length):
            with contextlib.suppress(OSError, TimeoutError):  # closing on it would reset
                req.read_body(length)
            return
        try:
            body = req.read_body(length) if length else b""
            if not req.begin_answer():
                return
            incidents_api.check_body(body, length)
            if preflight_api.claims(req.command, path, body):
                status, answer = preflight_api.change(path, body, self._preflight)
                self._json(req, status, answer)
                return
            if jobs_api.claims(req.command, path):
                status, answer = jobs_api.change(path, body, self._job_desk)
                self._json(req, status, answer)
                return
            status, answer = incidents_api.change(
                req.command,
                path,
                body,
                writer=self._silences,
                now=self._clock.now() if self._clock is not None else 0.0,
                drains=self._drains,
            )
            self._json(req, status, answer)
        except (ConnectionError, TimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001 - every error is answered; a bug as a 500
            self._refuse_error(req, exc)

    def _admit_change(self, req: BoundedHandler, path: str, length: int) -> bool:
        """Run the checks a change must pass; answer the first refusal and return False."""
        host, origin = req.headers.get("Host"), req.headers.get("Origin")
        refusal = self._hosts.host_refusal(host)
        if refusal is not None:
            self._refuse(req, refusal, host=str(host)[:100])
            return False
        refusal = self._hosts.origin_refusal(origin, host)
        if refusal is not None:
            self._refuse(req, refusal, origin=str(origin)[:100])
            return False
        refusal = self._guard.check(
            client=str(req.client_address[0]),
            authorization=req.headers.get("Authorization"),
            method=req.command,
            path=path,
        )
        if refusal is not None:
            extra = (
                {"WWW-Authenticate": "Bearer"} if refusal.status == HTTPStatus.UNAUTHORIZED else {}
            )
            self._json(req, refusal.status, {"error": refusal.message}, extra)
            return False
        refusal = content_type_refusal(req.command, req.headers.get("Content-Type"), length)
        if refusal is not None:
            self._refuse(req, refusal)
            return False
        return True

    def _events(self, query: dict[str, list[str]]) -> dict[str, Any]:
        kind = query.get("kind", [None])[-1]
        if kind is not None and kind not in _KINDS:
            msg = f"kind={kind[:40]!r} is not one of {', '.join(sorted(_KINDS))}"
            raise BadRequestError(msg)
        order = query.get("order", ["asc"])[-1]
        if order not in ("asc", "desc"):
            msg = f"order={order[:40]!r} must be asc or desc"
            raise BadRequestError(msg)
        rows = self._journal.events(
            node=query.get("node", [None])[-1],
            kind=kind,
            after_id=_int_param(query, "after", 0, 0, 2**62),
            limit=_int_param(query, "limit", 100, 1, MAX_LIMIT),
            newest_first=order == "desc",
        )
        return {
            "events": [event_json(r) for r in rows],
            "last_id": rows[-1].id if rows else None,
        }

    def _json(
        self,
        req: BoundedHandler,
        status: HTTPStatus,
        body: object,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self._send(req, status, data, "application/json", headers)

    @staticmethod
    def _send(
        req: BoundedHandler,
        status: HTTPStatus,
        data: bytes,
        ctype: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        req.send_response(status)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            req.send_header(name, value)
        req.end_headers()
        req.wfile.write(data)
