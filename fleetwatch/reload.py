"""What both daemons share about reloading on SIGHUP: the signal, the tally, the restart keys.

``systemctl reload`` (the units' ``ExecReload=/bin/kill -HUP $MAINPID``) or ``kill -HUP`` asks a
daemon to read its files again. A reload is all or nothing: every file is read and checked
first, and only when all of them are good does anything change; otherwise the daemon keeps what
it runs with, logs the problem with its file and line, and counts a failure.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import structlog

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterable
    from types import FrameType

log = structlog.get_logger("reload")

RESULTS: Final = ("success", "failure")


@dataclass(slots=True)
class ReloadTally:
    """How reloads went, as the metrics show it (Prometheus's own ``config_last_reload_*``).

    ``last_success_unix`` starts at the time the daemon read its files at start: a daemon that
    never reloaded runs the configuration it started with.
    """

    last_success_unix: float
    successful: bool = True
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESULTS, 0))
    last_error: str = ""

    def success(self, now_unix: float) -> None:
        """A reload swapped in new files."""
        self.successful = True
        self.last_success_unix = now_unix
        self.counts["success"] += 1
        self.last_error = ""

    def failure(self, error: str) -> None:
        """A reload found a problem and changed nothing."""
        self.successful = False
        self.counts["failure"] += 1
        self.last_error = error


def changed_keys(old: object, new: object, keys: Iterable[str]) -> list[str]:
    """The ``keys`` (attributes) whose values differ between two configurations."""
    return [key for key in keys if getattr(old, key) != getattr(new, key)]


def one_line(text: str) -> str:
    """``text`` with line breaks and runs of blanks as single spaces, for one log line."""
    return " ".join(text.split())


class Hangups:
    """Runs a daemon's reload on SIGHUP, or holds the request until the daemon can reload.

    A SIGHUP that comes while the daemon still starts (before :meth:`attach`) must neither kill
    it (the default action) nor be lost: it runs the reload as soon as one is attached.
    """

    __slots__ = ("_reload", "pending")

    def __init__(self) -> None:
        """Catch nothing yet; see :meth:`catch_early` and :meth:`install`."""
        self._reload: Callable[[], object] | None = None
        self.pending = False

    def catch_early(self) -> None:
        """Hold SIGHUP from now on (before an event loop runs): keep it as a pending reload."""
        signal.signal(signal.SIGHUP, self._early)

    def _early(self, _signum: int, _frame: FrameType | None) -> None:
        self.pending = True

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take SIGHUP on ``loop`` (replaces :meth:`catch_early`'s handler)."""
        loop.add_signal_handler(signal.SIGHUP, self.arrived)

    def arrived(self) -> None:
        """SIGHUP: reload now, or once the daemon has attached its reload."""
        if self._reload is None:
            self.pending = True
            log.info("reload_deferred", reason="still starting")
            return
        self._reload()

    def attach(self, reload: Callable[[], object]) -> None:
        """The daemon is up: SIGHUP runs ``reload`` from now on (at once if one is pending)."""
        self._reload = reload
        if self.pending:
            self.pending = False
            reload()
