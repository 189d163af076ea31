"""Where the agent left off in the kernel log, kept on disk so a restart does not report twice.

/dev/kmsg numbers records per boot. The cursor file holds the boot id and the sequence number of
the last record this agent handled; a restarted agent of the same boot reads the ring buffer from
its start and keeps only what :func:`filter_new` lets through. A cursor of another boot means
nothing (the numbers start again), and neither does a damaged file: both read as "no cursor".

The file is small JSON, replaced atomically (temporary file, fsync, ``os.replace``), so a crash
leaves either the old cursor or the new one, never half of one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

import structlog

from agent.sources.atomic_file import replace_atomically

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from agent.sources.kmsg import KmsgRecord

__all__ = ["CURSOR_VERSION", "KmsgCursor", "filter_new"]

log = structlog.get_logger("agent.kmsg_cursor")

CURSOR_VERSION: Final = 1


class KmsgCursor:
    """The last kmsg sequence number handled in boot ``boot_id``, stored at ``path``.

    ``errors`` counts files that could not be read or parsed and writes that failed; none of
    them raises, since losing the cursor costs at worst a repeated report.
    """

    __slots__ = ("_saved", "boot_id", "errors", "path")

    def __init__(self, path: Path, boot_id: str) -> None:
        """Point at the cursor file of this boot; nothing is read until :meth:`load`."""
        if not boot_id:
            msg = "a kmsg cursor needs the boot id"
            raise ValueError(msg)
        self.path = path
        self.boot_id = boot_id
        self.errors = 0
        self._saved: int | None = None

    def load(self) -> int | None:
        """Return the saved sequence number for this boot, or None when there is none to trust.

        None means: no file yet, a file of another boot, or a file that could not be read or
        parsed (logged and counted in ``errors``).
        """
        data = self._read()
        if data is None:
            return None
        boot_id, seq = data.get("boot_id"), data.get("seq")
        if not isinstance(boot_id, str) or type(seq) is not int or seq < 0:
            self._failed("kmsg_cursor_corrupt", "boot_id must be a string and seq an int >= 0")
            return None
        if boot_id != self.boot_id:
            log.info("kmsg_cursor_other_boot", path=str(self.path), cursor_boot_id=boot_id)
            return None
        self._saved = seq
        return seq

    def save(self, seq: int) -> None:
        """Store ``seq`` for this boot atomically, creating the directory if needed.

        Saving the number already on disk does nothing. A failed write is logged and counted in
        ``errors``; the previous file, if any, stays as it was.
        """
        if type(seq) is not int or seq < 0:
            msg = f"kmsg sequence numbers are ints >= 0, not {seq!r}"
            raise ValueError(msg)
        if seq == self._saved:
            return
        payload = json.dumps({"version": CURSOR_VERSION, "boot_id": self.boot_id, "seq": seq})
        try:
            replace_atomically(self.path, payload + "\n")
        except OSError as exc:
            self._failed("kmsg_cursor_save_failed", exc.strerror or str(exc))
            return
        self._saved = seq

    def _read(self) -> dict[str, object] | None:
        """Return the file's JSON object, or None when missing or unusable (counted)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._failed("kmsg_cursor_unreadable", exc.strerror or str(exc))
            return None
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, absurd nesting
            self._failed("kmsg_cursor_corrupt", str(exc))
            return None
        if not isinstance(data, dict) or data.get("version") != CURSOR_VERSION:
            self._failed("kmsg_cursor_corrupt", "not a version 1 cursor object")
            return None
        return data

    def _failed(self, event: str, error: str) -> None:
        self.errors += 1
        log.warning(event, path=str(self.path), error=error)


def filter_new(records: Iterable[KmsgRecord], last_seq: int | None) -> list[KmsgRecord]:
    """Keep the records after ``last_seq``, in order.

    ``last_seq`` None (no cursor) keeps everything. A sequence number lower than the one before
    it means the numbering started again (a new kernel log), so from there on every record is
    new, whatever the cursor says.
    """
    kept: list[KmsgRecord] = []
    previous: int | None = None
    for record in records:
        if previous is not None and record.seq < previous:
            last_seq = None
        previous = record.seq
        if last_seq is None or record.seq > last_seq:
            kept.append(record)
    return kept
