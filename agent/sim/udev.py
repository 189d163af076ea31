"""Simulated udev monitor: uevents queued by faults, handed out once."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.sources.udev import UdevEvent


class SimUdev:
    """A queue of uevents."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        """Start with nothing pending."""
        self._queue: deque[UdevEvent] = deque()

    def push(self, event: UdevEvent) -> None:
        """Queue a uevent, as the kernel would multicast it."""
        self._queue.append(event)

    def poll(self) -> list[UdevEvent]:
        """Return every uevent not read yet."""
        events = list(self._queue)
        self._queue.clear()
        return events

    def close(self) -> None:
        """Nothing to release."""
