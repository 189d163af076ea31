"""The collectors an agent may stream to: checking the list, where a node starts, what comes next.

An agent names one collector (``collector = "host:port"``) or several (``collectors = [...]``),
which share one journal (PostgreSQL) and so one view of every node's events. Each node starts on
the collector its name picks (:func:`start_index`: a stable hash, so a fleet spreads evenly over
the list with no coordination, and a node picks the same one after every restart), and moves to
the next in the list when that one fails (:class:`CollectorRotation`). It does not move back by
itself when its first collector returns: a node that flapped between two collectors would cost
both a Hello and a full report each time, and the journal is shared, so any collector will do.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Final

from agent.exceptions import ConfigError
from fleetwatch.config_file import short_repr

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agent.link.backoff import Backoff

DEFAULT_COLLECTOR: Final = "127.0.0.1:7070"
MAX_COLLECTORS: Final = 32
_MAX_PORT: Final = 65535
_WHAT: Final = "agent config"


def check_address(value: object, key: str) -> str:
    """``value`` if it is one ``host:port`` (``[v6]:port`` too); else ConfigError naming ``key``."""
    if not isinstance(value, str):
        msg = f"{_WHAT}: {key} must be host:port, got {short_repr(value)}"
        raise ConfigError(msg)
    if "," in value:
        msg = (
            f"{_WHAT}: {key} must be one host:port, got {short_repr(value)} "
            '(several collectors: collectors = ["a:7070", "b:7070"])'
        )
        raise ConfigError(msg)
    host, sep, port = value.rpartition(":")
    digits = port.isascii() and port.isdecimal() and len(port) <= len(str(_MAX_PORT))
    bracketed = host.startswith("[") and host.endswith("]")
    if (
        not sep
        or not digits
        or not 0 < int(port) <= _MAX_PORT
        or not host.strip("[]")
        or any(c.isspace() for c in value)
        or (":" in host and not bracketed)  # an IPv6 address goes in brackets: [fd00::5]:7070
    ):
        msg = f"{_WHAT}: {key} must be host:port, got {short_repr(value)}"
        raise ConfigError(msg)
    return value


def check_collectors(value: object, key: str = "collectors") -> tuple[str, ...]:
    """``value`` as a tuple of addresses: a list of 1 to 32, each ``host:port``, none twice.

    Each problem is a ConfigError naming ``key`` and, for an entry, its position
    (``collectors[2]``) and value.
    """
    if not isinstance(value, list | tuple):
        msg = (
            f'{_WHAT}: {key} must be a list of host:port strings, like ["a:7070", "b:7070"], '
            f"got {short_repr(value)}"
        )
        raise ConfigError(msg)
    entries: Sequence[object] = value
    if not entries:
        msg = f"{_WHAT}: {key} must list at least one host:port"
        raise ConfigError(msg)
    if len(entries) > MAX_COLLECTORS:
        msg = f"{_WHAT}: {key} lists {len(entries)} collectors, at most {MAX_COLLECTORS}"
        raise ConfigError(msg)
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        address = check_address(entry, f"{key}[{index}]")
        same = address.lower()  # host names do not care about case
        if same in seen:
            msg = f"{_WHAT}: {key}[{index}] repeats {key}[{seen[same]}], got {short_repr(address)}"
            raise ConfigError(msg)
        seen[same] = index
    return tuple(str(entry) for entry in entries)


def split_flag(value: object, key: str = "collector") -> tuple[str, ...]:
    """The command line's ``--collector``: one address, a comma list, or a list of either.

    ``--collector a:7070,b:7070`` and (repeated) ``--collector a:7070 --collector b:7070`` give
    the same list; each entry is checked as :func:`check_collectors` does, naming ``key``.
    """
    parts: list[object] = []
    for item in value if isinstance(value, list | tuple) else [value]:
        if isinstance(item, str):
            parts.extend(part.strip() for part in item.split(","))
        else:
            parts.append(item)
    if len(parts) == 1:
        return (check_address(parts[0], key),)
    return check_collectors(parts, key)


def start_index(node: str, count: int) -> int:
    """The position in a list of ``count`` collectors where ``node`` starts.

    SHA-256 of the name, not :func:`hash` (salted per process): the same node picks the same
    collector in every process, and names spread evenly whatever they look like.
    """
    digest = hashlib.sha256(node.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % count


class CollectorRotation:
    """Which collector to try: the node's own first, then round the list after each failure.

    A failure moves to the next collector at once (the link waits only a short jittered delay,
    so reaching a healthy one takes well under a second); :meth:`failed` says when every
    collector has failed in a row, which is when the link's backoff should grow. A connection
    that stayed up starts a new round (:meth:`healthy`). There is no fail-back: the agent stays
    where it is until that collector fails too.
    """

    __slots__ = ("_failed_in_row", "home", "index", "moves", "targets")

    def __init__(self, targets: Sequence[str], start: int = 0) -> None:
        """Start at ``targets[start]``: the node's own collector (``home``)."""
        if not targets:
            msg = "a rotation needs at least one collector"
            raise ValueError(msg)
        self.targets = tuple(targets)
        self.home = start % len(self.targets)
        self.index = self.home
        self.moves = 0  # times the agent moved to another collector
        self._failed_in_row = 0

    @property
    def current(self) -> str:
        """The collector to connect to now."""
        return self.targets[self.index]

    @property
    def away(self) -> bool:
        """Whether the agent is on another collector than its own."""
        return self.index != self.home

    def failed(self) -> bool:
        """The current collector failed: move to the next; True when that ends a failed round."""
        self._failed_in_row += 1
        if len(self.targets) > 1:
            self.index = (self.index + 1) % len(self.targets)
            self.moves += 1
        if self._failed_in_row >= len(self.targets):
            self._failed_in_row = 0
            return True
        return False

    def healthy(self) -> None:
        """The current collector served well for a while: failures count from zero again."""
        self._failed_in_row = 0

    def next_try(self, backoff: Backoff, *, healthy: bool) -> float:
        """The current collector failed (``healthy``: after serving a while): move to the next.

        Returns the delay before connecting to it, drawn from ``backoff``'s window; the window
        grows only when this failure ends a round in which every collector failed, and starts
        small again after a healthy connection.
        """
        if healthy:
            backoff.reset()
            self.healthy()
        delay = backoff.draw()
        if self.failed():
            backoff.grow()
        return delay
