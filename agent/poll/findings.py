"""What a poll produces: samples (current values) and pending events (what happened)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetwatch.model import EventKind, SampleKey, SampleValue, Target, event_kind_to_pb
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """An event before the outbox numbers it."""

    kind: EventKind
    target: Target
    time_unix_ms: int
    xid: int = 0
    xid_class: str = ""
    detail: str = ""
    kmsg_seq: int = 0  # the kernel log record read up to when it was made (0: another source)

    def to_pb(self, seq: int) -> pb.Event:
        """Render as a wire event numbered ``seq``."""
        return pb.Event(
            seq=seq,
            time_unix_ms=self.time_unix_ms,
            kind=event_kind_to_pb(self.kind),
            target=self.target.to_pb(),
            xid=self.xid,
            xid_class=self.xid_class,
            detail=self.detail,
            kmsg_seq=self.kmsg_seq,
        )


@dataclass(slots=True)
class PollResult:
    """Every current sample, and the events this poll produced (in the order they happened)."""

    samples: dict[SampleKey, SampleValue] = field(default_factory=dict)
    events: list[PendingEvent] = field(default_factory=list)
    # The last kernel log record this poll read (None: none): the cursor moves there once the
    # poll's events are durable in the outbox (see KernelLogPoller.commit).
    kmsg_seq: int | None = None

    def event(self, kind: EventKind, target: Target, now_ms: int, detail: str = "") -> None:
        """Add an event without an Xid."""
        self.events.append(PendingEvent(kind, target, now_ms, detail=detail))
