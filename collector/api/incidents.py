"""The JSON API for incidents, actions and silences.

    GET    /api/v1/incidents?open=1&node=&rule=&since=&until=&limit=
                                               incidents, newest first, each with its rule's
                                               description and runbook
    GET    /api/v1/actions?node=&since=&until=&limit=
                                               actions and their outcomes, newest first
    GET    /api/v1/silences?node=              silences not over yet (covering the node)
    POST   /api/v1/silences                    {"node": "node-7", "rule": "*", "duration": "2h",
                                                "starts_in": "0s", "reason": "...",
                                                "all": false, "force": false} -> {"id": n}
    DELETE /api/v1/silences/<id>
    GET    /api/v1/drains?node=                nodes fleetwatch holds drained, drains waiting
    POST   /api/v1/drains/<node>/release       {"reason": "..."}: the node is back in service

The query parameters are checked and read by :mod:`collector.api.query`. A silence must name a
node or a rule (every rule on every node takes ``"all": true``), exactly (no globs: a silence
matches one name, or ``*`` for all), and one the collector knows (a node of the fleet, a loaded
rule) unless it says ``"force": true``; it records who added it (``created_by``, what the
:class:`~collector.api.auth.ChangeGuard` knows of them).

Who may make changes, and whether a request is one a web page could have made, is decided
before :func:`change` runs (:mod:`collector.api.auth`, :mod:`collector.api.browsers`); the
server reads the body.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import unquote

from collector.model.lifecycle import PERSON_MOVES, LifecycleError
from collector.preflight.holds import hold_rule
from collector.store.incidents import SilenceRow
from fleetwatch.config_file import short_repr, shown_key
from fleetwatch.preflight.vocabulary import Check
from rules.durations import parse_duration

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Mapping

    from collector.api.query import Params
    from collector.store.events import EventReader
    from collector.store.incidents import IncidentRow
    from rules.model import Rule, RuleSet

MAX_BODY: Final = 64 * 1024
MAX_ID: Final = 2**63 - 1  # journal ids are 64-bit integers (SQLite, PostgreSQL bigint)
MAX_LIMIT: Final = 1000  # rows a list gives at most
EVERY: Final = "*"  # a silence's node or rule that matches every one
GLOB: Final = frozenset("*?[]")  # what would make a name a pattern: silences have none
_SILENCE_KEYS: Final = ("node", "rule", "duration", "starts_in", "reason", "all", "force")
_SUGGESTIONS: Final = 3


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

    def release(self, node: str, reason: str, by: str = "") -> bool:
        """Stop holding ``node`` as drained (``by``: who asked); False when it was not."""
        ...

    def move(self, node: str, move: str, reason: str, by: str = "") -> dict[str, Any]:
        """A person's lifecycle move of ``node`` (repair, repaired, rma); where it stands now.

        Raises:
            LifecycleError: the node may not go there from where it stands.
        """
        ...


class SilenceWriter(Protocol):
    """Adds and removes silences through the collector's journal writer (thread-safe).

    Both raise LoopBusyError when the collector's event loop does not answer in time.
    """

    def add(self, row: SilenceRow) -> int:
        """Store a silence; return its id."""
        ...

    def remove(self, silence_id: int, by: str = "") -> bool:
        """Delete a silence (``by``: who asked, for the log); False when there was none."""
        ...


@dataclass(frozen=True, slots=True)
class Known:
    """The names a silence may give without ``force``, read only when one gives a name.

    ``nodes``: the fleet's nodes (and the other incident keys: ``fleet``, ``job/<id>``);
    ``rules``: the rules' names, or None where the server is not told them (not checked then).
    """

    nodes: Callable[[], Collection[str]]
    rules: Callable[[], Collection[str]] | None = None


def rule_book(rules: RuleSet | None) -> dict[str, Rule]:
    """Every rule an incident may name, by name: ``rules`` and the pre-flight holds' rules."""
    book = {f"preflight_{c.value}": hold_rule(c.value) for c in Check}
    book.update({r.name: r for r in (rules.rules if rules is not None else ())})
    return book


def incident_json(row: IncidentRow, rule: Rule | None) -> dict[str, Any]:
    """An incident as the API gives it: the journal's row and its rule's text ("" when none)."""
    return {
        **asdict(row),
        "description": rule.description if rule is not None else "",
        "runbook": rule.runbook if rule is not None else "",
        "mode": rule.mode.value if rule is not None else "act",
    }


def get(
    path: str,
    params: Params,
    journal: EventReader,
    rules: Callable[[], Mapping[str, Rule]] | None = None,
) -> object:
    """Answer a GET of /api/v1/incidents, /actions or /silences (``path``, its parameters).

    ``rules`` gives the rules in use now, by name, for each incident's description and runbook
    (None: every incident's are empty).
    """
    if path == "/api/v1/incidents":
        return {"incidents": _incidents(params, journal, rules() if rules is not None else {})}
    if path == "/api/v1/actions":
        limit = params.integer("limit", 100, 1, MAX_LIMIT)
        node, (since, until) = params.text("node"), params.window()
        rows = journal.read(
            lambda s: s.actions(node=node, limit=limit, since_ms=since, until_ms=until)
        )
        return {"actions": [asdict(r) for r in rows]}
    if path == "/api/v1/silences":
        node, now_ms = params.text("node"), int(params.now * 1000)
        silences = journal.read(lambda s: s.silences(active_at_ms=now_ms, node=node))
        return {"silences": [asdict(r) for r in silences]}
    raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {path}")


def _incidents(
    params: Params, journal: EventReader, book: Mapping[str, Rule]
) -> list[dict[str, Any]]:
    limit, open_only = params.integer("limit", 100, 1, MAX_LIMIT), params.flag("open")
    node, rule, (since, until) = params.text("node"), params.text("rule"), params.window()
    rows = journal.read(
        lambda s: s.incidents(
            open_only=open_only, limit=limit, node=node, rule=rule, since_ms=since, until_ms=until
        )
    )
    return [incident_json(r, book.get(r.rule)) for r in rows]


def drains_json(
    answer: Mapping[str, Any], node: str | None, journal: EventReader
) -> dict[str, Any]:
    """``GET /api/v1/drains``: what the dispatcher answered, cut to ``node`` when given.

    ``drained`` and ``waiting`` keep the node's own entries (a waiting action's node is in the
    journal); the counts (``drained_nodes``, ``drain_cap``, ...) stay the fleet's.
    """
    if node is None:
        return dict(answer)
    waiting: list[dict[str, Any]] = list(answer.get("waiting", []))
    ids = [int(w["action_id"]) for w in waiting]
    nodes = journal.read(lambda s: s.action_nodes(ids)) if ids else {}
    return {
        **answer,
        "drained": {n: i for n, i in dict(answer.get("drained", {})).items() if n == node},
        "waiting": [w for w in waiting if nodes.get(int(w["action_id"])) == node],
    }


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
    known: Known | None = None,
    created_by: str = "",
) -> tuple[HTTPStatus, object]:
    """Answer a POST or DELETE on silences, or a release of a drain.

    ``known`` says which nodes and rules a silence may name without ``force`` (None: any);
    ``created_by`` is who the request came from, recorded with a silence.
    """
    if writer is None:
        raise ApiError(HTTPStatus.NOT_FOUND, "this API is read-only")
    if method == "POST" and path.startswith("/api/v1/drains/") and path.endswith("/release"):
        return _release(path, body, drains, created_by)
    if method == "POST" and path.startswith("/api/v1/nodes/") and path.endswith("/lifecycle"):
        return _move(path, body, drains, created_by, known)
    if method == "POST" and path == "/api/v1/silences":
        row = silence_from_json(body, now, known=known, created_by=created_by)
        return HTTPStatus.CREATED, {"id": writer.add(row)}
    if method == "DELETE" and path.startswith("/api/v1/silences/"):
        silence_id = _silence_id(path.removeprefix("/api/v1/silences/"))
        if not writer.remove(silence_id, by=created_by):
            raise ApiError(HTTPStatus.NOT_FOUND, f"no silence {silence_id}")
        return HTTPStatus.OK, {"removed": silence_id}
    raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} {path} is not supported")


def _release(
    path: str, body: bytes, drains: DrainKeeper | None, by: str = ""
) -> tuple[HTTPStatus, object]:
    if drains is None:
        raise ApiError(HTTPStatus.NOT_FOUND, "no actions are configured")
    node = unquote(path.removeprefix("/api/v1/drains/").removesuffix("/release"))
    data = json_object(body, "a release")
    if set(data) - {"reason"}:
        raise ApiError(HTTPStatus.BAD_REQUEST, "a release takes only a reason")
    if not drains.release(node, str(data.get("reason", ""))[:500], by):
        raise ApiError(HTTPStatus.NOT_FOUND, f"fleetwatch holds no drain of {node!r}")
    return HTTPStatus.OK, {"released": node}


def _move(
    path: str, body: bytes, drains: DrainKeeper | None, by: str, known: Known | None
) -> tuple[HTTPStatus, object]:
    """``POST /api/v1/nodes/<node>/lifecycle`` ``{"move": "repair", "reason": "..."}``."""
    if drains is None:
        raise ApiError(HTTPStatus.NOT_FOUND, "no actions are configured")
    node = unquote(path.removeprefix("/api/v1/nodes/").removesuffix("/lifecycle"))
    data = json_object(body, "a lifecycle move")
    if set(data) - {"move", "reason"}:
        raise ApiError(HTTPStatus.BAD_REQUEST, "a lifecycle move takes only move and reason")
    move = data.get("move")
    if not isinstance(move, str) or move not in PERSON_MOVES:
        shown = short_repr(move) if move is not None else "nothing"
        moves = ", ".join(PERSON_MOVES)
        raise ApiError(HTTPStatus.BAD_REQUEST, f"move must be one of {moves}, not {shown}")
    if known is not None and node not in (names := set(known.nodes())):
        close = difflib.get_close_matches(node, list(names), n=_SUGGESTIONS)
        hint = f" (did you mean {', '.join(shown_key(c) for c in close)}?)" if close else ""
        raise ApiError(HTTPStatus.NOT_FOUND, f"no node {short_repr(node, 80)} in the fleet{hint}")
    try:
        answer = drains.move(node, move, str(data.get("reason", ""))[:500], by)
    except LifecycleError as exc:
        raise ApiError(HTTPStatus.CONFLICT, str(exc)) from None
    return HTTPStatus.OK, answer


def silence_from_json(
    body: bytes, now: float, *, known: Known | None = None, created_by: str = ""
) -> SilenceRow:
    """Check a silence request; ApiError says what is wrong.

    ``known`` (None: nothing is checked) gives the nodes and rules a silence may name unless it
    says ``"force": true``; ``created_by`` is recorded as who added it.
    """
    if len(body) > MAX_BODY:
        raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
    data = json_object(body, "a silence")
    if set(data) - set(_SILENCE_KEYS):
        raise ApiError(HTTPStatus.BAD_REQUEST, f"a silence takes {', '.join(_SILENCE_KEYS)}")
    try:
        duration = parse_duration(data.get("duration"))
        starts_in = parse_duration(data.get("starts_in", 0))
    except ValueError as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, str(exc)) from exc
    if duration <= 0:
        raise ApiError(HTTPStatus.BAD_REQUEST, "duration must be positive")
    every, force = _boolean(data, "all"), _boolean(data, "force")
    node, rule, reason = (
        str(data.get(k, d)) for k, d in (("node", EVERY), ("rule", EVERY), ("reason", ""))
    )
    node, rule = node[:253], rule[:64]
    _check_scope(node, rule, every=every)
    if known is not None and not force:
        if node != EVERY:
            _check_known("node", node, known.nodes(), "in the fleet")
        if rule != EVERY and known.rules is not None:
            _check_known("rule", rule, known.rules(), "among the loaded rules")
    start = int((now + starts_in) * 1000)
    return SilenceRow(
        node=node,
        rule=rule,
        starts_ms=start,
        ends_ms=start + int(duration * 1000),
        reason=reason[:500],
        created_ms=int(now * 1000),
        created_by=created_by,
    )


def _boolean(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        msg = f"{key} must be true or false, not {short_repr(value, 40)}"
        raise ApiError(HTTPStatus.BAD_REQUEST, msg)
    return value


def _check_scope(node: str, rule: str, *, every: bool) -> None:
    """ApiError unless the silence names its node and rule exactly, and all of them on purpose."""
    for what, name in (("node", node), ("rule", rule)):
        if not name or (name != EVERY and GLOB & set(name)):
            msg = (
                f"{what} {short_repr(name, 80)} is not a {what} name: a silence matches one "
                f"{what} exactly, or {EVERY} for every {what} (no patterns)"
            )
            raise ApiError(HTTPStatus.BAD_REQUEST, msg)
    if node == rule == EVERY and not every:
        msg = 'a silence of every rule on every node needs "all": true'
        raise ApiError(HTTPStatus.BAD_REQUEST, msg)
    if every and (node, rule) != (EVERY, EVERY):
        msg = '"all": true silences every rule on every node: send it without a node or rule'
        raise ApiError(HTTPStatus.BAD_REQUEST, msg)


def _check_known(what: str, name: str, names: Iterable[str], where: str) -> None:
    """ApiError naming ``name`` (and the close ones) unless it is one of ``names``."""
    pool = set(names)
    if name in pool:
        return
    close = difflib.get_close_matches(name, list(pool), n=_SUGGESTIONS)
    hint = f" (did you mean {', '.join(shown_key(c) for c in close)}?)" if close else ""
    msg = (
        f"no {what} {short_repr(name, 80)} {where}{hint}; to silence it anyway (one not seen "
        'yet), send "force": true'
    )
    raise ApiError(HTTPStatus.BAD_REQUEST, msg)
