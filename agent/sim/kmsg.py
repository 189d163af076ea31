"""Simulated /dev/kmsg: records formatted as the kernel formats them, parsed by the real parser."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from agent.sources.kmsg import KmsgRecord, parse_record

if TYPE_CHECKING:
    from fleetwatch.clock import Clock

LOG_KERN = 0
LEVEL_ERR = 3
LEVEL_WARNING = 4


class SimKmsg:
    """A kernel ring buffer that hands each record out once, like a reader of /dev/kmsg."""

    __slots__ = ("_boot_mono", "_clock", "_queue", "_seq")

    def __init__(self, clock: Clock) -> None:
        """Start the sequence where a booted kernel would be: well past zero."""
        self._clock = clock
        self._boot_mono = clock.monotonic() - 3600.0
        self._queue: deque[bytes] = deque()
        self._seq = 1200

    def write(self, text: str, level: int = LEVEL_WARNING, facility: int = LOG_KERN) -> None:
        """Log ``text`` the way ``printk`` would."""
        ts_us = int((self._clock.monotonic() - self._boot_mono) * 1_000_000)
        prio = (facility << 3) | level
        self._queue.append(f"{prio},{self._seq},{ts_us},-;{text}\n".encode())
        self._seq += 1

    def read(self) -> list[KmsgRecord]:
        """Return every record not read yet."""
        records = [parse_record(raw) for raw in self._queue]
        self._queue.clear()
        return records

    def close(self) -> None:
        """Nothing to release."""
