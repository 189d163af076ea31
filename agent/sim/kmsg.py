"""Simulated /dev/kmsg: records formatted as the kernel formats them, parsed by the real parser.

Like the kernel's ring buffer it keeps the last ``capacity`` records; a reader gets each new
record once, and a new reader (:meth:`SimKmsg.replay_all`) starts again at the oldest one. As the
kernel logs from any CPU while the agent reads, records may be written from any thread.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

from agent.sources.kmsg import KmsgRecord, parse_record

if TYPE_CHECKING:
    from agent.sources.wakeup import Waker
    from fleetwatch.clock import Clock

LOG_KERN = 0
LEVEL_ERR = 3
LEVEL_WARNING = 4


class SimKmsg:
    """A kernel ring buffer with one reader position."""

    __slots__ = ("_boot_mono", "_buffer", "_clock", "_lock", "_next_read", "_seq", "_waker")

    def __init__(self, clock: Clock, capacity: int = 10_000) -> None:
        """Start the sequence where a booted kernel would be: well past zero."""
        self._clock = clock
        self._boot_mono = clock.monotonic() - 3600.0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=capacity)
        self._seq = 1200
        self._next_read = self._seq
        self._waker: Waker | None = None
        self._lock = threading.Lock()  # writers on other threads than the reader's

    def write(self, text: str, level: int = LEVEL_WARNING, facility: int = LOG_KERN) -> None:
        """Log ``text`` the way ``printk`` would."""
        ts_us = int((self._clock.monotonic() - self._boot_mono) * 1_000_000)
        prio = (facility << 3) | level
        with self._lock:
            self._buffer.append((self._seq, f"{prio},{self._seq},{ts_us},-;{text}\n".encode()))
            self._seq += 1
        if self._waker is not None:
            self._waker.notify()

    def read(self) -> list[KmsgRecord]:
        """Return every record this reader has not read yet."""
        with self._lock:
            new = [raw for seq, raw in self._buffer if seq >= self._next_read]
            self._next_read = self._seq
        return [parse_record(raw) for raw in new]

    def replay_all(self) -> int:
        """Act as a freshly opened reader: the next read starts at the oldest record kept."""
        with self._lock:
            self._next_read = self._buffer[0][0] if self._buffer else self._seq
            return len(self._buffer)

    def watch(self, waker: Waker) -> None:
        """Wake the reader on each new record, as poll(2) on /dev/kmsg would."""
        self._waker = waker

    def close(self) -> None:
        """Nothing to release."""
