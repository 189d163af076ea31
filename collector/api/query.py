"""The query parameters of the API's GETs: which each endpoint takes, and how each is read.

Every GET endpoint but ``/healthz`` takes only the parameters :data:`TAKES` lists for it; any
other is a 400 that names it, so a typo (``?nodes=``) or a filter this collector does not have
is never ignored and answered with everything. A parameter given twice counts by its last
value; one given empty (``?node=``) counts as left out.

A time (``since``, ``until``) is one of:

- a duration back from now: ``30m``, ``2h``, ``1d``, ``90s``, ``1h30m``
  (:func:`rules.durations.parse_duration`);
- an ISO-8601 time: ``2026-12-02T03:00``, ``2026-12-02T03:00:00Z``,
  ``2026-12-02T03:00:00+01:00``, ``2026-12-02``; one without a zone is UTC;
- Unix seconds: ``1764644400`` (digits, and at most six decimals).

Every error raised here is a :class:`BadRequestError`: the server answers it 400 and counts it
as a ``bad_request`` refusal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qs

from fleetwatch.config_file import short_repr, shown_keys
from rules.durations import parse_duration

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping


class BadRequestError(ValueError):
    """A query parameter is wrong; the message says which and why."""


_NONE: Final[frozenset[str]] = frozenset()
_WINDOW: Final = frozenset({"since", "until"})
# Each GET endpoint (as messages name it) and the query parameters it takes.
TAKES: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "/metrics": _NONE,
        "/metrics/fleet": _NONE,
        "/metrics/shards/<n>": _NONE,
        "/api/v1/scrape_targets": _NONE,
        "/api/v1/nodes": _NONE,
        "/api/v1/nodes/<name>": _NONE,
        "/api/v1/nodes/<name>/evidence": frozenset({"since"}),
        "/api/v1/nodes/<name>/lifecycle": frozenset({"since"}),
        "/api/v1/events": frozenset({"node", "kind", "after", "limit", "order"}) | _WINDOW,
        "/api/v1/incidents": frozenset({"limit", "node", "open", "rule"}) | _WINDOW,
        "/api/v1/actions": frozenset({"limit", "node"}) | _WINDOW,
        "/api/v1/silences": frozenset({"node"}),
        "/api/v1/drains": frozenset({"node"}),
        "/api/v1/jobs": frozenset({"node"}),
        "/api/v1/jobs/<id>": _NONE,
        "/api/v1/preflight": frozenset({"limit", "node"}),
        "/api/v1/preflight/<id>": _NONE,
        "/api/v1/reliability": frozenset({"node", "window"}),
    }
)
NODES_PREFIX: Final = "/api/v1/nodes/"
EVIDENCE: Final = "/api/v1/nodes/<name>/evidence"  # a node's evidence bundle (a gzip'd tar)
LIFECYCLE: Final = "/api/v1/nodes/<name>/lifecycle"  # a node's lifecycle moves
# Paths under these prefixes are the endpoint that names what follows.
_UNDER: Final = (
    ("/metrics/shards/", "/metrics/shards/<n>"),
    ("/api/v1/nodes/", "/api/v1/nodes/<name>"),
    ("/api/v1/jobs/", "/api/v1/jobs/<id>"),
    ("/api/v1/preflight/", "/api/v1/preflight/<id>"),
)
_UNIX: Final = re.compile(r"\d{1,12}(?:\.\d{1,6})?")
_DURATION: Final = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
TIME_FORMS: Final = (
    "a duration back from now (30m, 2h, 1d, 90s), an ISO-8601 time (2026-12-02T03:00:00Z, "
    "2026-12-02T03:00+01:00, 2026-12-02; no zone is UTC) or Unix seconds"
)
_INT_DIGITS: Final = 19  # every value in range fits in 64 bits
_FLAGS: Final = {"1": True, "true": True, "0": False, "false": False}


def endpoint(path: str) -> str | None:
    """The GET endpoint ``path`` belongs to, as :data:`TAKES` names it (None: none of them)."""
    if path in TAKES:
        return path
    node, _, rest = path.removeprefix(NODES_PREFIX).partition("/")
    if path.startswith(NODES_PREFIX) and node and rest == "evidence":
        return EVIDENCE
    if path.startswith(NODES_PREFIX) and node and rest == "lifecycle":
        return LIFECYCLE
    for prefix, name in _UNDER:
        if path.startswith(prefix):
            return name
    return None


def unknown_message(name: str, unknown: Collection[str]) -> str:
    """What the 400 for ``unknown`` parameters of endpoint ``name`` says (sorted, each cut)."""
    takes = ", ".join(sorted(TAKES[name])) or "none"
    return f"unknown query parameter(s) {shown_keys(sorted(unknown))} for {name}; it takes {takes}"


def parse_time(name: str, text: str, now: float) -> float:
    """The Unix time ``text`` gives (see the module's forms); BadRequestError when none."""
    if _UNIX.fullmatch(text):
        return float(text)
    if _DURATION.fullmatch(text):
        try:
            return now - parse_duration(text)
        except ValueError as exc:
            msg = f"query parameter {name}: {exc}"
            raise BadRequestError(msg) from exc
    try:
        when = datetime.fromisoformat(text)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    except (ValueError, OverflowError) as exc:
        msg = f"query parameter {name}={short_repr(text, 40)} is not a time: give {TIME_FORMS}"
        raise BadRequestError(msg) from exc


@dataclass(frozen=True, slots=True)
class Params:
    """One GET's query parameters, checked against what its endpoint takes.

    ``values`` holds each parameter's last value, the empty ones left out; ``now`` is the Unix
    time durations in ``since`` and ``until`` count back from.
    """

    endpoint: str
    values: Mapping[str, str]
    now: float = 0.0

    @classmethod
    def read(cls, name: str, query: str, now: float = 0.0) -> Params:
        """Parse a query string for endpoint ``name``; BadRequestError names what it lacks."""
        given = parse_qs(query, keep_blank_values=True)
        unknown = set(given) - TAKES[name]
        if unknown:
            raise BadRequestError(unknown_message(name, unknown))
        return cls(name, {k: v[-1] for k, v in given.items() if v[-1]}, now)

    def text(self, name: str) -> str | None:
        """The parameter's value (None: not given)."""
        return self.values.get(name)

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        """A whole number from ``low`` to ``high`` (``default`` when not given)."""
        text = self.values.get(name)
        if text is None:
            return default
        if not (text.isascii() and text.isdecimal() and len(text) <= _INT_DIGITS):
            msg = f"query parameter {name}={short_repr(text, 40)} is not a whole number"
            raise BadRequestError(msg)
        value = int(text)
        if not low <= value <= high:
            msg = f"query parameter {name}={value} must be between {low} and {high}"
            raise BadRequestError(msg)
        return value

    def flag(self, name: str) -> bool:
        """``1`` or ``true``: True; ``0``, ``false`` or not given: False."""
        text = self.values.get(name, "0")
        if text.lower() not in _FLAGS:
            msg = f"query parameter {name}={short_repr(text, 40)} must be 1, true, 0 or false"
            raise BadRequestError(msg)
        return _FLAGS[text.lower()]

    def choice(self, name: str, choices: Collection[str], default: str | None) -> str | None:
        """One of ``choices`` (``default`` when not given)."""
        text = self.values.get(name)
        if text is None:
            return default
        if text not in choices:
            msg = f"query parameter {name}={short_repr(text, 40)} is not one of "
            raise BadRequestError(msg + ", ".join(sorted(choices)))
        return text

    def time_ms(self, name: str) -> int | None:
        """The time the parameter gives, in Unix milliseconds (None: not given)."""
        text = self.values.get(name)
        if text is None:
            return None
        return round(parse_time(name, text.strip(), self.now) * 1000)

    def window(self) -> tuple[int | None, int | None]:
        """``since`` and ``until`` in Unix milliseconds; since after until is a 400."""
        since, until = self.time_ms("since"), self.time_ms("until")
        if since is not None and until is not None and since > until:
            msg = (
                f"since={short_repr(self.values['since'], 40)} is after "
                f"until={short_repr(self.values['until'], 40)}"
            )
            raise BadRequestError(msg)
        return since, until
