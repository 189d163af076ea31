"""The outbox spool's file format: framed, checksummed records in segment files.

A segment file is ``MAGIC`` followed by records. Every record is framed as::

    length (u32, little-endian) | crc32 (u32) | type (u8) | payload (length bytes)

where the CRC covers the type byte and the payload. The first record is the segment's header
(``HEADER``: JSON with the boot id, the sequence number its first event has or will have, the
highest number acknowledged when it was made, and whether the process that made it had its
numbers confirmed by a collector's Welcome); every later record is one ``EVENT`` (a serialized
``pb.Event``).

A crash can tear the last record, and a disk can rot: :func:`scan_segment` reads up to the first
record that is short, too long, fails its CRC or does not decode, and reports where the damage
starts, so everything before it is kept. File names carry an epoch (a rewrite moves to the next
one, and a higher epoch makes every lower one obsolete) and the segment's first sequence number.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Final

from google.protobuf.message import DecodeError

from fleetwatch.wire.settings import MAX_MESSAGE_BYTES
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

MAGIC: Final = b"FWSPOOL1"
FRAME: Final = struct.Struct("<IIB")
HEADER: Final = 1
EVENT: Final = 2
# Nothing we write is larger than a wire message; a longer length is damage, not a record.
MAX_RECORD: Final = MAX_MESSAGE_BYTES
_NAME: Final = re.compile(r"(\d{8})-(\d{20})\.seg")


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """What a segment says about itself."""

    boot_id: str
    first_seq: int  # the number its first event has (or would have had)
    acked: int  # every number up to this one was acknowledged when the segment was made
    confirmed: bool  # its writer's numbers were checked against the collector's journal

    def encode(self) -> bytes:
        """Render as the segment's first bytes: the magic and the header record."""
        body = json.dumps(
            {
                "boot_id": self.boot_id,
                "first_seq": self.first_seq,
                "acked": self.acked,
                "confirmed": self.confirmed,
            },
            separators=(",", ":"),
        ).encode()
        return MAGIC + frame(HEADER, body)


@dataclass(slots=True)
class SegmentScan:
    """What :func:`scan_segment` found in one file."""

    header: SegmentHeader | None = None
    events: list[pb.Event] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # file offset of each event's record
    good_bytes: int = 0  # the file is sound up to here
    damage: str | None = None  # why reading stopped before the end, if it did


def frame(kind: int, payload: bytes) -> bytes:
    """One record: length, CRC of type and payload, type, payload."""
    crc = zlib.crc32(payload, zlib.crc32(bytes((kind,))))
    return FRAME.pack(len(payload), crc, kind) + payload


def event_record(event: pb.Event) -> bytes:
    """The record that holds ``event``."""
    return frame(EVENT, event.SerializeToString())


def segment_name(epoch: int, first_seq: int) -> str:
    """The file name of a segment: epoch and first sequence number, zero-padded to sort."""
    return f"{epoch:08d}-{first_seq:020d}.seg"


def parse_name(name: str) -> tuple[int, int] | None:
    """``(epoch, first_seq)`` of a segment file name, or None for any other file."""
    match = _NAME.fullmatch(name)
    return None if match is None else (int(match[1]), int(match[2]))


class _DamageError(Exception):
    """Reading stopped here; the message says why."""


def _header(payload: bytes) -> SegmentHeader:
    try:
        raw = json.loads(payload)
        boot_id, first, acked, confirmed = (
            raw["boot_id"],
            raw["first_seq"],
            raw["acked"],
            raw["confirmed"],
        )
    except (ValueError, KeyError, TypeError) as exc:
        msg = "unreadable header"
        raise _DamageError(msg) from exc
    numbers = (first, acked)
    if (
        not isinstance(boot_id, str)
        or not isinstance(confirmed, bool)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers)
    ):
        msg = "invalid header"
        raise _DamageError(msg)
    return SegmentHeader(boot_id, first, acked, confirmed)


def _record(data: bytes, offset: int) -> tuple[int, bytes, int]:
    """The record at ``offset``: its type, payload and the offset after it."""
    if len(data) - offset < FRAME.size:
        msg = f"torn record frame at byte {offset}"
        raise _DamageError(msg)
    length, crc, kind = FRAME.unpack_from(data, offset)
    start = offset + FRAME.size
    if length > MAX_RECORD:
        msg = f"impossible record length {length} at byte {offset}"
        raise _DamageError(msg)
    if start + length > len(data):
        msg = f"torn record at byte {offset} ({length} bytes announced)"
        raise _DamageError(msg)
    payload = data[start : start + length]
    if zlib.crc32(payload, zlib.crc32(bytes((kind,)))) != crc:
        msg = f"checksum mismatch at byte {offset}"
        raise _DamageError(msg)
    return kind, payload, start + length


def _records(data: bytes, scan: SegmentScan) -> None:
    offset = len(MAGIC)
    while offset < len(data):
        kind, payload, after = _record(data, offset)
        if scan.header is None:
            if kind != HEADER:
                msg = "no header"
                raise _DamageError(msg)
            scan.header = _header(payload)
        elif kind == EVENT:
            try:
                event = pb.Event.FromString(payload)
            except DecodeError as exc:
                msg = f"undecodable event at byte {offset}"
                raise _DamageError(msg) from exc
            scan.events.append(event)
            scan.starts.append(offset)
        else:
            msg = f"unknown record type {kind} at byte {offset}"
            raise _DamageError(msg)
        offset = scan.good_bytes = after


def scan_segment(data: bytes) -> SegmentScan:
    """Read a segment's header and events up to the end or the first damage."""
    scan = SegmentScan()
    if not data.startswith(MAGIC):
        scan.damage = "not a spool segment (bad magic)"
        return scan
    try:
        _records(data, scan)
    except _DamageError as exc:
        scan.damage = str(exc)
    if scan.header is None and scan.damage is None:
        scan.damage = "no header"
    return scan
