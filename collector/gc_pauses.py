"""Keep the garbage collector's full collections short on a collector with a large fleet.

CPython's full (generation 2) collection walks every object the collector tracks, with the
event loop stopped. A collector's model of 4,096 nodes is hundreds of thousands of long-lived
objects; each full collection took 0.5 to 0.9 s (bench/collector_ingest.py), and while it ran no
stream was read, no event acked and no rule evaluated: that pause was the tail of ingest lag and
of fault-to-action latency.

So after each full collection, what survived it is frozen (``gc.freeze()``: moved where no
collection looks): the next full collection walks only what was made since. Memory is still
freed by reference counting; what freezing gives up is collecting reference cycles among frozen
objects that later become garbage. To bound that, everything is thawed every ``thaw_every_s``
(an hour by default), so one full collection an hour walks the whole heap again.
"""

from __future__ import annotations

import asyncio
import gc
from typing import TYPE_CHECKING, Any, Final, Protocol

import structlog

if TYPE_CHECKING:
    from fleetwatch.clock import Clock

log = structlog.get_logger("collector.gc")

THAW_EVERY_S: Final = 3600.0
# Allocations between young collections (CPython's default is 700). A loaded collector makes
# tens of thousands of short-lived containers a second (a report's samples); at 700 it ran 65
# young collections a second, 0.4 ms each, and a middle one every 0.2 s, 4 ms each.
YOUNG_THRESHOLD: Final = 10_000
CHECK_EVERY_S: Final = 1.0


class GcModule(Protocol):
    """What of the ``gc`` module this uses (injected, for tests)."""

    callbacks: list[Any]

    def get_threshold(self) -> tuple[int, int, int]:
        """The collection thresholds."""
        ...

    def set_threshold(self, threshold0: int, threshold1: int, threshold2: int) -> None:
        """Set the collection thresholds."""
        ...

    def freeze(self) -> None:
        """Move every tracked object to the permanent generation."""
        ...

    def unfreeze(self) -> None:
        """Move the permanent generation back to the oldest one."""
        ...

    def get_freeze_count(self) -> int:
        """How many objects are frozen."""
        ...


class FullCollectionFreezer:
    """Freezes the survivors of each full collection, on the event loop; thaws now and then.

    It also collects the youngest generation less often (:data:`YOUNG_THRESHOLD`).
    """

    def __init__(
        self,
        clock: Clock,
        *,
        gc_module: GcModule = gc,
        thaw_every_s: float = THAW_EVERY_S,
    ) -> None:
        """Nothing happens until :meth:`run`."""
        self._clock = clock
        self._gc = gc_module
        self._thaw_every_s = thaw_every_s
        self._full_collections = 0  # written by the callback, in whatever thread collected
        self._seen = 0
        self.freezes = 0
        self.thaws = 0

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info.get("generation") == 2:  # noqa: PLR2004 - the oldest
            self._full_collections += 1

    async def run(self) -> None:
        """Watch for full collections until cancelled; freeze after each.

        Cancelled, it thaws everything and puts the thresholds back.
        """
        self._gc.callbacks.append(self._on_collection)
        before = self._gc.get_threshold()
        self._gc.set_threshold(YOUNG_THRESHOLD, before[1], before[2])
        thawed_at = self._clock.monotonic()
        try:
            while True:
                await self._clock.sleep(CHECK_EVERY_S)
                if self._clock.monotonic() - thawed_at >= self._thaw_every_s:
                    self._gc.unfreeze()  # the next full collection walks everything again
                    self.thaws += 1
                    thawed_at = self._clock.monotonic()
                    self._seen = self._full_collections
                    log.info("gc_thawed")
                elif self._full_collections != self._seen:
                    self._seen = self._full_collections
                    self._gc.freeze()
                    self.freezes += 1
                    log.debug("gc_frozen", objects=self._gc.get_freeze_count())
        finally:  # leave the interpreter as it was (a collector stopped inside a test run)
            if self._on_collection in self._gc.callbacks:
                self._gc.callbacks.remove(self._on_collection)
            self._gc.set_threshold(*before)
            self._gc.unfreeze()


def start_freezer(clock: Clock) -> asyncio.Task[None]:
    """Run a :class:`FullCollectionFreezer` on the running loop."""
    return asyncio.create_task(FullCollectionFreezer(clock).run(), name="gc-freezer")
