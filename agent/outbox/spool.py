"""The outbox's spool: unacknowledged events on disk, so an agent restart loses none.

Events are appended to the active segment file (``spool_format`` has the framing) and made durable
by :meth:`Spool.sync`: one ``fsync`` per batch of events, before the link sends them. Every method
may block on the disk; the outbox calls them on a thread of its own, one at a time and in order
(:mod:`agent.outbox.queue`), never on the event loop. ``write`` and ``fsync`` are injected (a full
disk, a slow one, in tests and benchmarks). A segment that reaches ``segment_bytes`` is closed and a
new one started; a closed segment whose events are all acknowledged is deleted, and so is the active
one once it is fully acknowledged and at least ``compact_bytes`` long. New files are written under a
temporary name, synced and renamed, so a segment that exists is whole.

When the disk refuses a write (ENOSPC, EIO, a quota), nothing is lost: the events that are not
known to be on disk wait in memory (the backlog, in order), the failure is counted and logged, the
torn segment is cut back and closed, and every later sync tries again in a fresh segment.

On open, the spool reads what an earlier process of this boot left: everything up to the first
damage in a segment is kept (the damage is counted, logged and cut off), events already
acknowledged are skipped, and the chain of numbers must hold: an unacknowledged event that does
not follow the previous one ends what is restored. Segments of another boot are counted as lost
and removed (their events belong to a stream this boot cannot open).

A number is *confirmed* once a collector's Welcome was applied to it (only then can it have
been sent): a segment made by a process that had its Welcome says so in its header, and the
first Welcome of a process starts such a segment (:meth:`Spool.confirm`). Restored events
above the confirmed numbers were never sent and may be renumbered. :meth:`Spool.rewrite`
replaces every segment by one of the next epoch (after a Welcome renumbered events); the highest
epoch on disk wins, so a crash in the middle of a rewrite leaves either the old segments or the
new one.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import structlog

from agent.outbox.spool_format import (
    FRAME,
    SegmentHeader,
    event_record,
    parse_name,
    scan_segment,
    segment_name,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

log = structlog.get_logger("agent.spool")

SEGMENT_BYTES: Final = 1 << 20
COMPACT_BYTES: Final = 64 << 10
TMP_PREFIX: Final = ".tmp-"


def record_size(event: pb.Event) -> int:
    """Bytes the event takes in a segment."""
    return FRAME.size + event.ByteSize()


@dataclass(slots=True)
class _Segment:
    path: Path
    first_seq: int
    last_seq: int  # highest event number in it; first_seq - 1 while empty
    size: int


@dataclass(frozen=True, slots=True)
class Recovered:
    """What an earlier process of this boot left in the spool."""

    events: list[pb.Event]  # unacknowledged, in order, without gaps
    next_seq: int  # the first number nobody used yet, as far as the spool knows
    acked: int  # the highest number known acknowledged
    fixed_through: int  # numbers up to here were confirmed by a Welcome: they never move


class Spool:
    """Segment files of one boot's unacknowledged events under ``directory``."""

    def __init__(  # noqa: PLR0913 - sizes and the two injected disk calls
        self,
        directory: Path,
        boot_id: str,
        *,
        segment_bytes: int = SEGMENT_BYTES,
        compact_bytes: int = COMPACT_BYTES,
        write: Callable[[int, bytes], int] = os.write,
        fsync: Callable[[int], None] = os.fsync,
    ) -> None:
        """Nothing touches the disk until :meth:`open`; ``write``/``fsync`` are injectable."""
        self.directory = directory
        self.boot_id = boot_id
        self._segment_bytes = segment_bytes
        self._compact_bytes = compact_bytes
        self._write = write
        self._fsync = fsync
        self._segments: list[_Segment] = []
        self._fd: int | None = None  # the active segment (the last one), open for appends
        self._synced = (0, 0)  # (size, last seq) of the active segment at its last fsync
        self._unsynced: list[pb.Event] = []  # written to the active segment since the last fsync
        self._backlog: deque[pb.Event] = deque()  # not on disk: waiting for a write that works
        self._backlog_bytes = 0
        self._epoch = 0
        self._last_seq = 0
        self._acked = 0
        self._outage = 0  # failures since the disk last worked
        self.confirmed = False
        self.write_errors = 0
        self.damaged = 0
        self.previous_boot_events = 0

    @property
    def held_bytes(self) -> int:
        """Bytes held: segment files plus the backlog waiting for the disk."""
        return sum(s.size for s in self._segments) + self._backlog_bytes

    @property
    def backlog(self) -> int:
        """Events not (known to be) on disk."""
        return len(self._backlog) + len(self._unsynced)

    # ---- opening ---------------------------------------------------------------------------

    def open(self) -> Recovered:
        """Read what is left from earlier processes of this boot, and start a new segment."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            recovered = self._recover()
        except OSError as exc:  # no spool directory: events wait in memory, retried each sync
            self._failed("open", exc)
            recovered = Recovered([], 1, 0, 0)
        self._last_seq = recovered.next_seq - 1
        self._acked = recovered.acked
        try:
            self._start_segment(recovered.next_seq)
        except OSError as exc:
            self._failed("create", exc)
        self._delete_acked()
        log.info(
            "spool_opened",
            directory=str(self.directory),
            boot_id=self.boot_id,
            restored=len(recovered.events),
            next_seq=recovered.next_seq,
            acked=recovered.acked,
            fixed_through=recovered.fixed_through,
            bytes=self.held_bytes,
        )
        return recovered

    def _listing(self) -> list[tuple[int, int, Path]]:
        found: list[tuple[int, int, Path]] = []
        for path in self.directory.iterdir():
            if path.name.startswith(TMP_PREFIX):
                self._unlink(path, "unfinished")  # a create that did not reach its rename
            elif (parsed := parse_name(path.name)) is not None:
                found.append((*parsed, path))
        if not found:
            return []
        self._epoch = max(epoch for epoch, _, _ in found)
        for epoch, _, path in found:
            if epoch < self._epoch:
                self._unlink(path, "superseded")  # a rewrite finished, its cleanup did not
        return sorted((e, first, p) for e, first, p in found if e == self._epoch)

    def _recover(self) -> Recovered:  # noqa: C901 - one pass that judges every record
        events: list[pb.Event] = []
        acked = high = fixed = 0
        broken = False
        for _, _, path in self._listing():
            if broken:
                self._unlink(path, "after a gap in the numbers")
                continue
            try:
                data = path.read_bytes()
            except OSError as exc:
                self._damage(path, f"unreadable: {exc.strerror}", 0, 0)
                broken = True
                continue
            scan = scan_segment(data)
            header = scan.header
            if header is None:
                self._damage(path, scan.damage or "no header", 0, len(data))
                self._unlink(path, "damaged")
                broken = True
                continue
            if header.boot_id != self.boot_id:
                self.previous_boot_events += len(scan.events)
                log.error(
                    "spool_previous_boot_dropped",
                    path=str(path),
                    boot_id=header.boot_id,
                    events=len(scan.events),
                )
                self._unlink(path, "previous boot")
                continue
            acked = max(acked, header.acked)
            high = max(high, header.first_seq - 1)
            end, last = scan.good_bytes, header.first_seq - 1
            for start, event in zip(scan.starts, scan.events, strict=True):
                prev = events[-1].seq if events else 0
                if event.seq <= acked or event.seq <= prev:
                    # acknowledged, or written twice (again after a failed fsync)
                    high, last = max(high, event.seq), max(last, event.seq)
                    continue
                if events and event.seq != max(prev, acked) + 1:
                    self._damage(path, f"gap in the numbers before {event.seq}", start, len(data))
                    end, broken = start, True
                    break
                events.append(event)
                high, last = max(high, event.seq), max(last, event.seq)
            if scan.damage is not None and not broken:
                self._damage(path, scan.damage, end, len(data))
            if header.confirmed:  # made by a process that had its Welcome
                fixed = max(fixed, last)
            if end < len(data):
                self._truncate(path, end)
            self._segments.append(_Segment(path, header.first_seq, last, end))
        events = [e for e in events if e.seq > acked]
        return Recovered(events, max(high, acked) + 1, acked, max(fixed, acked))

    def _damage(self, path: Path, why: str, kept: int, size: int) -> None:
        self.damaged += 1
        log.error("spool_damaged", path=str(path), why=why, kept_bytes=kept, lost_bytes=size - kept)

    def _truncate(self, path: Path, size: int) -> None:
        try:
            os.truncate(path, size)
        except OSError as exc:
            log.warning("spool_truncate_failed", path=str(path), error=exc.strerror)

    def _unlink(self, path: Path, why: str) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("spool_remove_failed", path=str(path), why=why, error=exc.strerror)
        else:
            log.debug("spool_segment_removed", path=str(path), why=why)

    # ---- writing ---------------------------------------------------------------------------

    def append(self, event: pb.Event) -> None:
        """Write ``event`` (durable at the next :meth:`sync`), or keep it until the disk works."""
        self._last_seq = event.seq
        if self._fd is None or self._backlog:
            self._backlog.append(event)
            self._backlog_bytes += record_size(event)
            return
        try:
            self._write_active(event_record(event), event.seq)
        except OSError as exc:
            self._backlog.append(event)
            self._backlog_bytes += record_size(event)
            self._failed("write", exc)
            return
        self._unsynced.append(event)

    def sync(self) -> bool:
        """Write what waits and fsync; return whether every event is on disk (counted if not)."""
        try:
            if self._fd is None:
                if not self._backlog:
                    return True
                self._start_segment(self._backlog[0].seq)
            while self._backlog:
                event = self._backlog[0]
                self._write_active(event_record(event), event.seq)
                self._backlog.popleft()
                self._backlog_bytes -= record_size(event)
                self._unsynced.append(event)
            if self._unsynced and self._fd is not None:
                self._fsync(self._fd)
                active = self._segments[-1]
                self._synced = (active.size, active.last_seq)
                self._unsynced.clear()
        except OSError as exc:
            self._failed("sync", exc)
            return False
        if self._outage:
            log.warning("spool_write_recovered", failures=self._outage)
            self._outage = 0
        if self._fd is not None and self._segments[-1].size >= self._segment_bytes:
            self._rotate()
        return True

    def _write_active(self, record: bytes, seq: int) -> None:
        assert self._fd is not None  # noqa: S101 - callers check
        active = self._segments[-1]
        written = 0
        try:
            while written < len(record):
                written += self._write(self._fd, record[written:])
        finally:
            active.size += written
        active.last_seq = seq

    def _start_segment(self, first_seq: int, records: bytes = b"") -> None:
        """Create the next segment whole (header and ``records``), then make it the active one."""
        name = segment_name(self._epoch, first_seq)
        path, tmp = self.directory / name, self.directory / (TMP_PREFIX + name)
        header = SegmentHeader(self.boot_id, first_seq, self._acked, self.confirmed).encode()
        data = header + records
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            written = 0
            while written < len(data):
                written += self._write(fd, data[written:])
            self._fsync(fd)
            tmp.rename(path)
            self._sync_directory()
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self._close_active()
        if self._segments and self._segments[-1].path == path:
            self._segments.pop()  # an empty segment of the same name, replaced
        self._segments.append(_Segment(path, first_seq, first_seq - 1, len(data)))
        self._fd = fd
        self._synced = (len(data), first_seq - 1)

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._fsync(fd)
        finally:
            os.close(fd)

    def _close_active(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _failed(self, op: str, exc: OSError) -> None:
        """Count the failure; cut the active segment back to its last fsync and close it."""
        self.write_errors += 1
        self._outage += 1
        if self._fd is not None:
            active = self._segments[-1]
            size, last = self._synced
            try:
                os.ftruncate(self._fd, size)
                active.size, active.last_seq = size, last
            except OSError:
                pass  # the torn tail stays; the next start cuts it off as damage
            self._close_active()
            # what was written since the last fsync is not known to be on disk: write it again
            self._backlog.extendleft(reversed(self._unsynced))
            self._backlog_bytes += sum(record_size(e) for e in self._unsynced)
            self._unsynced.clear()
        fields = {
            "op": op,
            "directory": str(self.directory),
            "errno": errno.errorcode.get(exc.errno or 0, str(exc.errno)),
            "error": exc.strerror or str(exc),
            "in_memory": len(self._backlog),
            "failures": self.write_errors,
        }
        if self._outage == 1:
            log.error("spool_write_failed", **fields)
        else:
            log.debug("spool_write_failed", **fields)

    # ---- acknowledging ---------------------------------------------------------------------

    def ack(self, seq: int) -> None:
        """Everything up to ``seq`` is journaled: drop it from the backlog, delete old segments."""
        if seq <= self._acked:
            return
        self._acked = seq
        while self._backlog and self._backlog[0].seq <= seq:
            self._backlog_bytes -= record_size(self._backlog.popleft())
        active = self._segments[-1] if self._segments and self._fd is not None else None
        if (
            active is not None
            and active.last_seq <= seq
            and active.size >= self._compact_bytes
            and not self._unsynced
        ):
            self._rotate()
        self._delete_acked()

    def _rotate(self) -> None:
        try:
            self._start_segment(self._last_seq + 1)
        except OSError as exc:
            self._failed("rotate", exc)

    def _delete_acked(self) -> None:
        closed = self._segments if self._fd is None else self._segments[:-1]
        done = [s for s in closed if s.last_seq <= self._acked]
        for segment in done:
            self._unlink(segment.path, "acknowledged")
            self._segments.remove(segment)

    def confirm(self, events: list[pb.Event], next_seq: int) -> None:
        """Record that this process's numbers are confirmed (``events``: all unacknowledged).

        A new segment whose header says so (and so confirms every number below its first); where
        the disk refuses it, a rewrite, so that numbers already sent can never be taken for
        unconfirmed ones by a later process.
        """
        self.confirmed = True
        if self.sync() and self._fd is not None:
            try:
                self._start_segment(self._last_seq + 1)
            except OSError as exc:
                self._failed("confirm", exc)
            else:
                self._delete_acked()
                return
        self.rewrite(events, next_seq)

    def rewrite(self, events: list[pb.Event], next_seq: int) -> None:
        """Replace every segment by one of the next epoch holding ``events``, confirmed."""
        old = [s.path for s in self._segments]
        self._close_active()
        self._segments.clear()
        self._unsynced.clear()
        self._backlog.clear()
        self._backlog_bytes = 0
        self._epoch += 1
        self.confirmed = True
        self._last_seq = next_seq - 1
        first = events[0].seq if events else next_seq
        try:
            self._start_segment(first, b"".join(event_record(e) for e in events))
        except OSError as exc:
            # The old numbers must not come back after a restart: remove them, keep the events
            # in memory and write them when the disk works again.
            self._backlog.extend(events)
            self._backlog_bytes = sum(record_size(e) for e in events)
            self._failed("rewrite", exc)
        else:
            active = self._segments[-1]
            active.last_seq = events[-1].seq if events else first - 1
            self._synced = (active.size, active.last_seq)
        for path in old:
            self._unlink(path, "rewritten")

    def close(self) -> None:
        """Close the active segment (what :meth:`sync` did not write stays unwritten)."""
        self._close_active()
