"""Large Reports take turns, so that a reconnect storm cannot stop every other stream.

A node's first Report after its Hello carries every sample it has (about 1,500 on an 8-GPU
node, 5 ms of the collector's CPU to screen and apply); a steady Report carries the few that
changed (0.2 ms). asyncio runs every callback that is ready at the start of a loop turn before
it looks at the sockets again, so when a restarted collector takes thousands of Hellos at once,
their first Reports were handled in one turn of many seconds (2,600 of them: 13-23 s), and the
streams of the nodes already back, their events' acks, and new Hellos waited behind it (probe
acks took 33 s at p50, gRPC cancelled Hellos it had not taken up, agents started again).

Here such Reports queue and are handled in order, by one task, at most ``slice_s`` of them per
loop turn; everything else runs in between. Each stream still handles its messages in order:
it waits for its Report's turn before it reads its next message.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Final, TypeVar, cast

if TYPE_CHECKING:
    from collections.abc import Callable

HEAVY_SAMPLES: Final = 256  # a Report with more samples than this takes its turn in the lane
LANE_SLICE_S: Final = 0.02  # the lane's work between two turns of the event loop

T = TypeVar("T")


class HeavyLane:
    """A queue of work items done in order, ``slice_s`` of them per turn of the event loop."""

    def __init__(self, timer: Callable[[], float], slice_s: float = LANE_SLICE_S) -> None:
        """``timer``: monotonic seconds (the collector's clock), to measure a slice."""
        self._timer = timer
        self._slice_s = slice_s
        self._queue: deque[tuple[Callable[[], object], asyncio.Future[object]]] = deque()
        self._worker: asyncio.Task[None] | None = None
        self.done = 0  # work items done, for the collector's counters
        self.turns = 0  # turns of the event loop the lane gave between two slices
        self.longest = 0  # the longest queue seen

    @property
    def waiting(self) -> int:
        """Work items queued."""
        return len(self._queue)

    async def run(self, work: Callable[[], T]) -> T:
        """Do ``work`` at its turn and return what it returns (or raise what it raises).

        A caller cancelled while it waits leaves the queue: its work is not done.
        """
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._queue.append((work, future))
        self.longest = max(self.longest, len(self._queue))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name="heavy-lane")
        return cast("T", await future)  # the future holds what ``work`` returned

    async def _drain(self) -> None:
        queue, timer = self._queue, self._timer
        while queue:
            end = timer() + self._slice_s
            while queue:
                work, future = queue.popleft()
                if future.done():  # its stream went away while it waited
                    continue
                try:
                    future.set_result(work())
                except Exception as exc:  # noqa: BLE001 - the caller's error, raised in its stream
                    future.set_exception(exc)
                self.done += 1
                if timer() >= end:
                    break
            if queue:
                self.turns += 1
                await asyncio.sleep(0)  # what became ready meanwhile runs before the next slice
