"""Straggler detection: ranks whose compute time stays above the job's median.

Every finished step, each rank's compute time is divided by that step's median over ranks; a
rank keeps its last ``window_steps`` of these ratios and, with at least half a window, is judged
on their median. Normalising step by step makes a change that slows every rank alike (a new
workload phase, longer sequences) cancel out at once, even while the ranks' windows hold a mix
of old and new steps; the window's median ignores one-off slow steps (a pause, a page fault).

A rank is flagged by either of two rules, and stays flagged while either holds it:

* margin: its ratio goes above ``1 + margin``; it is held until it falls below
  ``1 + margin / 2`` (hysteresis);
* fail-slow (with ``shift`` set): its CUSUM (:mod:`collector.jobs.failslow`) crosses the
  threshold while its ratio is above ``1 + shift / 2`` and significantly above 1; it is held
  until the ratio falls below ``1 + shift / 4``, when its CUSUM starts over. This names
  sustained small slowdowns (a 5 % shift among 2 % noise is many noise units out) that the
  margin leaves alone.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING

from collector.jobs.failslow import FailSlowDetector

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True, slots=True)
class StragglerConfig:
    """How slow, for how long, and among how many ranks a rank must be to be a straggler."""

    margin: float = 0.10
    """A rank is slow when its compute time is this share above the job median."""
    window_steps: int = 20
    """... judged on the median of its last ``window_steps`` steps."""
    min_ranks: int = 3
    """Fewer judged ranks than this: no median worth comparing against."""
    shift: float | None = None
    """Fail-slow: a sustained shift of this share above the median is named too (None: off)."""

    def __post_init__(self) -> None:
        """Refuse options that cannot work."""
        if not (self.margin > 0 and math.isfinite(self.margin)):
            msg = f"straggler margin must be a positive share, got {self.margin!r}"
            raise ValueError(msg)
        if self.window_steps < 1:
            msg = f"straggler window_steps must be at least 1, got {self.window_steps!r}"
            raise ValueError(msg)
        if self.min_ranks < 1:
            msg = f"straggler min_ranks must be at least 1, got {self.min_ranks!r}"
            raise ValueError(msg)
        if self.shift is not None and not 0 < self.shift < 1:
            msg = f"straggler shift must be a share between 0 and 1, got {self.shift!r}"
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class StragglerStatus:
    """A rank flagged as a straggler, and its current spell."""

    rank: int
    ratio: float
    """The median, over the rank's window, of its compute time / the step's median."""
    since_step: int
    """Step at which the current straggling spell was first flagged."""
    steps: int
    """Steps observed during this spell, the flagging step included."""


class StragglerDetector:
    """Follows every rank's compute time and flags the ones that stay slow."""

    def __init__(self, config: StragglerConfig | None = None) -> None:
        """Start with no rank known."""
        self.config = cfg = config if config is not None else StragglerConfig()
        self._min_samples = max(1, cfg.window_steps // 2)
        self._flag_above = 1.0 + cfg.margin
        self._clear_below = 1.0 + cfg.margin / 2
        self._fail_slow = FailSlowDetector(cfg.shift) if cfg.shift is not None else None
        self._windows: dict[int, deque[float]] = {}
        self._ratios: dict[int, float] = {}
        self._flagged: dict[int, StragglerStatus] = {}
        self._by_margin: set[int] = set()

    def observe(self, step: int, times: Mapping[int, float]) -> None:
        """One finished step: rank -> compute time in seconds (a rank may be missing)."""
        window_steps = self.config.window_steps
        valid = {r: t for r, t in times.items() if t > 0 and math.isfinite(t)}
        if len(valid) < self.config.min_ranks:
            if len(self._windows) < self.config.min_ranks:  # too few ranks left to judge any
                self._unflag_all()
            return  # too few ranks this step to know what normal was
        step_median = median(valid.values())
        for rank, seconds in valid.items():
            window = self._windows.get(rank)
            if window is None:
                window = self._windows[rank] = deque(maxlen=window_steps)
            window.append(seconds / step_median)
        if self._fail_slow is not None:
            self._fail_slow.observe(valid)
        self._ratios = {
            rank: median(window)
            for rank, window in self._windows.items()
            if len(window) >= self._min_samples
        }
        if len(self._ratios) < self.config.min_ranks:
            self._unflag_all()
            return
        self._judge(step)

    def _unflag_all(self) -> None:
        """No median worth comparing against: nobody is judged, flagged or under suspicion."""
        self._ratios.clear()
        self._flagged.clear()
        self._by_margin.clear()
        if self._fail_slow is not None:
            self._fail_slow.clear()

    def _judge(self, step: int) -> None:
        """Flag ranks either rule names; clear those neither holds any more."""
        flagged, by_margin, fail_slow = self._flagged, self._by_margin, self._fail_slow
        for rank, ratio in self._ratios.items():
            held = rank in by_margin  # the margin rule, with its hysteresis
            margin = ratio >= self._clear_below if held else ratio > self._flag_above
            if margin != held:
                (by_margin.add if margin else by_margin.discard)(rank)
            shift = fail_slow is not None and fail_slow.holds(rank, ratio, len(self._windows[rank]))
            status = flagged.get(rank)
            if margin or shift:
                flagged[rank] = (
                    StragglerStatus(rank, ratio, step, 1)
                    if status is None
                    else StragglerStatus(rank, ratio, status.since_step, status.steps + 1)
                )
            elif status is not None:
                del flagged[rank]

    @property
    def stragglers(self) -> dict[int, StragglerStatus]:
        """The ranks flagged now, by rank."""
        return dict(self._flagged)

    def ratio(self, rank: int) -> float | None:
        """The rank's ratio to the job median at the last step; None when it was not judged."""
        return self._ratios.get(rank)

    def ratios(self) -> dict[int, float]:
        """Every judged rank's ratio to the job median at the last step."""
        return dict(self._ratios)

    def forget(self, rank: int) -> None:
        """Drop everything known about a rank (it left the job)."""
        self._windows.pop(rank, None)
        self._ratios.pop(rank, None)
        self._flagged.pop(rank, None)
        self._by_margin.discard(rank)
        if self._fail_slow is not None:
            self._fail_slow.forget(rank)
