"""A share of each turn of the event loop for heavy messages, so the light ones are not stuck.

After a collector's restart thousands of agents connect within seconds, and each sends its
first Report: some 1,500 samples, 2-3 ms of screening and applying on the loop. asyncio runs
every callback that is ready in one turn of its loop, so 2,000 first Reports that arrived
together made one turn of five seconds. The nodes already back waited for all of it twice (their
event's read, then its journal commit's answer): 10 s from an Xid to its ack
(``bench/ingest/reconnect.py``, docs/performance.md, tenth measurement).

:class:`TurnShare` runs such work inline while the turn has spent less than its budget on it,
and queues it otherwise; the queue is worked off a budget a turn, oldest first, each turn after
what else was ready. A stream awaits its own message's work, so its messages keep their order.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Final, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

# The loop's time a turn for heavy work while work waits: this many times what the rest of the
# last turn took, within the bounds below (equal now, so 3 ms a turn: see there).
HEAVY_PER_OTHER: Final = 3.0
# At least this much a turn, and at most this much. A turn's length is what a node already back
# waits for its next message to be read, and a probe's read, commit and ack are three turns. In
# a storm the rest of the loop's work arrives at a share r of the loop's time (the Reports of
# the nodes back, Hellos), so a turn lasts about budget / (1 - r): the heavy work's share of the
# loop is 1 - r whatever the budget, and the budget sets only the turns' length. Measured with
# bench/ingest/reconnect.py --nodes 4096 (docs/performance.md, twelfth measurement), a probe's
# ack during the restart (p50 / p99) and the restart: 4-10 ms a turn 168 / 359 ms in 25.3 s,
# 4 ms 106 / 259 ms in 25.5 s, 3 ms 89 / 184 ms in 26.4 s, 2 ms 72 / 173 ms in 29.5 s (a first
# Report is 2-3 ms, so 2 ms is one a turn, and the turns' own cost begins to show).
TURN_BUDGET_MIN_S: Final = 0.003
TURN_BUDGET_MAX_S: Final = 0.003


class TurnShare:
    """Heavy synchronous work, at most about ``budget_s`` of it a turn of the event loop."""

    def __init__(
        self,
        budget_s: tuple[float, float] = (TURN_BUDGET_MIN_S, TURN_BUDGET_MAX_S),
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``budget_s``: the least and most heavy work a turn; ``timer`` measures the work."""
        self._least, self._most = budget_s
        self._budget = self._least  # this turn's
        self._timer = timer
        self._queue: deque[tuple[Callable[[], object], asyncio.Future[object]]] = deque()
        self._spent = 0.0  # this turn's heavy work, in seconds
        self._reset_pending = False
        self._worker: asyncio.Task[None] | None = None
        self.queued = 0  # pieces of work that waited for a later turn
        self.turns = 0  # turns in which the queue was worked off

    def full(self) -> bool:
        """Whether work handed over now would wait for a later turn."""
        return bool(self._queue) or self._spent >= self._budget

    async def run(self, work: Callable[[], T]) -> T:
        """``work()``'s answer (or its exception): now, or at a later turn when this one is full."""
        if not self.full():
            return self._now(work)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[object] = loop.create_future()
        self._queue.append((work, done))
        self.queued += 1
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._work_off(), name="turn-share")
        return await done  # type: ignore[return-value]  # work()'s T, stored as object

    def _now(self, work: Callable[[], T]) -> T:
        began = self._timer()
        try:
            return work()
        finally:
            self._spent += self._timer() - began
            if not self._reset_pending:
                self._reset_pending = True
                asyncio.get_running_loop().call_soon(self._new_turn)

    def _new_turn(self) -> None:
        self._spent = 0.0
        self._reset_pending = False

    async def _work_off(self) -> None:
        """Each turn after what else was ready, run the queue's oldest work within the budget.

        The budget is ``HEAVY_PER_OTHER`` times the time since this task last ran less the
        heavy work run then (the rest of the loop's turn, or its idle wait), within bounds.
        """
        last_run, last_spent = self._timer(), 0.0
        while self._queue:
            await asyncio.sleep(0)  # this turn's other callbacks, and a new turn's budget
            if self._spent >= self._budget:
                continue
            began = self._timer()
            other = max(0.0, began - last_run - last_spent)
            self._budget = min(self._most, max(self._least, HEAVY_PER_OTHER * other))
            self.turns += 1
            spent_before = self._spent
            while self._queue and self._spent < self._budget:
                work, done = self._queue.popleft()
                if done.done():  # its stream went away meanwhile
                    continue
                try:
                    result = self._now(work)
                except Exception as exc:  # noqa: BLE001 - the caller's to handle, as if run inline
                    done.set_exception(exc)
                else:
                    done.set_result(result)
            last_run, last_spent = began, self._spent - spent_before
        self._budget = self._least
