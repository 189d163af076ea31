"""HTTP: ``/metrics`` for Prometheus and a read-only JSON API, on a thread of its own.

GET /metrics                      Prometheus text exposition
GET /healthz                      "ok" while the collector runs
GET /api/v1/nodes                 every node with a health summary
GET /api/v1/nodes/<name>          one node, down to each NVLink and IB port
GET /api/v1/events?node=&kind=&after=&limit=&order=asc|desc
journaled events, paged by journal id
GET /api/v1/jobs                  training jobs with their throughput, MFU, stragglers, drops
GET /api/v1/jobs/<id>             one job, with each rank's node, GPU and compute-time ratio

POST and DELETE (silences, drain releases: :mod:`collector.api.incidents`) pass the
:class:`~collector.api.auth.ChangeGuard` first: a bearer token, or loopback when none is set.
"""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

import structlog
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from collector.api import incidents as incidents_api
from collector.model.node_states import NodeFlags, node_state
from fleetwatch.model import EventKind

if TYPE_CHECKING:
    from collections.abc import Callable

    from prometheus_client.registry import CollectorRegistry

    from collector.api.auth import ChangeGuard
    from collector.api.incidents import DrainKeeper, SilenceWriter
    from collector.jobs.book import JobBook
    from collector.model.fleet import FleetModel
    from collector.model.state import NodeState
    from collector.store.events import EventReader, EventRow
    from fleetwatch.clock import Clock

log = structlog.get_logger("collector.http")

MAX_LIMIT: Final = 1000
_KINDS: Final = frozenset(k.value for k in EventKind)


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
    """Serves HTTP on a daemon thread: reads; writes only silences and drain releases."""

    def __init__(  # noqa: PLR0913 - what the API reads and the two things it writes
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
    ) -> None:
        """Bind now (so a busy port fails at start-up); serve on :meth:`start`.

        ``guard`` decides who may make changes; ``node_flags`` says which nodes are drained,
        draining or have a firing incident.
        """
        self._guard = guard
        self._jobs = jobs
        self._node_flags = node_flags
        self._fleet = fleet
        self._journal = journal
        self._registry = registry
        self._silences = silences
        self._drains = drains
        self._clock = clock
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api.handle(self)

            def do_POST(self) -> None:
                api.handle_change(self)

            def do_DELETE(self) -> None:
                api.handle_change(self)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                """Quiet: requests are not worth a log line each."""

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when asked for port 0)."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Serve in the background."""
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            name="http-api",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        """Route one GET request."""
        url = urlsplit(req.path)
        path = url.path.rstrip("/") or "/"
        try:
            if path == "/metrics":
                self._send(req, HTTPStatus.OK, generate_latest(self._registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(req, HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
            else:
                status, body = self._get_json(path, parse_qs(url.query))
                self._json(req, status, body)
        except BadRequestError as exc:
            self._json(req, HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except incidents_api.ApiError as exc:
            self._json(req, exc.status, {"error": str(exc)})
        except Exception as exc:
            log.exception("http_request_failed", path=path)
            self._json(req, HTTPStatus.INTERNAL_SERVER_ERROR, {"error": type(exc).__name__})

    def _get_json(self, path: str, query: dict[str, list[str]]) -> tuple[HTTPStatus, object]:
        if path == "/api/v1/jobs" or path.startswith("/api/v1/jobs/"):
            return self._jobs_json(unquote(path.removeprefix("/api/v1/jobs").lstrip("/")))
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
                return HTTPStatus.OK, {**job, "rank_detail": ranks}
        return HTTPStatus.NOT_FOUND, {"error": f"no job {job_id!r}"}

    def _drains_json(self) -> tuple[HTTPStatus, object]:
        if self._drains is None:
            return HTTPStatus.NOT_FOUND, {"error": "no actions are configured"}
        return HTTPStatus.OK, self._drains.drains()

    def handle_change(self, req: BaseHTTPRequestHandler) -> None:
        """Route a POST or DELETE (silences, drain releases) once the guard lets it through."""
        path = urlsplit(req.path).path.rstrip("/")
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
            return
        try:
            status, answer = incidents_api.change(
                req,
                path,
                writer=self._silences,
                now=self._clock.now() if self._clock is not None else 0.0,
                drains=self._drains,
            )
            self._json(req, status, answer)
        except incidents_api.ApiError as exc:
            self._json(req, exc.status, {"error": str(exc)})
        except Exception as exc:
            log.exception("http_request_failed", path=path)
            self._json(req, HTTPStatus.INTERNAL_SERVER_ERROR, {"error": type(exc).__name__})

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
        req: BaseHTTPRequestHandler,
        status: HTTPStatus,
        body: object,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self._send(req, status, data, "application/json", headers)

    @staticmethod
    def _send(
        req: BaseHTTPRequestHandler,
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
