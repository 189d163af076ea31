"""Time as an injected dependency.

Everything that reads or waits on time takes a :class:`Clock`, so tests can run hours of a scenario
in seconds with :class:`fleetwatch.testing.FakeClock`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time, monotonic time and sleeping."""

    def now(self) -> float:
        """Seconds since the Unix epoch (wall clock; may jump)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; for intervals and deadlines."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait for ``seconds`` of this clock's time."""
        ...


class SystemClock:
    """The real clock."""

    __slots__ = ()

    def now(self) -> float:
        """Return ``time.time()``."""
        return time.time()

    def monotonic(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Sleep on the running event loop."""
        await asyncio.sleep(seconds)


async def wait_for_event(event: asyncio.Event, seconds: float, clock: Clock) -> bool:
    """Wait until ``event`` is set or ``seconds`` of ``clock`` time pass; True when it is set.

    The event is left as it is: the caller clears it when it has acted on it.
    """
    if not event.is_set():
        waiter = asyncio.ensure_future(event.wait())
        sleeper = asyncio.ensure_future(clock.sleep(seconds))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()
    return event.is_set()


def unix_ms(clock: Clock) -> int:
    """Return the clock's wall time in whole milliseconds."""
    return int(clock.now() * 1000)
