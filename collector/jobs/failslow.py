"""Fail-slow detection: a CUSUM on each rank's compute time relative to its job's median.

A rank that turns a few percent slower than its peers (a throttling GPU, a failing fan, a
degraded PCIe link) stays inside a margin meant for large slowdowns, yet it holds back every
rank of a synchronous job. This module weighs each step's evidence instead of waiting for a
window's median to cross a wide margin.

Method, per finished step, on each rank's ``x = log(compute time / its peers' median)`` (the
median of the other ranks' compute times of that step):

* Noise: each step's median, over ranks, of ``|x - the rank's previous x|``; the
  job's ``sigma`` is the median of these over its last ``_NOISE_STEPS`` steps x 1.4826 /
  sqrt(2), floored at ``_SIGMA_FLOOR`` (0.5 %) so a flat series still works. Differences see a
  rank's own step-to-step noise whatever the number of ranks (a spread across 3 or 8 ranks
  would understate it), and a lasting shift or a pause moves only one or two of them. Ranks
  slowed alike (a new workload phase, a congested fabric) move the step's median, not ``x``,
  so they neither raise evidence nor widen the noise.
* CUSUM per rank: ``S = min(2h, max(0, S + min(z, k + h/m) - k))`` with ``z = x / sigma``,
  ``k = max(0.5, delta / 2 / sigma)``, ``delta = log(1 + shift)``, ``h = _THRESHOLD`` and
  ``m = _BURST``. The clip bounds what one step adds, so a burst shorter than ``m`` steps (a
  pause, a checkpoint) cannot cross ``h`` on its own; the cap ``2h`` lets a rank that recovers
  be forgotten within a few steps.
* Named: ``S > h`` and the rank's window median ratio (what the straggler detector reports)
  above ``1 + shift / 2`` and at least ``_SIGNIFICANT`` standard errors of a median
  (``sqrt(pi/2) sigma / sqrt(n)``) above 1. So a rank whose window median stays under
  ``1 + shift / 2`` is never named, and in a noisy job a shift must be larger to be named.
* Held until the window median falls below ``1 + shift / 4``; then the CUSUM starts over.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

_NOISE_STEPS: Final = 100
_SIGMA_FLOOR: Final = 0.005
_MAD_TO_SIGMA: Final = 1.4826 / math.sqrt(2.0)
_K_FLOOR: Final = 0.5
_THRESHOLD: Final = 8.0
_BURST: Final = 5
_CAP: Final = 2.0 * _THRESHOLD
_SIGNIFICANT: Final = 5.0
_MEDIAN_SE: Final = math.sqrt(math.pi / 2)
_MIN_RANKS: Final = 2  # a rank and a peer


class FailSlowDetector:
    """One job's per-rank CUSUMs of compute time over its peers' median, and the job's noise."""

    def __init__(self, shift: float) -> None:
        """Watch for sustained shifts of ``shift`` (a share, e.g. 0.05) above the median."""
        if not 0 < shift < 1:
            msg = f"fail-slow shift must be a share between 0 and 1, got {shift!r}"
            raise ValueError(msg)
        self.shift = shift
        self._delta = math.log1p(shift)
        self._name_above = math.log1p(shift / 2)
        self._clear_below = 1.0 + shift / 4  # a ratio
        self._spreads: deque[float] = deque(maxlen=_NOISE_STEPS)
        self._sigma = _SIGMA_FLOOR
        self._last: dict[int, float] = {}
        self._cusum: dict[int, float] = {}
        self._named: set[int] = set()

    @property
    def sigma(self) -> float:
        """The job's per-step noise of log ratios, as of the last step (the floor before any)."""
        return self._sigma

    def observe(self, times: Mapping[int, float]) -> None:
        """One finished step: rank -> compute time in seconds (positive and finite)."""
        logs = over_peers(times)
        last = self._last
        moves = [abs(x - last[rank]) for rank, x in logs.items() if rank in last]
        if moves:
            self._spreads.append(median(moves))
            self._sigma = max(_SIGMA_FLOOR, _MAD_TO_SIGMA * median(self._spreads))
        last.update(logs)
        sigma = self._sigma
        k = max(_K_FLOOR, self._delta / 2.0 / sigma)
        most = k + _THRESHOLD / _BURST
        cusum = self._cusum
        for rank, x in logs.items():
            pushed = cusum.get(rank, 0.0) + min(x / sigma, most) - k
            cusum[rank] = min(_CAP, max(0.0, pushed))

    def evidence(self, rank: int) -> float:
        """The rank's CUSUM, in units of the job's noise (0: nothing against it)."""
        return self._cusum.get(rank, 0.0)

    def holds(self, rank: int, ratio: float, samples: int) -> bool:
        """Whether the rank is named, given its window median ``ratio`` over ``samples`` steps."""
        if rank in self._named:
            if ratio >= self._clear_below:
                return True
            self.reset(rank)
            return False
        if self._cusum.get(rank, 0.0) <= _THRESHOLD:
            return False
        bar = max(self._name_above, _SIGNIFICANT * _MEDIAN_SE * self._sigma / math.sqrt(samples))
        if math.log(ratio) > bar:
            self._named.add(rank)
            return True
        return False

    def reset(self, rank: int) -> None:
        """Forget the rank's evidence and name (it recovered)."""
        self._cusum.pop(rank, None)
        self._named.discard(rank)

    def forget(self, rank: int) -> None:
        """Drop everything known about a rank (it left the job)."""
        self.reset(rank)
        self._last.pop(rank, None)

    def clear(self) -> None:
        """Forget every rank's evidence and name (too few ranks left to compare)."""
        self._cusum.clear()
        self._named.clear()


def over_peers(times: Mapping[int, float]) -> dict[int, float]:
    """Rank -> log(its time / the median of the other ranks' times); {} without a peer."""
    n = len(times)
    if n < _MIN_RANKS:
        return {}
    ordered = sorted(times.values())
    half = n // 2
    if n % 2 == 0:  # an odd count of peers: the middle one of those left
        low, high = ordered[half - 1], ordered[half]
        return {r: math.log(t / (high if t <= low else low)) for r, t in times.items()}
    # an even count of peers: the mean of the two middle ones of those left
    centre = ordered[half]
    without_low = (centre + ordered[half + 1]) / 2  # a rank under the median left
    without_high = (ordered[half - 1] + centre) / 2  # a rank over it left
    without_centre = (ordered[half - 1] + ordered[half + 1]) / 2
    return {
        r: math.log(
            t / (without_low if t < centre else without_high if t > centre else without_centre)
        )
        for r, t in times.items()
    }
