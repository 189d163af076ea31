"""Merge Xids seen by two sources, and coalesce storms, so the outbox holds faults, not copies.

**Two sources.** Each real Xid shows up once in each working source (the kernel log and NVML
events). An occurrence is paired with an unpaired occurrence of the same GPU and Xid from the
*other* source within ``window_s``; only unpaired occurrences are new. So a burst of N Xids gives
N occurrences, not 2N and not 1, and a node where one source is off still reports everything
through the other.

**Storms.** A GPU in trouble can print the same Xid thousands of times a second. Of the new
occurrences of one Xid on one GPU (or PCI function), the first ``burst`` within ``coalesce_s`` are
reported as events of their own; the rest are counted, and :meth:`XidMerger.flush` hands out one
:class:`XidRepeats` per storm and window, which the kernel-log poller turns into one event whose
detail says how many occurrences it stands for (:mod:`fleetwatch.wire.repeats`). While the storm
lasts, every window gives one such event; a window without an occurrence ends the storm. Different
Xids, or the same Xid on different GPUs, are never merged.

Memory is bounded: unpaired occurrences are kept per key up to :data:`MAX_UNPAIRED` (a source
that lags further behind than that in a storm pairs less, and its copies count as repeats).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

MAX_UNPAIRED: Final = 4096


@dataclass(frozen=True, slots=True)
class XidRepeats:
    """Occurrences of one Xid on one GPU that a storm's window held back."""

    gpu: str  # the GPU's UUID, or a PCI bus id for a device NVML does not know
    xid: int
    times: int
    span_s: float  # how long the window ran
    text: str  # the last occurrence's own words (a kernel log line), "" when none had any


@dataclass(slots=True)
class _Storm:
    opened: float
    passed: int  # occurrences of this window reported as events of their own
    repeats: int = 0  # occurrences of this window held back
    text: str = ""


class XidMerger:
    """Pairs occurrences across sources and coalesces storms; pure apart from the times given."""

    __slots__ = ("_storms", "_unpaired", "burst", "coalesce_s", "coalesced", "window_s")

    def __init__(
        self, window_s: float = 10.0, *, coalesce_s: float = 1.0, burst: int = 100
    ) -> None:
        """Set how occurrences pair up and when they make a storm.

        Occurrences more than ``window_s`` apart are never the same fault; more than ``burst``
        new occurrences of one Xid on one GPU within ``coalesce_s`` are a storm.
        """
        if window_s <= 0 or coalesce_s <= 0:
            msg = f"window_s and coalesce_s must be positive, got {window_s} and {coalesce_s}"
            raise ValueError(msg)
        if burst < 1:
            msg = f"burst must be at least 1, got {burst}"
            raise ValueError(msg)
        self.window_s = window_s
        self.coalesce_s = coalesce_s
        self.burst = burst
        self.coalesced = 0  # occurrences held back in storms, ever
        self._unpaired: dict[tuple[str, int], dict[str, deque[float]]] = {}
        self._storms: dict[tuple[str, int], _Storm] = {}

    def offer(self, source: str, gpu: str, xid: int, now: float, text: str = "") -> bool:
        """Record an occurrence; return True if it is to be reported as an event now.

        False: the other source had it already, or it is part of a storm (counted, and handed
        out by :meth:`flush`). ``text`` is the occurrence's own words, kept for the storm's event.
        """
        horizon = now - self.window_s
        sources = self._unpaired.setdefault((gpu, xid), {})
        for src, times in sources.items():
            if src == source:
                continue
            _expire(times, horizon)
            if times:
                times.popleft()
                return False
        mine = sources.get(source)
        if mine is None:
            mine = sources[source] = deque(maxlen=MAX_UNPAIRED)
        _expire(mine, horizon)
        mine.append(now)
        return self._admit((gpu, xid), now, text)

    def _admit(self, key: tuple[str, int], now: float, text: str) -> bool:
        storm = self._storms.get(key)
        if storm is None or (now - storm.opened >= self.coalesce_s and not storm.repeats):
            self._storms[key] = _Storm(opened=now, passed=1)
            return True
        if storm.passed < self.burst:
            storm.passed += 1
            return True
        storm.repeats += 1
        if text:
            storm.text = text
        self.coalesced += 1
        return False

    def flush(self, now: float) -> list[XidRepeats]:
        """The storms whose window ended by ``now`` with occurrences held back, one each.

        A storm that held some back goes on in a new window (its occurrences are held back
        from the first); one whose window held none back is over.
        """
        out: list[XidRepeats] = []
        for key, storm in list(self._storms.items()):
            if now - storm.opened < self.coalesce_s:
                continue
            if storm.repeats:
                gpu, xid = key
                out.append(XidRepeats(gpu, xid, storm.repeats, now - storm.opened, storm.text))
                self._storms[key] = _Storm(opened=now, passed=self.burst, text=storm.text)
            else:
                del self._storms[key]
        self._sweep(now - self.window_s)
        return out

    def _sweep(self, horizon: float) -> None:
        """Forget unpaired occurrences too old to pair."""
        for key, sources in list(self._unpaired.items()):
            for src, times in list(sources.items()):
                _expire(times, horizon)
                if not times:
                    del sources[src]
            if not sources:
                del self._unpaired[key]


def _expire(times: deque[float], horizon: float) -> None:
    while times and times[0] < horizon:
        times.popleft()
