"""Keep the garbage collector's pauses short on a collector with a large fleet.

CPython stops the event loop for each collection, and two kinds of objects made them long:

* The model. At 4,096 nodes it is hundreds of thousands of long-lived objects, and a full
  (generation 2) collection walks every one: 0.5 to 1 s with no stream read, no event acked and
  no rule evaluated (bench/collector_ingest.py).
* Each stream's pending read. grpc.aio makes about 22 tracked objects for every ``read()`` (a
  coroutine, futures, callback wrappers, the message), and they live until the node's next
  message, a second later. A young collection walks every object made since the last one, so
  at 4,096 nodes each walked some 90,000 live objects: 70 to 120 ms, once a second. That was
  9 % of the collector's core and the tail of its lag, and it found nothing: twenty seconds with
  no collection at all left 0 to 40 unreachable objects.

So every tracked object is frozen (``gc.freeze()``: moved, in constant time, where no collection
looks) ten times a second, and a young collection sees at most a tenth of a second's objects.
Frozen objects are still freed by reference counting; what freezing gives up is finding
reference cycles that have become garbage. That is bounded three ways:

* a full collection of everything runs once the heap has doubled per connected node since the
  last one (as Go's collector lets its heap double between collections), checked every
  :data:`GROWTH_CHECK_EVERY_S`. Per connected node, counted from :data:`NODES_FLOOR` up: a fleet
  coming back after a restart grows the heap tenfold in half a minute, and collecting at each
  doubling stopped the loop for 0.3, 0.5 and 1 s while the nodes already back waited for their
  acks; a small fleet's heap still doubles as before. The heap is measured in the allocator's
  blocks in use (``sys.getallocatedblocks()``, which sums a count kept per 16 KiB pool: about
  1 ms at 15 million blocks), not by counting the frozen objects: that walks them, and in a heap
  of gigabytes each is a cache miss (170 ms a count at 4,096 nodes, every 10 s);
* and at least every ``full_every_s`` (an hour);
* a full collection that finds more than :data:`GARBAGE_LIMIT` unreachable objects means
  something makes cycles fast (a flood of failing streams, say): the freezer then freezes only
  after full collections, so young collections find those cycles, until a full collection finds
  little again.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from typing import TYPE_CHECKING, Any, Final, Protocol

import structlog

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetwatch.clock import Clock

log = structlog.get_logger("collector.gc")

FULL_EVERY_S: Final = 3600.0
FREEZE_EVERY_S: Final = 0.1
GROWTH_CHECK_EVERY_S: Final = 10.0
GROWTH_FACTOR: Final = 2.0
# Below this many blocks in use, growth is measured from this many (a collector just started
# holds about 250,000: doubling from there would collect every few seconds while a fleet
# connects).
MIN_BASELINE: Final = 1_000_000
GARBAGE_LIMIT: Final = 50_000
# The heap's growth is measured per connected node, counting at least this many nodes.
NODES_FLOOR: Final = 256
# Allocations between young collections (CPython's default is 700). A loaded collector makes
# tens of thousands of short-lived containers a second (a report's samples); at 700 it ran 65
# young collections a second.
YOUNG_THRESHOLD: Final = 10_000


class GcModule(Protocol):
    """What of the ``gc`` module this uses (injected, for tests)."""

    callbacks: list[Any]

    def get_threshold(self) -> tuple[int, int, int]:
        """The collection thresholds."""
        ...

    def set_threshold(self, threshold0: int, threshold1: int, threshold2: int) -> None:
        """Set the collection thresholds."""
        ...

    def collect(self) -> int:
        """Run a full collection; return how many unreachable objects it found."""
        ...

    def freeze(self) -> None:
        """Move every tracked object to the permanent generation."""
        ...

    def unfreeze(self) -> None:
        """Move the permanent generation back to the oldest one."""
        ...


class Freezer:
    """Freezes the heap ten times a second on the event loop; collects it all now and then."""

    def __init__(
        self,
        clock: Clock,
        *,
        gc_module: GcModule = gc,
        full_every_s: float = FULL_EVERY_S,
        heap_blocks: Callable[[], int] = sys.getallocatedblocks,
        nodes: Callable[[], int] = lambda: 0,
    ) -> None:
        """Nothing happens until :meth:`run`.

        ``heap_blocks`` measures the heap; ``nodes`` counts the connected nodes whose state it
        holds.
        """
        self._clock = clock
        self._gc = gc_module
        self._heap_blocks = heap_blocks
        self._nodes = nodes
        self._baseline_nodes = 0  # connected nodes at the last full collection
        self._full_every_s = full_every_s
        self._full_collections = 0  # written by the callback, in whatever thread collected
        self._seen = 0
        self._baseline = 0  # blocks in use right after the last full collection
        # False while cycles come fast: frozen only after full collections (see the module)
        self.young_frozen = True
        self.full_runs = 0  # full collections this freezer ran

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info.get("generation") == 2:  # noqa: PLR2004 - the oldest
            self._full_collections += 1

    async def run(self) -> None:
        """Freeze and collect until cancelled; then thaw everything and put the thresholds back."""
        self._gc.callbacks.append(self._on_collection)
        before = self._gc.get_threshold()
        self._gc.set_threshold(YOUNG_THRESHOLD, before[1], before[2])
        self._gc.freeze()
        self._baseline = self._heap_blocks()
        self._baseline_nodes = self._nodes()
        full_at = checked_at = self._clock.monotonic()
        try:
            while True:
                await self._clock.sleep(FREEZE_EVERY_S)
                now = self._clock.monotonic()
                due = now - full_at >= self._full_every_s
                if not due and now - checked_at >= GROWTH_CHECK_EVERY_S:
                    checked_at = now
                    due = self._heap_blocks() >= self._limit()
                if due:
                    self._collect_all()
                    full_at = checked_at = self._clock.monotonic()
                elif self.young_frozen or self._full_collections != self._seen:
                    self._seen = self._full_collections
                    self._gc.freeze()
        finally:  # leave the interpreter as it was (a collector stopped inside a test run)
            if self._on_collection in self._gc.callbacks:
                self._gc.callbacks.remove(self._on_collection)
            self._gc.set_threshold(*before)
            self._gc.unfreeze()

    def _limit(self) -> float:
        """The blocks in use at which the heap has doubled per connected node."""
        grown = self._nodes() / max(self._baseline_nodes, NODES_FLOOR)
        return GROWTH_FACTOR * max(self._baseline, MIN_BASELINE) * max(1.0, grown)

    def _collect_all(self) -> None:
        """Thaw everything, collect it all, freeze the survivors."""
        started = self._clock.monotonic()
        self._gc.unfreeze()
        found = self._gc.collect()
        self._gc.freeze()
        self._seen = self._full_collections
        self._baseline = self._heap_blocks()
        self._baseline_nodes = self._nodes()
        self.full_runs += 1
        was, self.young_frozen = self.young_frozen, found <= GARBAGE_LIMIT
        log.info(
            "gc_full_collection",
            unreachable=found,
            blocks=self._baseline,
            nodes=self._baseline_nodes,
            pause_ms=round((self._clock.monotonic() - started) * 1000, 1),
            young_frozen=self.young_frozen,
        )
        if was and not self.young_frozen:
            log.warning("gc_cycles_fast", unreachable=found, limit=GARBAGE_LIMIT)


def start_freezer(clock: Clock, nodes: Callable[[], int]) -> asyncio.Task[None]:
    """Run a :class:`Freezer` on the running loop; ``nodes`` counts the connected nodes."""
    return asyncio.create_task(Freezer(clock, nodes=nodes).run(), name="gc-freezer")
