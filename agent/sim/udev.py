"""Simulated udev monitor: uevents queued by faults, handed out once."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.sources.udev import UdevEvent
    from agent.sources.wakeup import Waker


class SimUdev:
    """A queue of uevents."""

    __slots__ = ("_queue", "_waker")

    def __init__(self) -> None:
        """Start with nothing pending."""
        self._queue: deque[UdevEvent] = deque()
        self._waker: Waker | None = None

    def push(self, event: UdevEvent) -> None:
        """Queue a uevent, as the kernel would multicast it."""
        self._queue.append(event)
        if self._waker is not None:
            self._waker.notify()

    def poll(self) -> list[UdevEvent]:
        """Return every uevent not read yet."""
        events = list(self._queue)
        self._queue.clear()
        return events

    def watch(self, waker: Waker) -> None:
        """Wake the reader on each uevent, as the netlink socket would."""
        self._waker = waker

    def close(self) -> None:
        """Nothing to release."""
