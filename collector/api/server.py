"""HTTP: ``/metrics`` for Prometheus and a read-only JSON API, on a thread of its own.

GET /metrics                      Prometheus exposition of every series (text or OpenMetrics)
GET /metrics/fleet                every series but the nodes' (fleet, jobs, incidents, itself)
GET /metrics/shards/<n>           the nodes' series of shard n (collector.export.exposition)
GET /api/v1/scrape_targets        the targets above, for Prometheus' HTTP service discovery
GET /healthz                      "ok" while the collector runs
GET /api/v1/nodes, /events, /jobs the fleet's nodes, events and jobs (:mod:`collector.api.fleet`)
GET /api/v1/nodes/<n>/evidence    a node's evidence bundle, a gzip'd tar
                                  (:mod:`collector.model.evidence`)
GET /api/v1/incidents, ...        incidents, actions, silences, drains
                                  (:mod:`collector.api.incidents`)
GET /api/v1/reliability           time between incidents, to repair, GPU time lost, lemons
                                  (:mod:`collector.api.reliability`)
POST /api/v1/jobs/<id>/dump       gather a job's evidence now (:mod:`collector.api.jobs`)

Every GET but ``/healthz`` takes only its own query parameters (:mod:`collector.api.query`):
another is a 400 that names it. Every request but ``/healthz`` must name the collector in
``Host`` (no DNS rebinding). POST and
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
from urllib.parse import urlsplit

import structlog
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from collector.api import incidents as incidents_api
from collector.api import jobs as jobs_api
from collector.api import preflight as preflight_api
from collector.api import query
from collector.api import reliability as reliability_api
from collector.api import rules_eval as rules_eval_api
from collector.api.auth import Refusal
from collector.api.browsers import HostNames, content_type_refusal
from collector.api.connections import BoundedHandler, BoundedHTTPServer, ConnectionLimits
from collector.api.fleet import FleetReads
from collector.api.query import BadRequestError, Params
from collector.exceptions import CollectorError, ConfigError, LoopBusyError, PortInUseError
from collector.export.exposition import OPENMETRICS, TEXT, gzip_body
from collector.model.evidence_pack import MEDIA_TYPE
from collector.model.node_states import NodeFlags
from collector.model.target_keys import FLEET_KEY, job_key
from fleetwatch.clock import SystemClock

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from prometheus_client.registry import CollectorRegistry

    from collector.api.auth import ChangeGuard
    from collector.api.incidents import DrainKeeper, SilenceWriter
    from collector.api.jobs import JobDesk
    from collector.api.preflight import PreflightDesk
    from collector.api.rules_eval import RulesDesk
    from collector.export.exposition import NodeExposition
    from collector.jobs.book import JobBook
    from collector.model.fleet import FleetModel
    from collector.model.lifecycle import Lifecycle
    from collector.store.events import EventReader
    from fleetwatch.clock import Clock
    from rules.model import Rule, RuleSet

__all__ = ["ApiServer", "BadRequestError", "exposition_format", "scrape_targets", "wants_gzip"]

log = structlog.get_logger("collector.http")

# The incidents module's GETs (the rest: the fleet's reads, pre-flight's, the metrics).
_INCIDENT_READS: Final = frozenset({"/api/v1/incidents", "/api/v1/actions", "/api/v1/silences"})
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


def _listen_error(host: str, port: int, exc: OSError) -> CollectorError:
    """One line for a bind that failed: the address, and what the kernel said."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return PortInUseError(f"http {where}: port {port} is in use (another collector?)")
    return ConfigError(f"http {where}: cannot listen there: {exc.strerror or exc}")


class ApiServer:
    """Serves HTTP on a daemon thread: reads; changes only silences, drains, runs and dumps."""

    def __init__(  # noqa: PLR0913 - what the API reads, the things it writes, its limits
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
        rules: Callable[[], RuleSet] | None = None,
        rules_desk: RulesDesk | None = None,
        lifecycle: Lifecycle | None = None,
        reliability: Callable[[str | None, float], dict[str, Any] | None] | None = None,
    ) -> None:
        """Bind now (so a busy port fails at start-up); serve on :meth:`start`.

        ``guard`` decides who may make changes; ``node_flags`` says which nodes are drained,
        draining or have a firing incident. ``allowed_hosts`` (``http_allowed_hosts``) and
        ``local_names`` (None: :func:`local_host_names`) are the names besides ``host`` that
        ``Host`` may give; ``limits`` bound connections (None: the defaults). ``nodes`` renders
        the nodes' series (None: ``registry`` holds every series, and there are no shards).
        ``job_desk`` gathers a job's evidence on demand (None: ``POST .../dump`` is refused).
        ``rules`` gives the rules in use now (a reload swaps them): each incident carries its
        rule's description and runbook, and a silence must name one of them unless forced
        (None: incidents carry only the pre-flight holds' text, silences' rules are not
        checked). ``clock`` (None: the system's) is what ``since=2h`` counts back from.
        ``rules_desk`` runs dry runs of rules (None: ``POST /api/v1/rules/eval`` is refused).
        ``lifecycle`` says where each node stands (None: every node reads as in service).
        ``reliability(node, window_s)`` answers ``/api/v1/reliability`` (None: a 404).
        """
        self._guard = guard
        self._jobs = jobs
        self._fleet = fleet
        self._journal = journal
        self._rules = rules
        self._reads = FleetReads(
            fleet=fleet, journal=journal, node_flags=node_flags, jobs=jobs, lifecycle=lifecycle
        )
        self._registry = registry
        self._nodes = nodes
        self._silences = silences
        self._drains = drains
        self._preflight = preflight  # pre-flight runs and checked releases (None: none)
        self._job_desk = job_desk
        self._rules_desk = rules_desk
        self._reliability = reliability
        self._clock: Clock = clock if clock is not None else SystemClock()
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
            name = query.endpoint(path)
            if path == "/healthz":  # takes anything: a probe's parameters are none of our business
                self._send(req, HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
            elif name is None:
                self._json(req, HTTPStatus.NOT_FOUND, {"error": f"no such path {path[:100]!r}"})
            else:
                self._get(req, name, path, Params.read(name, url.query, self._clock.now()))
        except (ConnectionError, TimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001 - every error is answered; a bug as a 500
            self._refuse_error(req, exc)

    def _get(self, req: BoundedHandler, name: str, path: str, params: Params) -> None:
        """Answer endpoint ``name`` (its parameters already checked)."""
        if name.startswith("/metrics"):
            self._metrics(req, path)
        elif name == "/api/v1/scrape_targets":
            self._json(req, HTTPStatus.OK, self._scrape_targets(req))
        elif name in _INCIDENT_READS:
            self._json(
                req, HTTPStatus.OK, incidents_api.get(name, params, self._journal, self._book)
            )
        elif name == "/api/v1/drains":
            self._json(req, *self._drains_json(params))
        elif name.startswith(preflight_api.PREFIX):
            self._json(req, *preflight_api.get(path, params, self._journal, self._preflight))
        elif name == reliability_api.PATH:
            self._json(req, *reliability_api.get(params, self._reliability))
        elif name == query.EVIDENCE:
            bundle = self._reads.evidence(path, params)
            disposition = {"Content-Disposition": f'attachment; filename="{bundle.name}"'}
            self._send(req, HTTPStatus.OK, bundle.data, MEDIA_TYPE, disposition)
        else:
            self._json(req, *self._reads.get(name, path, params))

    def _book(self) -> dict[str, Rule]:
        """The rules incidents may name now, by name."""
        return incidents_api.rule_book(self._rules() if self._rules is not None else None)

    def _known(self) -> incidents_api.Known:
        """The nodes and rules a silence may name without ``force``."""
        rules = None if self._rules is None else (lambda: self._book().keys())
        return incidents_api.Known(nodes=self._known_nodes, rules=rules)

    def _known_nodes(self) -> set[str]:
        """The fleet's nodes (in a shared journal, the other collectors' too), ``fleet``, jobs."""
        names = set(self._fleet.node_names())
        names.update(self._journal.node_names())
        names.add(FLEET_KEY)
        jobs = self._jobs.summaries() if self._jobs is not None else []
        names.update(job_key(str(job["id"])) for job in jobs)
        return names

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

    def _drains_json(self, params: Params) -> tuple[HTTPStatus, object]:
        if self._drains is None:
            return HTTPStatus.NOT_FOUND, {"error": "no actions are configured"}
        answer = self._drains.drains()
        return HTTPStatus.OK, incidents_api.drains_json(answer, params.text("node"), self._journal)

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
            if rules_eval_api.claims(req.command, path):
                status, answer = rules_eval_api.change(body, self._rules_desk)
                self._json(req, status, answer)
                return
            status, answer = incidents_api.change(
                req.command,
                path,
                body,
                writer=self._silences,
                now=self._clock.now(),
                drains=self._drains,
                known=self._known(),
                created_by=self._guard.identity(
                    (str(req.client_address[0]), int(req.client_address[1])),
                    _local_address(req),
                    req.headers.get("Authorization"),
                ),
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


def _local_address(req: BoundedHandler) -> tuple[str, int]:
    """The address and port the request came in on (ours), as the client's socket names it."""
    try:
        name = req.connection.getsockname()
    except OSError:
        return ("", 0)
    return (str(name[0]), int(name[1]))
