"""Where the agent is in the BMC's System Event Log, kept across restarts.

Unlike the kernel log the SEL outlives reboots, so the position is kept per BMC (its address),
not per boot: ``{"version": 1, "bmc": "10.0.0.5", "key": 412}``. It moves only once the events
of the entries up to it are durable in the outbox (as the kernel log cursor does), so a crash
reports an entry twice at worst (the collector's journal keeps both), never not at all. The file
is replaced atomically (temporary file, fsync, rename).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

import structlog

from agent.sources.atomic_file import replace_atomically

if TYPE_CHECKING:
    from pathlib import Path

log = structlog.get_logger("agent.sel_cursor")

CURSOR_VERSION: Final = 1


class SelCursor:
    """The last SEL entry reported, for one BMC."""

    __slots__ = ("_saved", "bmc", "errors", "path")

    def __init__(self, path: Path, bmc: str) -> None:
        """Point at the file; nothing is read until :meth:`load`."""
        self.path = path
        self.bmc = bmc
        self.errors = 0
        self._saved: int | None = None

    def load(self) -> int | None:
        """The saved key for this BMC; None without a usable file (or one of another BMC)."""
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as exc:
            self._failed("sel_cursor_unreadable", str(exc))
            return None
        key = data.get("key") if isinstance(data, dict) else None
        if (
            not isinstance(data, dict)
            or data.get("version") != CURSOR_VERSION
            or type(key) is not int
            or key < 0
        ):
            self._failed("sel_cursor_corrupt", "not a version 1 cursor with a key >= 0")
            return None
        if data.get("bmc") != self.bmc:
            log.info("sel_cursor_other_bmc", path=str(self.path), cursor_bmc=data.get("bmc"))
            return None
        self._saved = key
        return key

    def save(self, key: int) -> None:
        """Store ``key`` atomically; a failed write is logged and counted, the old file kept."""
        if key == self._saved:
            return
        payload = json.dumps({"version": CURSOR_VERSION, "bmc": self.bmc, "key": key})
        try:
            replace_atomically(self.path, payload + "\n")
        except OSError as exc:
            self._failed("sel_cursor_save_failed", exc.strerror or str(exc))
            return
        self._saved = key

    def _failed(self, event: str, error: str) -> None:
        self.errors += 1
        log.warning(event, path=str(self.path), error=error)
