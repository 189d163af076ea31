"""Coalescing a flood of one event: many alike events of a stream journaled as one row.

Events are alike when they share kind, target and Xid. Of alike events whose times (the agent's,
so a replay after a partition is judged by when things happened, not by how fast they come back)
fall within one ``window_s``, the first ``burst`` are journaled one by one, as usual; the rest are
held and journaled as one row whose detail starts with a marker saying how many events it
stands for and which (``[repeated N times over S s, seq A-B]``, :mod:`fleetwatch.wire.repeats`).

Only a run of consecutive events is held, so the numbers a held run covers are contiguous and
follow everything already journaled: the stream's cumulative ack simply stops before the run
until the run's row is committed, and a crash before then loses nothing (the agent still holds
the events and sends them again). A held run is journaled when an event that does not belong to
it arrives, after ``hold_s``, or when the stream ends.

A real agent coalesces Xid storms itself (``agent/probes/xid_merge.py``) and never sends this
many alike events; this is the collector's defence against a sender that does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from fleetwatch.wire.repeats import mark_repeats, occurrences

if TYPE_CHECKING:
    from collector.ingest.node_event import EventKey, NodeEvent

MAX_KEYS: Final = 4096


class RepeatWindows:
    """Per key, the current window of event time and how many events fell in it."""

    __slots__ = ("_keys", "burst", "window_ms")

    def __init__(self, window_s: float, burst: int) -> None:
        """Journal ``burst`` alike events per ``window_s`` of their time one by one."""
        self.window_ms = int(window_s * 1000)
        self.burst = burst
        self._keys: dict[EventKey, tuple[int, int]] = {}  # key -> (window start ms, count)

    def admit(self, key: EventKey, time_ms: int) -> bool:
        """Count an event; True: journal it on its own, False: coalesce it."""
        start, count = self._keys.get(key, (time_ms, 0))
        if not start <= time_ms < start + self.window_ms:
            start, count = time_ms, 0
        count += 1
        if key not in self._keys and len(self._keys) >= MAX_KEYS:
            self._evict()
        self._keys[key] = (start, count)
        return count <= self.burst

    def _evict(self) -> None:
        """Forget the oldest half of the keys (a sender cycling through many of them)."""
        for key in list(self._keys)[: MAX_KEYS // 2]:
            del self._keys[key]


@dataclass(frozen=True, slots=True)
class Stamp:
    """An event as the collector takes it: its time, its detail, and when it came.

    Time and detail are corrected when the agent's clock could not be right; ``now`` is the
    collector's monotonic time on receipt.
    """

    time_ms: int
    detail: str
    now: float


@dataclass(slots=True)
class HeldRun:
    """Consecutive alike events of one stream, not journaled yet."""

    key: EventKey
    first: NodeEvent
    last_seq: int
    last_time_ms: int
    last_detail: str
    events: int
    occurrences: int
    opened: float  # monotonic
    deadline: float  # monotonic: journal it then at the latest

    @classmethod
    def start(cls, event: NodeEvent, stamp: Stamp, hold_s: float) -> HeldRun:
        """A run of one event, to be journaled by ``hold_s`` after ``stamp.now``."""
        return cls(
            key=event.key,
            first=event,
            last_seq=event.seq,
            last_time_ms=stamp.time_ms,
            last_detail=stamp.detail,
            events=1,
            occurrences=occurrences(stamp.detail),
            opened=stamp.now,
            deadline=stamp.now + hold_s,
        )

    def add(self, event: NodeEvent, stamp: Stamp) -> None:
        """One more event of the run (the next in sequence)."""
        self.last_seq = event.seq
        self.last_time_ms = stamp.time_ms
        self.last_detail = stamp.detail
        self.events += 1
        self.occurrences += occurrences(stamp.detail)

    def detail(self, now: float) -> str:
        """The row's detail: the marker, then the last event's own detail."""
        return mark_repeats(
            self.last_detail,
            self.occurrences,
            now - self.opened,
            seqs=(self.first.seq, self.last_seq),
        )
