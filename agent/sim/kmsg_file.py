"""A simulated /dev/kmsg kept in a file, so that it outlives the agent process reading it.

The kernel's ring buffer survives an agent crash: a restarted agent reads it again from the start
and skips what its cursor says it already handled. :class:`agent.sim.kmsg.SimKmsg` lives in the
agent's own process and dies with it; this one is a plain file of records, one per line, in the
format ``/dev/kmsg`` hands out (``prio,seq,ts_usec,flag;text``), written by another process
(:class:`KmsgFileWriter`, e.g. a benchmark that kills agents) and parsed by the real parser.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Final

from agent.exceptions import SourceError
from agent.sources.kmsg import MAX_RECORDS_PER_READ, KmsgRecord, parse_record

if TYPE_CHECKING:
    from pathlib import Path

    from agent.sources.wakeup import Waker

FIRST_SEQ: Final = 1200  # where a booted kernel's sequence numbers might be
LOG_KERN: Final = 0
LEVEL_WARNING: Final = 4


class KmsgFile:
    """Reader of a kmsg file: new complete records since the last read, in order.

    ``from_start`` reads the whole file first (a restarted agent with a cursor); otherwise the
    reader starts at the end, as the real reader does on a node that never ran the agent.
    Malformed records are counted in ``malformed`` and skipped, as the real reader does.
    """

    __slots__ = ("_partial", "_position", "malformed", "overruns", "path")

    def __init__(self, path: Path, *, from_start: bool) -> None:
        """Open ``path`` (created empty when missing) and place the reader."""
        self.path = path
        self.malformed = 0
        self.overruns = 0
        self._partial = b""
        try:
            path.touch(exist_ok=True)
            self._position = 0 if from_start else path.stat().st_size
        except OSError as exc:
            msg = f"cannot open {path}: {exc.strerror}"
            raise SourceError("kmsg", msg) from exc

    def read(self) -> list[KmsgRecord]:
        """Return the records written since the last read (at most ``MAX_RECORDS_PER_READ``)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._position)
                data = f.read()
        except OSError as exc:
            msg = f"cannot read {self.path}: {exc.strerror}"
            raise SourceError("kmsg", msg) from exc
        data = self._partial + data
        self._position += len(data) - len(self._partial)
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unfinished last record waits for its newline
        records: list[KmsgRecord] = []
        for i, raw in enumerate(lines):
            if len(records) >= MAX_RECORDS_PER_READ:  # the rest waits for the next read
                rest = b"\n".join(lines[i:]) + b"\n" + self._partial
                self._position -= len(rest)
                self._partial = b""
                break
            try:
                records.append(parse_record(raw))
            except ValueError:
                self.malformed += 1
        return records

    def watch(self, waker: Waker) -> None:
        """A file gives no wake-up: new records are read by the agent's next poll."""

    def close(self) -> None:
        """Nothing is held open between reads."""


class KmsgFileWriter:
    """Appends records to a kmsg file as ``printk`` would, numbering them on from the file."""

    __slots__ = ("_boot_mono", "_seq", "path")

    def __init__(self, path: Path) -> None:
        """Continue the sequence of what ``path`` already holds."""
        self.path = path
        self._boot_mono = time.monotonic() - 3600.0
        self._seq = FIRST_SEQ
        if path.exists():
            for line in path.read_bytes().splitlines():
                try:
                    self._seq = max(self._seq, parse_record(line).seq + 1)
                except ValueError:
                    continue

    def write(self, text: str, level: int = LEVEL_WARNING, facility: int = LOG_KERN) -> int:
        """Append one record (one ``write`` of one whole line); return its sequence number."""
        if "\n" in text:
            msg = "a kmsg record's text is one line"
            raise ValueError(msg)
        seq = self._seq
        ts_us = int((time.monotonic() - self._boot_mono) * 1_000_000)
        line = f"{(facility << 3) | level},{seq},{ts_us},-;{text}\n".encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        self._seq += 1
        return seq
