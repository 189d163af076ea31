"""The JSON API for incidents, actions and silences.

    GET    /api/v1/incidents?open=1&limit=     incidents, newest first
    GET    /api/v1/actions?node=&limit=        actions and their outcomes, newest first
    GET    /api/v1/silences                    silences not over yet
    POST   /api/v1/silences                    {"node": "*", "rule": "*", "duration": "2h",
                                                "starts_in": "0s", "reason": "..."} -> {"id": n}
    DELETE /api/v1/silences/<id>
    GET    /api/v1/drains                      nodes fleetwatch holds drained, drains waiting
    POST   /api/v1/drains/<node>/release       {"reason": "..."}: the node is back in service

Who may make changes, and whether a request is one a web page could have made, is decided
before :func:`change` runs (:mod:`collector.api.auth`, :mod:`collector.api.browsers`); the
server reads the body.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import unquote

from collector.store.incidents import SilenceRow
from fleetwatch.config_file import short_repr
from rules.durations import parse_duration

if TYPE_CHECKING:
    from collector.store.events import EventReader

MAX_BODY: Final = 64 * 1024
MAX_ID: Final = 2**63 - 1  # journal ids are 64-bit integers (SQLite, PostgreSQL bigint)


class ApiError(ValueError):
    """A request the API refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        """Keep the status with the message."""
        super().__init__(message)
        self.status = status


class DrainKeeper(Protocol):
    """Lists and releases fleetwatch's drains (thread-safe; LoopBusyError when it cannot)."""

    def drains(self) -> dict[str, Any]:
        """What is drained and what waits."""
        ...

    def release(self, node: str, reason: str) -> bool:
        """Stop holding ``node`` as drained; False when it was not."""
        ...


class SilenceWriter(Protocol):
    """Adds and removes silences through the collector's journal writer (thread-safe).

    Both raise LoopBusyError when the collector's event loop does not answer in time.
    """

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


def body_length(values: list[str], *, transfer_encoding: str | None = None) -> int:
    """The body's length from its ``Content-Length`` header(s); ApiError when it is unusable."""
    if transfer_encoding is not None:
        msg = "send the body with a Content-Length, not a Transfer-Encoding"
        raise ApiError(HTTPStatus.LENGTH_REQUIRED, msg)
    if len({v.strip() for v in values}) > 1:
        raise ApiError(HTTPStatus.BAD_REQUEST, "the request has conflicting Content-Length headers")
    text = values[0].strip() if values else "0"
    if not (text.isascii() and text.isdecimal()):
        msg = f"Content-Length {short_repr(text, 40)} is not a number of bytes"
        raise ApiError(HTTPStatus.BAD_REQUEST, msg)
    if len(text) > len(str(MAX_BODY)) or int(text) > MAX_BODY:
        msg = f"the request body is larger than {MAX_BODY} bytes"
        raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, msg)
    return int(text)


def check_body(body: bytes, length: int) -> None:
    """ApiError when the body read is shorter than its ``Content-Length`` said."""
    if len(body) < length:
        msg = f"the request body ended after {len(body)} of its {length} bytes"
        raise ApiError(HTTPStatus.BAD_REQUEST, msg)


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """``body`` as a JSON object (empty: ``{}``); ApiError says why it is not one."""
    try:
        data: Any = json.loads(body or b"{}")
    except RecursionError as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, "body is not JSON: nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, or bytes that are no UTF-8, -16 or -32
        raise ApiError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {str(exc)[:200]}") from exc
    if not isinstance(data, dict):
        raise ApiError(HTTPStatus.BAD_REQUEST, f"{what} is a JSON object")
    return data


def _silence_id(text: str) -> int:
    digits = text.isascii() and text.isdecimal() and len(text) <= len(str(MAX_ID))
    if not digits or not 1 <= int(text) <= MAX_ID:
        msg = f"a silence id is an integer from 1 to {MAX_ID}, not {short_repr(text, 40)}"
        raise ApiError(HTTPStatus.BAD_REQUEST, msg)
    return int(text)


def change(  # noqa: PLR0913 - the request (method, path, body) and what it may change
    method: str,
    path: str,
    body: bytes,
    *,
    writer: SilenceWriter | None,
    now: float,
    drains: DrainKeeper | None = None,
) -> tuple[HTTPStatus, object]:
    """Answer a POST or DELETE on silences, or a release of a drain."""
    if writer is None:
        raise ApiError(HTTPStatus.NOT_FOUND, "this API is read-only")
    if method == "POST" and path.startswith("/api/v1/drains/") and path.endswith("/release"):
        return _release(path, body, drains)
    if method == "POST" and path == "/api/v1/silences":
        return HTTPStatus.CREATED, {"id": writer.add(silence_from_json(body, now))}
    if method == "DELETE" and path.startswith("/api/v1/silences/"):
        silence_id = _silence_id(path.removeprefix("/api/v1/silences/"))
        if not writer.remove(silence_id):
            raise ApiError(HTTPStatus.NOT_FOUND, f"no silence {silence_id}")
        return HTTPStatus.OK, {"removed": silence_id}
    raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} {path} is not supported")


def _release(path: str, body: bytes, drains: DrainKeeper | None) -> tuple[HTTPStatus, object]:
    if drains is None:
        raise ApiError(HTTPStatus.NOT_FOUND, "no actions are configured")
    node = unquote(path.removeprefix("/api/v1/drains/").removesuffix("/release"))
    data = json_object(body, "a release")
    if set(data) - {"reason"}:
        raise ApiError(HTTPStatus.BAD_REQUEST, "a release takes only a reason")
    if not drains.release(node, str(data.get("reason", ""))[:500]):
        raise ApiError(HTTPStatus.NOT_FOUND, f"fleetwatch holds no drain of {node!r}")
    return HTTPStatus.OK, {"released": node}


def silence_from_json(body: bytes, now: float) -> SilenceRow:
    """Check a silence request; ApiError says what is wrong."""
    if len(body) > MAX_BODY:
        raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
    data = json_object(body, "a silence")
    if set(data) - {
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
