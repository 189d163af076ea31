"""Wakes the agent's poll loop as soon as an event source has something to say.

Faults announce themselves: a kernel log record (an Xid), an NVML Xid event, a uevent that a
PCI function left. Waiting for the next timed poll (5 s by default) would add up to 5 s to the
time from fault to action, so these sources wake the loop and only they are read at once; the
timed poll still reads everything.

File-descriptor sources (/dev/kmsg, the udev netlink socket) are watched with the event loop's
reader callbacks, one-shot: a readable descriptor wakes the loop once and is watched again after
it was read, so a flood of records cannot spin the loop. Thread sources (the NVML event thread)
and the simulator call :meth:`Wakeup.notify`, which is safe from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Final, Protocol

from fleetwatch.clock import wait_for_event

if TYPE_CHECKING:
    from fleetwatch.clock import Clock

# Event reads closer together than this are merged: a burst of records costs one read.
MIN_EVENT_GAP_S: Final = 0.005


class Waker(Protocol):
    """What an event source is given to wake the poll loop."""

    def notify(self) -> None:
        """Something may be readable now (callable from any thread)."""
        ...

    def watch_fd(self, fd: int) -> None:
        """Wake when ``fd`` becomes readable."""
        ...


class Wakeup:
    """The poll loop's alarm: set by sources, awaited by the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the loop the agent runs on."""
        self._loop = loop
        self._ready = asyncio.Event()
        self._fds: set[int] = set()
        self._fired: set[int] = set()
        self.wakeups = 0

    def notify(self) -> None:
        """Set the alarm; from the loop's thread or any other."""
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the loop closed while a source thread was stopping
            return

    def watch_fd(self, fd: int) -> None:
        """Set the alarm when ``fd`` is readable."""
        self._fds.add(fd)
        self._loop.add_reader(fd, self._fd_ready, fd)

    def _fd_ready(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        self._fired.add(fd)
        self._ready.set()

    def rearm(self) -> None:
        """Watch again the descriptors that fired (call after reading them)."""
        for fd in self._fired:
            self._loop.add_reader(fd, self._fd_ready, fd)
        self._fired.clear()

    async def wait(self, seconds: float, clock: Clock) -> bool:
        """Wait up to ``seconds`` of clock time; True when a source woke us first."""
        if not await wait_for_event(self._ready, seconds, clock):
            return False
        self._ready.clear()
        self.wakeups += 1
        return True

    def close(self) -> None:
        """Stop watching descriptors."""
        for fd in self._fds:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(fd)
        self._fds.clear()
        self._fired.clear()
