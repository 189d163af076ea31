"""A node's lifecycle: in service, suspect, drained, in repair, re-qualifying, RMA.

What moves a node, and who:

* an incident of ``warning`` or worse fires on it (not silenced, suppressed or in shadow): an
  in-service node is *suspect* (``rule:NAME``); once none of its incidents fires any more, it is
  in service again (``rule:NAME``, the last to resolve);
* fleetwatch drained it (``action:drain_node``, the incident): *drained*;
* a person says it is being repaired (*in repair*), repaired (*re-qualifying* while pre-flight
  re-qualifies it, else back *in service*), or sent for replacement (*RMA*), through the API
  (``person:WHO``); ``fleetwatch drains release`` puts it back *in service*.

Each move is journaled (``collector.store.lifecycle``) in the order it was made, by one writer
task, so a hook (the incident service's watcher, the dispatcher) never waits on the journal; the
state in memory is the truth the API and metrics read at once. A node with no move is in service.
After a restart the newest row of each node is taken back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from enum import StrEnum
from typing import TYPE_CHECKING, Final

import structlog

from collector.store.lifecycle import TransitionRow

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from fleetwatch.clock import Clock

__all__ = ["PERSON_MOVES", "STILL_FIRING", "Lifecycle", "LifecycleError", "State"]

log = structlog.get_logger("collector.model.lifecycle")


class State(StrEnum):
    """Where a node stands."""

    IN_SERVICE = "in_service"
    SUSPECT = "suspect"
    DRAINED = "drained"
    IN_REPAIR = "in_repair"
    REQUALIFYING = "requalifying"
    RMA = "rma"


# What a person may ask for, by the word the API and CLI take, and the state it leads to
# ("repaired" leads to re-qualifying or in service: the caller decides).
PERSON_MOVES: Final = {"repair": State.IN_REPAIR, "repaired": State.REQUALIFYING, "rma": State.RMA}
# Where each state may go. A person may also take a node out of any state into repair or RMA.
_NEXT: Final[dict[State, frozenset[State]]] = {
    State.IN_SERVICE: frozenset({State.SUSPECT, State.DRAINED, State.IN_REPAIR, State.RMA}),
    State.SUSPECT: frozenset({State.IN_SERVICE, State.DRAINED, State.IN_REPAIR, State.RMA}),
    State.DRAINED: frozenset({State.IN_REPAIR, State.REQUALIFYING, State.IN_SERVICE, State.RMA}),
    State.IN_REPAIR: frozenset({State.REQUALIFYING, State.IN_SERVICE, State.RMA, State.DRAINED}),
    State.REQUALIFYING: frozenset({State.IN_SERVICE, State.DRAINED, State.IN_REPAIR, State.RMA}),
    State.RMA: frozenset({State.IN_REPAIR, State.REQUALIFYING, State.IN_SERVICE}),
}
# States a node is out of work in: a fault that fires there does not make it suspect again.
OUT_OF_SERVICE: Final = frozenset({State.DRAINED, State.IN_REPAIR, State.REQUALIFYING, State.RMA})
# The reason of the move back to suspect of a node put back in service while one of its faults
# still fires: the same incident episode going on, not a new one (collector.model.reliability).
STILL_FIRING: Final = "put back in service while this still fires"
_MAX_REASON: Final = 500
_QUEUE_WARN: Final = 10_000


class LifecycleError(ValueError):
    """A move the lifecycle does not allow (the message says from where to where)."""


class Lifecycle:
    """Each node's state, moved by hooks and people, journaled in order."""

    def __init__(
        self,
        write: Callable[[TransitionRow], Awaitable[None]],
        clock: Clock,
        collector: str = "",
    ) -> None:
        """Journal each move through ``write`` (on a task of its own, in order)."""
        self._write = write
        self._clock = clock
        self._collector = collector
        self._rows: dict[str, TransitionRow] = {}
        self._queue: asyncio.Queue[TransitionRow] | None = None
        self._task: asyncio.Task[None] | None = None
        self.moves: Counter[tuple[str, str]] = Counter()  # (from, to) -> count, for /metrics
        # Called with a node that just went back in service (the incidents' watcher makes it
        # suspect again when a fault of it still fires).
        self.back_in_service: list[Callable[[str], None]] = []
        # Called with each move as it is made (the reliability counts the rules read).
        self.moved: list[Callable[[TransitionRow], None]] = []
        self.write_failures = 0

    def load(self, rows: Iterable[TransitionRow]) -> None:
        """Take back each node's newest journaled move (at start)."""
        for row in rows:
            self._rows[row.node] = row

    def start(self) -> None:
        """Start the writer (on the running loop)."""
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._drain(), name="lifecycle-journal")

    async def stop(self) -> None:
        """Journal what is queued, then stop the writer."""
        if self._queue is not None:
            await self._queue.join()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def idle(self) -> None:
        """Wait until every move so far is journaled (tests, an API answer that lists them)."""
        if self._queue is not None:
            await self._queue.join()

    def state(self, node: str) -> State:
        """Where ``node`` stands now."""
        row = self._rows.get(node)
        return State(row.state) if row is not None else State.IN_SERVICE

    def row(self, node: str) -> TransitionRow | None:
        """The move that put ``node`` where it is (None: it never moved, in service)."""
        return self._rows.get(node)

    def rows(self) -> dict[str, TransitionRow]:
        """Each moved node's newest move (a copy)."""
        return dict(self._rows)

    def counts(self, nodes: Iterable[str]) -> dict[State, int]:
        """How many of ``nodes`` (and of the nodes that moved) are in each state."""
        names = set(nodes) | set(self._rows)
        counted = Counter(self.state(n) for n in names)
        return {s: counted.get(s, 0) for s in State}

    def move(  # noqa: PLR0913 - one move, fully described
        self,
        node: str,
        to: State,
        *,
        actor: str,
        incident: str = "",
        reason: str = "",
        strict: bool = False,
    ) -> TransitionRow | None:
        """Move ``node`` to ``to``; None when it is there already, or may not go there.

        ``strict`` (a person's move): a move the lifecycle does not allow raises
        :class:`LifecycleError` instead of being ignored.
        """
        now = self.state(node)
        if now == to:
            return None
        if to not in _NEXT[now] and not (strict and to in (State.IN_REPAIR, State.RMA)):
            if strict:
                msg = f"{node} is {now.value}: it cannot go to {to.value} from there"
                raise LifecycleError(msg)
            return None
        row = TransitionRow(
            node=node,
            state=to.value,
            previous=now.value,
            at_ms=int(self._clock.now() * 1000),
            actor=actor,
            incident=incident,
            reason=reason[:_MAX_REASON],
            collector=self._collector,
        )
        self._rows[node] = row
        self.moves[now.value, to.value] += 1
        log.info(
            "node_lifecycle",
            node=node,
            state=to.value,
            previous=now.value,
            actor=actor,
            incident=incident or None,
        )
        if self._queue is not None:
            self._queue.put_nowait(row)
            if self._queue.qsize() == _QUEUE_WARN:
                log.warning("lifecycle_journal_behind", queued=_QUEUE_WARN)
        for hook in self.moved:
            hook(row)
        if to == State.IN_SERVICE:
            for told in self.back_in_service:
                told(node)
        return row

    async def _drain(self) -> None:
        assert self._queue is not None  # noqa: S101 - set by start()
        while True:
            row = await self._queue.get()
            try:
                await self._write(row)
            except Exception:
                self.write_failures += 1
                log.exception("lifecycle_journal_failed", node=row.node, state=row.state)
            finally:
                self._queue.task_done()
