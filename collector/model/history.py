"""Recent history for rule windows: events per target, and counter samples the rules ask about.

Only what a rule can ask for is kept: events for the longest event window any rule uses, and
samples of the signals named in ``increase()``, ``rate()`` and ``rises()``, for the longest
window each is asked over. Both are bounded in length too, so a flood costs memory in proportion
to the limits, not to the flood.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from dataclasses import dataclass
from typing import Final

MAX_EVENTS_PER_TARGET: Final = 1000
MAX_SAMPLES_PER_SERIES: Final = 2000
_POINT: Final = struct.Struct("dd")  # (monotonic time, value) of a counter sample
_LINK: Final = "/nvlink/"  # in the key of an NVLink target (collector.model.target_keys.link_key)


@dataclass(frozen=True, slots=True)
class PastEvent:
    """What the rule functions need of an event."""

    at: float
    kind: str
    xid: int = 0


class History:
    """Events and counter samples per target key (e.g. ``node-01/gpu/3``)."""

    def __init__(self, event_window_s: float, sample_windows: dict[str, float]) -> None:
        """Keep events for ``event_window_s`` and each named signal for its window."""
        self.event_window_s = event_window_s
        self.sample_windows = dict(sample_windows)
        self._events: dict[str, deque[PastEvent]] = {}
        self._added: dict[str, int] = {}  # events ever added per target: says when a window grew
        # Each series is its points packed as doubles (time, value) in one bytearray: most are
        # counters that never move (one point, kept for as long as nothing changes), a few
        # hundred per node. That is small (an empty deque alone costs about 760 bytes) and,
        # unlike a list of tuples or an array, not tracked by the garbage collector, whose full
        # collections scan every tracked object with the event loop stopped: at 2,048 nodes
        # they took 0.7 to 0.9 s (bench/collector_ingest.py). Keyed by "target signal" (no
        # tuples: a dict of strings and bytearrays is not tracked either, where a new tuple key
        # would track the whole dict again, in the youngest generation, walked every time).
        self._samples: dict[str, bytearray] = {}
        # Until when each target's window answers can change with time alone: an event counts
        # in windows for ``event_window_s``, a counter's step for its signal's window. A target
        # whose counters never moved and that had no event answers the same whenever asked.
        self._moving: dict[str, float] = {}
        self._moving_links: dict[str, float] = {}  # node -> the latest of its links' moving

    def wants(self, signal: str) -> bool:
        """Whether samples of ``signal`` are kept."""
        return signal in self.sample_windows

    def add_event(self, target: str, event: PastEvent) -> None:
        """Remember an event of ``target`` (and drop what has aged out)."""
        events = self._events.setdefault(target, deque(maxlen=MAX_EVENTS_PER_TARGET))
        events.append(event)
        self._added[target] = self._added.get(target, 0) + 1
        self._moves(target, event.at + self.event_window_s)
        horizon = event.at - self.event_window_s
        while events and events[0].at < horizon:
            events.popleft()

    def add_sample(self, target: str, signal: str, at: float, value: float) -> None:
        """Remember a counter value of ``target`` (only for signals a rule asks about)."""
        window = self.sample_windows.get(signal)
        if window is None:
            return
        key = f"{target} {signal}"
        series = self._samples.get(key)
        if series is None:
            self._samples[key] = bytearray(_POINT.pack(at, value))
            return
        if value != _POINT.unpack_from(series, len(series) - _POINT.size)[1]:
            self._moves(target, at + window)
        series += _POINT.pack(at, value)
        horizon = at - window
        drop, last = 0, len(series) // _POINT.size - 1
        # keep one point before the window
        while drop < last and _POINT.unpack_from(series, (drop + 1) * _POINT.size)[0] < horizon:
            drop += 1
        drop = max(drop, len(series) // _POINT.size - MAX_SAMPLES_PER_SERIES)
        if drop:
            del series[: drop * _POINT.size]

    def _moves(self, target: str, until: float) -> None:
        if until > self._moving.get(target, -math.inf):
            self._moving[target] = until
            if _LINK in target:
                node = target.split("/", 1)[0]
                self._moving_links[node] = max(self._moving_links.get(node, -math.inf), until)

    def moving_links(self, node: str, now: float) -> bool:
        """Whether any NVLink of ``node`` may be :meth:`moving` (False: none is)."""
        return _still(self._moving_links, node, now)

    def moving(self, target: str, now: float) -> bool:
        """Whether ``target``'s window answers may differ from one moment to the next.

        False once every event it had is older than the event window and every counter step
        older than its signal's window (or when it never had either): until something new comes,
        ``events()``, ``xids()``, ``increase()``, ``rate()`` and ``rises()`` answer it as they did
        before.
        """
        return _still(self._moving, target, now)

    def events(self, target: str, kind: str, since: float) -> int:
        """How many events of ``kind`` ``target`` had at or after ``since``."""
        return sum(1 for e in self._events.get(target, ()) if e.at >= since and e.kind == kind)

    def xids(self, target: str, since: float) -> list[int]:
        """The Xids of ``target``'s ``xid`` events at or after ``since``, oldest first."""
        return [e.xid for e in self._events.get(target, ()) if e.at >= since and e.kind == "xid"]

    def xids_version(self, target: str, since: float) -> tuple[int, int]:
        """What :meth:`xids` would answer, in two numbers: the same pair, the same Xids.

        Events are only added (the pair's first number moves) or age out oldest first (its
        second, how many are in the window, falls): a rule's remembered answer is keyed by this,
        not by the list, which a flood of Xids makes a thousand entries long.
        """
        count = sum(1 for e in self._events.get(target, ()) if e.at >= since and e.kind == "xid")
        return self._added.get(target, 0), count

    def increase(self, target: str, signal: str, since: float, now: float) -> float:
        """How much a counter grew between ``since`` and ``now`` (a drop counts as a reset).

        The value at ``since`` is the last sample at or before it; without one, the first
        sample in the window (growth before it is unknown, not zero-and-then-everything).
        """
        series = self._samples.get(f"{target} {signal}")
        if not series:
            return 0.0
        total = 0.0
        previous: float | None = None
        for at, value in _POINT.iter_unpack(series):
            if at > now:
                break
            if at <= since:
                previous = value
                continue
            if previous is not None:
                total += value - previous if value >= previous else value
            previous = value
        return total

    def rises(self, target: str, signal: str, since: float, now: float) -> int:
        """How many times a counter went up between ``since`` and ``now``, whatever each step.

        Measured as :meth:`increase` measures: from the last sample at or before ``since``
        (without one, the first sample in the window only starts the count); a drop is a reset,
        and a rise only when the new value is above 0. Two errors logged at once are one rise.
        """
        series = self._samples.get(f"{target} {signal}")
        if not series:
            return 0
        count = 0
        previous: float | None = None
        for at, value in _POINT.iter_unpack(series):
            if at > now:
                break
            # a step up, or a drop (a reset) to above 0
            if previous is not None and at > since and (value > previous or 0 < value < previous):
                count += 1
            previous = value
        return count

    def forget(self, prefix: str) -> None:
        """Drop everything of targets whose key starts with ``prefix`` (a node that left)."""
        for key in [k for k in self._events if k.startswith(prefix)]:
            del self._events[key]
        for series in [k for k in self._samples if k.startswith(prefix)]:
            del self._samples[series]
        for key in [k for k in self._moving if k.startswith(prefix)]:
            del self._moving[key]
        for node in [n for n in self._moving_links if f"{n}/".startswith(prefix)]:
            del self._moving_links[node]


def _still(until_by_key: dict[str, float], key: str, now: float) -> bool:
    """Whether ``key``'s time in ``until_by_key`` is not past (a past one is dropped)."""
    until = until_by_key.get(key)
    if until is None:
        return False
    if until < now:
        del until_by_key[key]
        return False
    return True
