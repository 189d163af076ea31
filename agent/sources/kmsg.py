"""Kernel log source: records from ``/dev/kmsg``, parsed by a pure function.

Each ``read()`` of /dev/kmsg returns exactly one record, ``prio,seq,ts_usec,flag[,...];text``,
optionally followed by continuation lines that start with a space. ``EPIPE`` means the ring
buffer overwrote records we had not read yet; we count it and go on.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from agent.exceptions import SourceError

if TYPE_CHECKING:
    from agent.sources.wakeup import Waker

READ_SIZE = 16 * 1024  # must be at least 8 KiB or the kernel answers EINVAL
MAX_RECORDS_PER_READ = 10_000
# The kernel keeps a message to about 1 KiB; more is cut, so a record never holds more than this.
MAX_TEXT = 4096
_HEADER_NUMBER = re.compile(r"[0-9]{1,20}")  # unsigned decimal, as the kernel prints them
MAX_HEADER_NUMBER = 2**64 - 1  # the kernel's fields are u64; the wire's kmsg_seq too


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One kernel log record. ``ts_us`` is monotonic time since boot."""

    seq: int
    ts_us: int
    level: int
    facility: int
    text: str


def parse_record(raw: bytes) -> KmsgRecord:
    """Parse one raw /dev/kmsg record; raise ValueError naming what is wrong.

    The text (the first line of the message) is cut to ``MAX_TEXT`` characters.
    """
    line = raw[: READ_SIZE + 1024].decode("utf-8", errors="replace")
    head, sep, rest = line.partition(";")
    if not sep:
        msg = f"kmsg record without ';' separator: {line[:80]!r}"
        raise ValueError(msg)
    fields = head.split(",")
    if len(fields) < 4:  # noqa: PLR2004 - prio, seq, ts, flag
        msg = f"kmsg record header has {len(fields)} fields, expected 4 or more: {head[:80]!r}"
        raise ValueError(msg)
    if not all(_HEADER_NUMBER.fullmatch(f) for f in fields[:3]):
        msg = f"kmsg record header is not numeric: {head[:80]!r}"
        raise ValueError(msg)
    prio, seq, ts_us = int(fields[0]), int(fields[1]), int(fields[2])
    if max(prio, seq, ts_us) > MAX_HEADER_NUMBER:
        msg = f"kmsg record header number is over 2**64 - 1: {head[:80]!r}"
        raise ValueError(msg)
    text = rest.split("\n", 1)[0][:MAX_TEXT]
    return KmsgRecord(seq=seq, ts_us=ts_us, level=prio & 7, facility=prio >> 3, text=text)


class KmsgSource(Protocol):
    """Anything that hands out new kernel log records."""

    def read(self) -> list[KmsgRecord]:
        """Return the records that arrived since the last call (never blocks)."""
        ...

    def watch(self, waker: Waker) -> None:
        """Wake the poll loop through ``waker`` when new records arrive."""
        ...

    def close(self) -> None:
        """Release the source."""
        ...


class DevKmsgReader:
    """Non-blocking reader of /dev/kmsg that starts at the end of the buffer."""

    __slots__ = ("_fd", "malformed", "overruns", "path")

    def __init__(self, path: str = "/dev/kmsg", *, from_start: bool = False) -> None:
        """Open the device; skip what is already in the ring buffer unless ``from_start``."""
        self.path = path
        self.overruns = 0
        self.malformed = 0
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            msg = f"cannot open {path}: {exc.strerror} (reading it needs CAP_SYSLOG)"
            raise SourceError("kmsg", msg) from exc
        if from_start:
            return
        try:
            os.lseek(self._fd, 0, os.SEEK_END)
        except OSError as exc:
            if exc.errno != errno.ESPIPE:  # a pipe standing in for the device cannot seek
                raise

    def read(self) -> list[KmsgRecord]:
        """Drain every record available now."""
        if self._fd is None:
            return []
        records: list[KmsgRecord] = []
        while len(records) < MAX_RECORDS_PER_READ:
            try:
                raw = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.overruns += 1
                    continue
                msg = f"read {self.path}: {exc.strerror}"
                raise SourceError("kmsg", msg) from exc
            if not raw:
                break
            try:
                records.append(parse_record(raw))
            except ValueError:
                self.malformed += 1
        return records

    def watch(self, waker: Waker) -> None:
        """The device is readable when records are waiting (poll(2) on /dev/kmsg)."""
        if self._fd is not None:
            waker.watch_fd(self._fd)

    def close(self) -> None:
        """Close the device."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
