"""The outbox: every event waits here, numbered, until the collector acks it as journaled.

Sequence numbers are per boot, start at 1 and have no gaps. An ack is cumulative: it carries the
highest sequence number the collector has committed, so everything up to it can go.

A fresh agent process does not know which numbers an earlier process of the same boot used. The
first Welcome tells it (the collector's highest journaled number for this boot); if that overlaps
the numbers this process has handed out, the not-yet-sent events are renumbered above it, so they
are not mistaken for duplicates. After the first Welcome numbers never move again.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from agent.findings import PendingEvent
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

log = structlog.get_logger("agent.outbox")


class Outbox:
    """Numbered, unacknowledged events of one boot, oldest first."""

    __slots__ = ("_acked", "_confirmed", "_next_seq", "_pending", "boot_id")

    def __init__(self, boot_id: str) -> None:
        """Start empty at sequence number 1."""
        self.boot_id = boot_id
        self._pending: deque[pb.Event] = deque()
        self._next_seq = 1
        self._acked = 0
        self._confirmed = False

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

    def add(self, event: PendingEvent) -> pb.Event:
        """Number an event and keep it until acked."""
        msg = event.to_pb(self._next_seq)
        self._next_seq += 1
        self._pending.append(msg)
        return msg

    def ack(self, seq: int) -> int:
        """Drop every event up to ``seq``; return how many were dropped."""
        if seq > self.last_seq:
            log.warning("ack_beyond_last_seq", ack=seq, last_seq=self.last_seq)
            seq = self.last_seq
        dropped = 0
        while self._pending and self._pending[0].seq <= seq:
            self._pending.popleft()
            dropped += 1
        self._acked = max(self._acked, seq)
        return dropped

    def welcome(self, journaled_seq: int) -> None:
        """Apply the collector's Welcome: renumber once if needed, then treat it as an ack."""
        if not self._confirmed:
            self._confirmed = True
            first = self._pending[0].seq if self._pending else self._next_seq
            shift = journaled_seq + 1 - first
            if shift > 0:
                for event in self._pending:
                    event.seq += shift
                self._next_seq += shift
                self._acked = journaled_seq
                log.info("outbox_renumbered", boot_id=self.boot_id, shift=shift)
                return
        self.ack(journaled_seq)

    def after(self, seq: int) -> list[pb.Event]:
        """Return the pending events with a sequence number above ``seq``, in order."""
        return [event for event in self._pending if event.seq > seq]
