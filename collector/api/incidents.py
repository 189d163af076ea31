"""The JSON API for incidents, actions and silences.

    GET    /api/v1/incidents?open=1&limit=     incidents, newest first
    GET    /api/v1/actions?node=&limit=        actions and their outcomes, newest first
    GET    /api/v1/silences                    silences not over yet
    POST   /api/v1/silences                    {"node": "*", "rule": "*", "duration": "2h",
                                                "starts_in": "0s", "reason": "..."} -> {"id": n}
    DELETE /api/v1/silences/<id>
    GET    /api/v1/drains                      nodes fleetwatch holds drained, drains waiting
    POST   /api/v1/drains/<node>/release       {"reason": "..."}: the node is back in service

Who may make changes is decided before :func:`change` runs (:mod:`collector.api.auth`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import unquote

from collector.store.incidents import SilenceRow
from rules.durations import parse_duration

if TYPE_CHECKING:
    from http.server import BaseHTTPRequestHandler

    from collector.store.events import EventReader

MAX_BODY: Final = 64 * 1024


class ApiError(ValueError):
    """A request the API refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        """Keep the status with the message."""
        super().__init__(message)
        self.status = status


class DrainKeeper(Protocol):
    """Lists and releases fleetwatch's drains (thread-safe)."""

    def drains(self) -> dict[str, Any]:
        """What is drained and what waits."""
        ...

    def release(self, node: str, reason: str) -> bool:
        """Stop holding ``node`` as drained; False when it was not."""
        ...


class SilenceWriter(Protocol):
    """Adds and removes silences through the collector's journal writer (thread-safe)."""

    def add(self, row: SilenceRow) -> int:
        """Store a silence; return its id."""
        ...

    def remove(self, silence_id: int) -> bool:
        """Delete a silence; False when there was none."""
        ...


def _limit(query: dict[str, list[str]]) -> int:
    try:
        value = int(query.get("limit", ["100"])[-1])
    except ValueError as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, "limit must be an integer") from exc
    if not 1 <= value <= 1000:  # noqa: PLR2004
        raise ApiError(HTTPStatus.BAD_REQUEST, "limit must be between 1 and 1000")
    return value


def get(path: str, query: dict[str, list[str]], journal: EventReader) -> object:
    """Answer a GET under /api/v1/incidents, /actions or /silences."""
    limit = _limit(query)
    if path == "/api/v1/incidents":
        open_only = query.get("open", ["0"])[-1] in ("1", "true")
        rows = journal.read(lambda s: s.incidents(open_only=open_only, limit=limit))
        return {"incidents": [asdict(r) for r in rows]}
    if path == "/api/v1/actions":
        node = query.get("node", [None])[-1]
        return {
            "actions": [
                asdict(r) for r in journal.read(lambda s: s.actions(node=node, limit=limit))
            ]
        }
    if path == "/api/v1/silences":
        return {"silences": [asdict(r) for r in journal.read(lambda s: s.silences())]}
    raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {path}")


def change(
    req: BaseHTTPRequestHandler,
    path: str,
    *,
    writer: SilenceWriter | None,
    now: float,
    drains: DrainKeeper | None = None,
) -> tuple[HTTPStatus, object]:
    """Answer a POST or DELETE on silences, or a release of a drain."""
    if writer is None:
        raise ApiError(HTTPStatus.NOT_FOUND, "this API is read-only")
    method = req.command
    length = int(req.headers.get("Content-Length") or 0)
    if length > MAX_BODY:
        raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
    body = req.rfile.read(length) if length > 0 else b""
    if method == "POST" and path.startswith("/api/v1/drains/") and path.endswith("/release"):
        return _release(path, body, drains)
    if method == "POST" and path == "/api/v1/silences":
        return HTTPStatus.CREATED, {"id": writer.add(silence_from_json(body, now))}
    if method == "DELETE" and path.startswith("/api/v1/silences/"):
        try:
            silence_id = int(path.removeprefix("/api/v1/silences/"))
        except ValueError as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, "a silence id is an integer") from exc
        if not writer.remove(silence_id):
            raise ApiError(HTTPStatus.NOT_FOUND, f"no silence {silence_id}")
        return HTTPStatus.OK, {"removed": silence_id}
    raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} {path} is not supported")


def _release(path: str, body: bytes, drains: DrainKeeper | None) -> tuple[HTTPStatus, object]:
    if drains is None:
        raise ApiError(HTTPStatus.NOT_FOUND, "no actions are configured")
    node = unquote(path.removeprefix("/api/v1/drains/").removesuffix("/release"))
    try:
        data: Any = json.loads(body or b"{}")
    except json.JSONDecodeError as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {exc}") from exc
    if not isinstance(data, dict) or set(data) - {"reason"}:
        raise ApiError(HTTPStatus.BAD_REQUEST, "a release takes only a reason")
    if not drains.release(node, str(data.get("reason", ""))[:500]):
        raise ApiError(HTTPStatus.NOT_FOUND, f"fleetwatch holds no drain of {node!r}")
    return HTTPStatus.OK, {"released": node}


def silence_from_json(body: bytes, now: float) -> SilenceRow:
    """Check a silence request; ApiError says what is wrong."""
    if len(body) > MAX_BODY:
        raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
    try:
        data: Any = json.loads(body or b"{}")
    except json.JSONDecodeError as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {exc}") from exc
    if not isinstance(data, dict) or set(data) - {
        "node",
        "rule",
        "duration",
        "starts_in",
        "reason",
    }:
        raise ApiError(
            HTTPStatus.BAD_REQUEST, "a silence takes node, rule, duration, starts_in, reason"
        )
    try:
        duration = parse_duration(data.get("duration"))
        starts_in = parse_duration(data.get("starts_in", 0))
    except ValueError as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, str(exc)) from exc
    if duration <= 0:
        raise ApiError(HTTPStatus.BAD_REQUEST, "duration must be positive")
    node, rule, reason = (
        str(data.get(k, d)) for k, d in (("node", "*"), ("rule", "*"), ("reason", ""))
    )
    start = int((now + starts_in) * 1000)
    return SilenceRow(
        node=node[:253],
        rule=rule[:64],
        starts_ms=start,
        ends_ms=start + int(duration * 1000),
        reason=reason[:500],
        created_ms=int(now * 1000),
    )
