"""The outbox: every event waits here, numbered, until the collector acks it as journaled.

Sequence numbers are per boot, start at 1 and have no gaps. An ack is cumulative: it carries the
highest sequence number the collector has committed, so everything up to it can go.

With a :class:`~agent.outbox.spool.Spool` the events are on disk too, and a new process of the same
boot starts with what the earlier one left: the unacknowledged events with their original
numbers, sent again and deduplicated by the collector. Without one they live in memory only.

The disk is never touched on the event loop. The spool belongs to one thread of the outbox's own
(the *disk thread*), which runs the disk work in the order it was handed over: the appends of the
events numbered since the last hand-off, then an ack's clean-up or the fsync of :meth:`Outbox.sync`,
which the event loop awaits and never waits on (one hand-off there and back per batch of events:
about 0.1 ms of CPU, ``bench/spool_fsync.py``). A disk that takes seconds per fsync costs the agent
that latency on its events, not its loop. Ordering comes from the one thread: an event is *released*
to the link (:meth:`Outbox.after`) only once a sync handed over after its append has finished, so an
event is on disk before it is sent; where the disk refused it, it is released all the same, kept in
memory and written by a later sync (the failure is counted). Callers that sync at the same time
share one fsync.

A fresh agent process may not know every number an earlier process of the same boot used (no
spool, a damaged one, or events the disk refused). The first Welcome tells it: the collector's
highest journaled number for this boot. The events this process numbered itself before that
Welcome, and restored events whose numbers no Welcome ever confirmed (they were never sent), are
renumbered above it if they overlap, so they are not taken for duplicates; restored events with
confirmed numbers keep them. After the first Welcome numbers never move again. Until the disk
holds the confirmed (or renumbered) events, nothing is released.

Everything held shares one byte bound (:class:`~agent.outbox.budget.ByteBudget`) with the telemetry
waiting for the link: the events count for their records' bytes until acknowledged; an event
that needs room sheds the oldest telemetry first, and is refused
(:class:`~agent.exceptions.OutboxFullError`) only when events alone fill the bound.

With a spool, use the outbox from its event loop (the disk work is handed over from there).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
from collections import deque
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import structlog

from agent.exceptions import OutboxFullError
from agent.outbox.budget import ByteBudget
from agent.outbox.spool import record_size

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent.outbox.spool import Spool
    from agent.poll.findings import PendingEvent
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

log = structlog.get_logger("agent.outbox")

P = ParamSpec("P")
T = TypeVar("T")


class _DiskThread(Executor):
    """One daemon thread that runs what it is given, in order.

    Not a ThreadPoolExecutor: its threads are joined at interpreter exit, and a disk stuck in an
    fsync would then hold the process forever. What a killed write leaves is what a crash
    leaves, which the spool is made for.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Queue ``fn(*args, **kwargs)``; starts the thread on the first call."""
        future: Future[T] = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="outbox-disk", daemon=True)
                self._thread.start()
            self._jobs.put((future, partial(fn, *args, **kwargs)))
        return future

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, work = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:  # noqa: FBT001, FBT002 - Executor's signature
        """End the thread after the work queued so far (``cancel_futures`` is not supported)."""
        del cancel_futures
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._jobs.put(None)
        if wait and thread is not None:
            thread.join()


@dataclass(frozen=True, slots=True)
class SpoolState:
    """What the spool said after the disk thread's latest piece of work."""

    held_bytes: int = 0  # segment files plus events waiting in memory for the disk
    backlog: int = 0  # events not (known to be) on disk
    write_errors: int = 0
    damaged: int = 0


def _state_of(spool: Spool) -> SpoolState:
    return SpoolState(spool.held_bytes, spool.backlog, spool.write_errors, spool.damaged)


@dataclass(slots=True)
class _Sync:
    """The sync in flight: it covers every event numbered before it was handed over."""

    ticket: int
    through: int  # events numbered by then (counted as in Outbox._added)
    done: asyncio.Future[bool]


def _copy(event: pb.Event) -> pb.Event:
    """A copy for the disk thread: the loop may renumber its own while the copy is written."""
    copy = type(event)()
    copy.CopyFrom(event)
    return copy


class Outbox:
    """Numbered, unacknowledged events of one boot, oldest first."""

    __slots__ = (
        "_acked",
        "_added",
        "_barrier",
        "_confirmed",
        "_durable_through",
        "_executor",
        "_fixed_through",
        "_flight",
        "_next_seq",
        "_pending",
        "_pending_bytes",
        "_released",
        "_tickets",
        "_unwritten",
        "boot_id",
        "budget",
        "on_release",
        "restored",
        "spool",
        "spool_state",
    )

    def __init__(
        self,
        boot_id: str,
        *,
        spool: Spool | None = None,
        budget: ByteBudget | None = None,
    ) -> None:
        """Start with what ``spool`` restores (read here, on the caller's thread), or empty."""
        self.boot_id = boot_id
        self.spool = spool
        self.budget = budget or ByteBudget()
        self._pending: deque[pb.Event] = deque()
        self._next_seq = 1
        self._acked = 0
        self._confirmed = False
        self._fixed_through = 0  # restored numbers a Welcome confirmed: never renumbered
        self.restored = 0
        self.spool_state = SpoolState()
        if spool is not None:
            recovered = spool.open()
            self._pending.extend(recovered.events)
            self._next_seq = recovered.next_seq
            self._acked = recovered.acked
            self._fixed_through = recovered.fixed_through
            self.restored = len(recovered.events)
            self.spool_state = _state_of(spool)
        self._pending_bytes = sum(record_size(event) for event in self._pending)
        # Events are counted as they are held (restored ones first); an event is released to
        # the link once a sync handed over after it has finished. Restored ones are on disk.
        self._added = self._released = len(self._pending)
        self._durable_through = self._added
        self._tickets = 0  # disk work handed over so far
        self._barrier = 0  # work before this ticket releases nothing (a Welcome's rewrite)
        self._flight: _Sync | None = None
        self._unwritten: list[pb.Event] = []  # numbered, to be appended with the next hand-off
        self._executor: _DiskThread | None = None
        self.on_release: Callable[[], None] = lambda: None  # the agent wakes the link's sender
        self._account()

    def __len__(self) -> int:
        """Return how many events wait for an ack."""
        return len(self._pending)

    @property
    def acked_seq(self) -> int:
        """Highest sequence number the collector has acknowledged."""
        return self._acked

    @property
    def last_seq(self) -> int:
        """Highest sequence number handed out so far (0 before the first event)."""
        return self._next_seq - 1

    @property
    def resume_seq(self) -> int:
        """The lowest number this outbox still holds or will give out (the Hello says it).

        Every number below it was acknowledged (by whichever journal) or lost with a damaged
        spool, and will never be sent: a collector whose journal lacks some of them (restored
        from a backup, or one that does not share the journal of the collector that acked
        them) may let the stream start past them.
        """
        return self._pending[0].seq if self._pending else self._next_seq

    def _account(self) -> None:
        self.budget.events = self._pending_bytes

    # ---- the disk thread -----------------------------------------------------------------------

    def _disk(
        self,
        fn: Callable[..., object],
        *args: object,
        release: bool = False,
    ) -> asyncio.Future[Any]:
        """Hand ``fn(*args)`` to the disk thread, after everything handed over before it.

        The events numbered since the last hand-off are appended first, in the same hand-off.
        The returned future (which nobody need await) has ``fn``'s result once the outbox has
        taken note of the spool's state; ``release``: the events numbered so far may go out then.
        """
        spool = self.spool
        assert spool is not None  # noqa: S101 - callers check
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = _DiskThread()
        self._tickets += 1
        ticket, through = self._tickets, self._added
        unwritten, self._unwritten = self._unwritten, []

        def work() -> tuple[object, SpoolState]:
            for event in unwritten:
                spool.append(event)
            return fn(*args), _state_of(spool)

        done: asyncio.Future[Any] = loop.create_future()
        ran = loop.run_in_executor(self._executor, work)
        ran.add_done_callback(partial(self._finished, ticket, through, release, done))
        return done

    def _finished(
        self,
        ticket: int,
        through: int,
        release: bool,  # noqa: FBT001 - bound by partial
        done: asyncio.Future[Any],
        ran: asyncio.Future[tuple[object, SpoolState]],
    ) -> None:
        """On the loop, after a piece of disk work: note the spool's state, release events."""
        error = None if ran.cancelled() else ran.exception()
        value: object = False
        if ran.cancelled():
            error = asyncio.CancelledError()
        elif error is not None:
            log.error("spool_work_failed", error=repr(error), exc_info=error)
        else:
            value, self.spool_state = ran.result()
            if self.spool_state.backlog == 0:
                self._durable_through = max(self._durable_through, through)
        if release and ticket >= self._barrier and through > self._released:
            self._released = through  # failed or not: what the disk refused is sent from memory
            self.on_release()
        if self._flight is not None and self._flight.ticket == ticket:
            self._flight = None
        if done.cancelled():
            return
        if error is None:
            done.set_result(value)
        else:
            done.set_exception(error)
            done.exception()  # retrieved: it was logged above, whoever awaits it or not

    def on_disk_thread(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the disk thread after the disk work handed over so far (not waited for).

        The agent moves the kernel log cursor this way: after the fsync of the events it
        covers, and off the event loop (it is an fsync of its own). Without a spool, at once.
        """
        if self.spool is None:
            fn()
        else:
            self._disk(fn)

    # ---- events ------------------------------------------------------------------------------

    def add(self, event: PendingEvent) -> pb.Event:
        """Number an event and keep it until acked (OutboxFullError: events fill the bound).

        With a spool the event is written on the disk thread with the next hand-off (the next
        :meth:`sync` at the latest), which makes it durable and releases it to the link. Without
        one it is released at once.
        """
        msg = event.to_pb(self._next_seq)
        size = record_size(msg)
        self._make_room(size)
        self._next_seq += 1
        self._pending.append(msg)
        self._pending_bytes += size
        self._added += 1
        if self.spool is not None:
            self._unwritten.append(_copy(msg))
        else:
            self._released = self._added
        self._account()
        return msg

    def _make_room(self, size: int) -> None:
        budget = self.budget
        if self._pending_bytes + size > budget.max_bytes:
            msg = f"events hold {self._pending_bytes} of {budget.max_bytes} bytes"
            raise OutboxFullError(msg)
        if budget.room() < size:
            budget.shed(size - budget.room())

    @property
    def durable(self) -> bool:
        """Whether every event numbered so far is on disk (always False without a spool)."""
        return self.spool is not None and self._durable_through >= self._added

    async def sync(self) -> bool:
        """Make the events numbered so far durable and release them; True if all are on disk.

        The fsync runs on the disk thread; the loop goes on meanwhile. Events the disk refused
        are released all the same (sent from memory) and retried by the next sync; False says
        so (always False without a spool). Callers waiting at the same time share one fsync:
        a caller whose events came after the sync in flight waits for it and then for one more
        (so does one that came after a Welcome's rewrite was handed over).
        """
        if self.spool is None:
            return False
        if self.durable and self._released >= self._added:
            return True
        target = self._added
        while True:
            flight = self._flight
            if flight is None:
                done = self._disk(self.spool.sync, release=True)
                flight = self._flight = _Sync(self._tickets, self._added, done)
            if flight.through >= target and flight.ticket >= self._barrier:
                return bool(await asyncio.shield(flight.done))
            with contextlib.suppress(Exception):  # raised to that sync's own callers
                await asyncio.shield(flight.done)

    def ack(self, seq: int) -> int:
        """Drop every event up to ``seq``; return how many were dropped."""
        if seq > self.last_seq:
            log.warning("ack_beyond_last_seq", ack=seq, last_seq=self.last_seq)
            seq = self.last_seq
        dropped = 0
        while self._pending and self._pending[0].seq <= seq:
            event = self._pending.popleft()
            self._pending_bytes -= record_size(event)
            dropped += 1
        if seq > self._acked:
            self._acked = seq
            if self.spool is not None:
                self._disk(self.spool.ack, seq)
        self._account()
        return dropped

    def welcome(self, journaled_seq: int) -> None:
        """Apply the collector's Welcome: renumber once if needed, then treat it as an ack.

        With a spool, the first Welcome's numbers are written on the disk thread, and nothing
        is released to the link until they are on disk: a later process must never renumber
        what was sent.
        """
        if self._confirmed:
            self.ack(journaled_seq)
            return
        self._confirmed = True
        fresh = [event for event in self._pending if event.seq > self._fixed_through]
        first = fresh[0].seq if fresh else self._next_seq
        shift = journaled_seq + 1 - first
        if shift > 0:
            for event in fresh:
                event.seq += shift
            self._next_seq += shift
            log.info("outbox_renumbered", boot_id=self.boot_id, shift=shift, events=len(fresh))
        if self.spool is not None:
            self._released = min(self._released, self._added - len(self._pending))
        self.ack(journaled_seq)
        if self.spool is not None:
            # The numbers on disk must be the ones the collector will see, before it sees them,
            # and marked as seen.
            events = [_copy(event) for event in self._pending]
            write = self.spool.rewrite if shift > 0 else self.spool.confirm
            self._disk(write, events, self._next_seq, release=True)
            self._barrier = self._tickets  # syncs handed over before it release nothing more

    async def settled(self) -> None:
        """Wait until the disk thread has done the work handed to it so far."""
        if self.spool is not None and (self._executor is not None or self._unwritten):
            await self._disk(lambda: None)

    async def close(self) -> None:
        """Sync what was added, release the spool's file and end the disk thread."""
        if self.spool is None:
            return
        try:
            await self._disk(self.spool.sync, release=True)
            await self._disk(self.spool.close)
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None

    def kmsg_seq(self) -> int:
        """The highest kernel log record any held event was made from (0: none).

        Events of a poll reach the spool (one fsync) before the kernel log cursor file moves
        past their records, so after a crash between the two this, not the cursor file, says
        where the kernel log was read up to: reading on from here reports nothing twice.
        """
        return max((event.kmsg_seq for event in self._pending), default=0)

    def after(self, seq: int) -> list[pb.Event]:
        """The released events with a sequence number above ``seq``, in order: what may be sent."""
        held_back = min(len(self._pending), self._added - self._released)
        sendable = itertools.islice(self._pending, len(self._pending) - held_back)
        return [event for event in sendable if event.seq > seq]

    def held(self) -> list[pb.Event]:
        """Every event held, released or not, in order."""
        return list(self._pending)
