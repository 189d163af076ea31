"""The outbox: every event waits here, numbered, until the collector acks it as journaled.

Sequence numbers are per boot, start at 1 and have no gaps. An ack is cumulative: it carries the
highest sequence number the collector has committed, so everything up to it can go.

With a :class:`~agent.spool.Spool` the events are on disk too (written when numbered, fsynced by
:meth:`Outbox.sync` once per poll), and a new process of the same boot starts with what the
earlier one left: the unacknowledged events with their original numbers, sent again and
deduplicated by the collector. Without one they live in memory only.

A fresh agent process may not know every number an earlier process of the same boot used (no
spool, a damaged one, or events the disk refused). The first Welcome tells it: the collector's
highest journaled number for this boot. The events this process numbered itself before that
Welcome, and restored events whose numbers no Welcome ever confirmed (they were never sent), are
renumbered above it if they overlap, so they are not taken for duplicates; restored events with
confirmed numbers keep them. After the first Welcome numbers never move again.

Everything held shares one byte bound (:class:`~agent.budget.ByteBudget`) with the telemetry
waiting for the link: an event that needs room sheds the oldest telemetry first, and is refused
(:class:`~agent.exceptions.OutboxFullError`) only when events alone fill the bound.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import structlog

from agent.budget import ByteBudget
from agent.exceptions import OutboxFullError
from agent.spool import record_size

if TYPE_CHECKING:
    from agent.findings import PendingEvent
    from agent.spool import Spool
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

log = structlog.get_logger("agent.outbox")


class Outbox:
    """Numbered, unacknowledged events of one boot, oldest first."""

    __slots__ = (
        "_acked",
        "_confirmed",
        "_fixed_through",
        "_mem_bytes",
        "_next_seq",
        "_pending",
        "boot_id",
        "budget",
        "restored",
        "spool",
    )

    def __init__(
        self,
        boot_id: str,
        *,
        spool: Spool | None = None,
        budget: ByteBudget | None = None,
    ) -> None:
        """Start with what ``spool`` (opened here) restores, or empty at sequence number 1."""
        self.boot_id = boot_id
        self.spool = spool
        self.budget = budget or ByteBudget()
        self._pending: deque[pb.Event] = deque()
        self._next_seq = 1
        self._acked = 0
        self._confirmed = False
        self._fixed_through = 0  # restored numbers a Welcome confirmed: never renumbered
        self._mem_bytes = 0
        self.restored = 0
        if spool is not None:
            recovered = spool.open()
            self._pending.extend(recovered.events)
            self._next_seq = recovered.next_seq
            self._acked = recovered.acked
            self._fixed_through = recovered.fixed_through
            self.restored = len(recovered.events)
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

    def _account(self) -> None:
        if self.spool is not None:
            self.budget.events = self.spool.held_bytes
        else:
            self.budget.events = self._mem_bytes

    def add(self, event: PendingEvent) -> pb.Event:
        """Number an event and keep it until acked (OutboxFullError: events fill the bound)."""
        msg = event.to_pb(self._next_seq)
        size = record_size(msg)
        self._make_room(size)
        self._next_seq += 1
        self._pending.append(msg)
        if self.spool is not None:
            self.spool.append(msg)
        else:
            self._mem_bytes += size
        self._account()
        return msg

    def _make_room(self, size: int) -> None:
        budget = self.budget
        if self.spool is not None and budget.events + size > budget.max_bytes:
            self.spool.compact()  # acknowledged bytes still on disk go first
            self._account()
        if budget.events + size > budget.max_bytes:
            msg = f"events hold {budget.events} of {budget.max_bytes} bytes"
            raise OutboxFullError(msg)
        if budget.room() < size:
            budget.shed(size - budget.room())

    def sync(self) -> None:
        """Make the events added so far durable (one fsync), or retry what the disk refused."""
        if self.spool is not None:
            self.spool.sync()
            self._account()

    def ack(self, seq: int) -> int:
        """Drop every event up to ``seq``; return how many were dropped."""
        if seq > self.last_seq:
            log.warning("ack_beyond_last_seq", ack=seq, last_seq=self.last_seq)
            seq = self.last_seq
        dropped = 0
        while self._pending and self._pending[0].seq <= seq:
            event = self._pending.popleft()
            if self.spool is None:
                self._mem_bytes -= record_size(event)
            dropped += 1
        self._acked = max(self._acked, seq)
        if self.spool is not None:
            self.spool.ack(self._acked)
        self._account()
        return dropped

    def welcome(self, journaled_seq: int) -> None:
        """Apply the collector's Welcome: renumber once if needed, then treat it as an ack."""
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
        self.ack(journaled_seq)
        if self.spool is not None:
            # The numbers on disk must be the ones the collector will see, before it sees them,
            # and marked as seen: a later process must never renumber what was sent.
            if shift > 0:
                self.spool.rewrite(list(self._pending), self._next_seq)
            else:
                self.spool.confirm(list(self._pending), self._next_seq)
            self._account()

    def close(self) -> None:
        """Sync what was added and release the spool's file."""
        if self.spool is not None:
            self.spool.sync()
            self.spool.close()

    @property
    def durable(self) -> bool:
        """Whether every event added so far is on disk (always False without a spool)."""
        return self.spool is not None and self.spool.backlog == 0

    def kmsg_seq(self) -> int:
        """The highest kernel log record any held event was made from (0: none).

        Events of a poll reach the spool (one fsync) before the kernel log cursor file moves
        past their records, so after a crash between the two this, not the cursor file, says
        where the kernel log was read up to: reading on from here reports nothing twice.
        """
        return max((event.kmsg_seq for event in self._pending), default=0)

    def after(self, seq: int) -> list[pb.Event]:
        """Return the pending events with a sequence number above ``seq``, in order."""
        return [event for event in self._pending if event.seq > seq]
