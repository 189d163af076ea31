"""Merge Xids seen by two sources (the kernel log and NVML events) so one fault is one event.

Each real Xid shows up once in each working source. An occurrence is paired with an unpaired
occurrence of the same GPU and Xid from the *other* source within ``window_s``; only unpaired
occurrences are new. So a burst of N Xids gives N events, not 2N and not 1, and a node where one
source is off still reports everything through the other.
"""

from __future__ import annotations

from collections import deque


class XidMerger:
    """Pairs occurrences across sources; pure apart from the times it is given."""

    __slots__ = ("_unpaired", "window_s")

    def __init__(self, window_s: float = 10.0) -> None:
        """Occurrences more than ``window_s`` apart are never the same fault."""
        if window_s <= 0:
            msg = f"window_s must be positive, got {window_s}"
            raise ValueError(msg)
        self.window_s = window_s
        self._unpaired: dict[tuple[str, str, int], deque[float]] = {}

    def offer(self, source: str, gpu: str, xid: int, now: float) -> bool:
        """Record an occurrence; return True if it is new, False if the other source had it."""
        for (src, g, x), times in list(self._unpaired.items()):
            while times and now - times[0] > self.window_s:
                times.popleft()
            if not times:
                del self._unpaired[src, g, x]
        for (src, g, x), times in self._unpaired.items():
            if src != source and g == gpu and x == xid and times:
                times.popleft()
                return False
        self._unpaired.setdefault((source, gpu, xid), deque()).append(now)
        return True
