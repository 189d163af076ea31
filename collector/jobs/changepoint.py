"""Change-point detection of sustained drops in a job's throughput.

Method: a one-sided lower CUSUM on log(value), with a robust level and noise scale, a robust
onset estimate and a confirmation step. Steps are expected to increase; non-finite and
non-positive values are ignored.

* Warm-up: the first ``warmup_steps`` valid values only fill the level window.
* Level: the median of the last ``max(warmup_steps, 100)`` log values judged normal. Values the
  CUSUM holds under suspicion (those since it last stood at 0) join the window only once it is
  back at 0, so a drop in progress does not drag the level down. Rises just raise the level.
* Noise: sigma is the MAD of successive differences of the level window x 1.4826 / sqrt(2),
  floored at 0.005 (0.5 %) so a flat series still works; differences ignore slow trends.
* CUSUM: ``S = max(0, S + min(z, k + h/m) - k)``, ``z = (level - x) / sigma``,
  ``k = max(0.5, delta/2)`` with ``delta`` the ``min_drop`` in sigma units, ``h`` the threshold
  and ``m = ceil(confirm_steps / 2)``. The clip bounds what one bad step adds, so a dip of up to
  ``m`` steps cannot cross ``h`` on its own and S forgets it within a few steps.
* Onset: the split of the suspect values into "old level" then "a new level" (their median)
  with the least absolute deviation; the earliest of equal splits.
* Alarm: ``S > h``, at least ``confirm_steps`` values from the onset, their median below
  ``level + log(1 - min_drop)`` (so a shift under ``min_drop``, or a dip shorter than half of
  ``confirm_steps`` such as a checkpoint step, is no drop), and that median at least 5 standard
  errors (``sqrt(pi/2) sigma / sqrt(n)``) under the level, which keeps noisy series quiet.
  A suspicion that lasts ``4 x confirm_steps`` values without an alarm is dropped (S = 0) and
  its values join the level window, so a small shift becomes the new level.
* While a drop is active, ``current`` is the median of the values since the onset. The drop ends,
  baseline unchanged, when the median of the last 10 values is back within ``min_drop / 2`` of
  the baseline; once ``accept_after_steps`` steps past the onset it ends and its level becomes
  the new baseline.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from itertools import islice, pairwise
from statistics import median
from typing import Final

_LEVEL_WINDOW: Final = 100
_RECOVERY_WINDOW: Final = 10
_SIGMA_FLOOR: Final = 0.005
_MAD_TO_SIGMA: Final = 1.4826 / math.sqrt(2.0)
_K_FLOOR: Final = 0.5
_SUSPICION_SPAN: Final = 4
_SIGNIFICANT: Final = 5.0
_MEDIAN_SE: Final = math.sqrt(math.pi / 2)
_MIN_FOR_SCALE: Final = 3


@dataclass(frozen=True, slots=True)
class DropConfig:
    """What counts as a throughput drop, and how sure the detector must be."""

    min_drop: float = 0.05
    """Smallest sustained drop (share of throughput) worth reporting."""
    threshold: float = 6.0
    """CUSUM decision threshold, in units of the series' own noise."""
    warmup_steps: int = 30
    """Steps needed to learn the level and its noise first."""
    accept_after_steps: int = 500
    """A drop that lasts this long becomes the new normal."""
    confirm_steps: int = 9
    """Values from the onset needed to confirm a drop; a dip half as long is not one."""

    def __post_init__(self) -> None:
        """Refuse options that cannot work."""
        if not 0 < self.min_drop < 1:
            msg = f"min_drop must be a share between 0 and 1, got {self.min_drop!r}"
            raise ValueError(msg)
        if not (self.threshold > 0 and math.isfinite(self.threshold)):
            msg = f"threshold must be positive, got {self.threshold!r}"
            raise ValueError(msg)
        if self.warmup_steps < _MIN_FOR_SCALE:
            msg = f"warmup_steps must be at least {_MIN_FOR_SCALE}, got {self.warmup_steps!r}"
            raise ValueError(msg)
        if self.accept_after_steps < 1:
            msg = f"accept_after_steps must be at least 1, got {self.accept_after_steps!r}"
            raise ValueError(msg)
        if self.confirm_steps < 1:
            msg = f"confirm_steps must be at least 1, got {self.confirm_steps!r}"
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class Drop:
    """A sustained drop in throughput."""

    onset_step: int
    """Estimated first step of the lower level."""
    detected_step: int
    baseline: float
    """Level before the drop, in the unit of the values (e.g. tokens/s)."""
    current: float
    """Level since the onset: the median of the values since then."""

    @property
    def share(self) -> float:
        """How much of the baseline is lost: 1 - current / baseline."""
        return 1.0 - self.current / self.baseline


class DropDetector:
    """Watches one job's throughput, one value per step, for sustained drops."""

    def __init__(self, config: DropConfig | None = None) -> None:
        """Start with nothing learned."""
        self.config = config if config is not None else DropConfig()
        self.drops = 0
        """How many drops were detected so far."""
        cfg = self.config
        self._level: deque[float] = deque(maxlen=max(cfg.warmup_steps, _LEVEL_WINDOW))
        self._seen = 0
        self._cusum = 0.0
        self._suspect: list[tuple[int, float]] = []
        self._max_push = cfg.threshold / math.ceil(cfg.confirm_steps / 2)
        self._log_min_drop = math.log1p(-cfg.min_drop)
        self._log_recovered = math.log1p(-cfg.min_drop / 2)
        self._active: Drop | None = None
        self._baseline_log = 0.0
        self._since_onset: deque[float] = deque(
            maxlen=max(cfg.accept_after_steps, _RECOVERY_WINDOW, cfg.confirm_steps)
        )

    @property
    def active(self) -> Drop | None:
        """The drop in progress; None when there is none."""
        return self._active

    @property
    def baseline(self) -> float | None:
        """The normal level (before the active drop, if any); None during warm-up."""
        if self._active is not None:
            return self._active.baseline
        if self._seen < self.config.warmup_steps:
            return None
        return math.exp(median(self._level))

    def observe(self, step: int, value: float) -> None:
        """The job's throughput at one finished step."""
        if not (value > 0 and math.isfinite(value)):
            return
        x = math.log(value)
        self._seen += 1
        if self._active is not None:
            self._follow(step, x, self._active)
        elif self._seen <= self.config.warmup_steps:
            self._level.append(x)
        else:
            self._watch(step, x)

    def _sigma(self) -> float:
        """Robust per-step noise of the level window, in log units."""
        level = self._level
        if len(level) < _MIN_FOR_SCALE:
            return _SIGMA_FLOOR
        diffs = [b - a for a, b in pairwise(level)]
        centre = median(diffs)
        mad = median(abs(d - centre) for d in diffs)
        return max(_SIGMA_FLOOR, mad * _MAD_TO_SIGMA)

    def _watch(self, step: int, x: float) -> None:
        """CUSUM step while no drop is active."""
        cfg = self.config
        mu0 = median(self._level)
        sigma = self._sigma()
        k = max(_K_FLOOR, -self._log_min_drop / sigma / 2)
        z = min((mu0 - x) / sigma, k + self._max_push)
        self._cusum = max(0.0, self._cusum + z - k)
        if self._cusum == 0.0:
            self._clear_suspicion()
            self._level.append(x)
            return
        self._suspect.append((step, x))
        if self._cusum > cfg.threshold and len(self._suspect) >= cfg.confirm_steps:
            onset = _onset(mu0, [v for _, v in self._suspect])
            after = [v for _, v in self._suspect[onset:]]
            held = median(after)
            if (
                len(after) >= cfg.confirm_steps
                and held < mu0 + self._log_min_drop
                and mu0 - held > _SIGNIFICANT * _MEDIAN_SE * sigma / math.sqrt(len(after))
            ):
                self._start(step, onset, mu0, held)
                return
        if len(self._suspect) >= _SUSPICION_SPAN * cfg.confirm_steps:
            self._clear_suspicion()

    def _clear_suspicion(self) -> None:
        """Reset the CUSUM; the values it held were normal after all."""
        self._level.extend(v for _, v in self._suspect)
        self._suspect.clear()
        self._cusum = 0.0

    def _start(self, step: int, onset: int, mu0: float, held: float) -> None:
        """Report a drop whose first value is the suspect at index ``onset``."""
        self.drops += 1
        self._baseline_log = mu0
        self._since_onset.clear()
        self._since_onset.extend(v for _, v in self._suspect[onset:])
        self._active = Drop(
            onset_step=self._suspect[onset][0],
            detected_step=step,
            baseline=math.exp(mu0),
            current=math.exp(held),
        )
        self._suspect.clear()
        self._cusum = 0.0

    def _follow(self, step: int, x: float, active: Drop) -> None:
        """Track the active drop until it recovers or becomes the new normal."""
        since = self._since_onset
        since.append(x)
        recent = list(islice(reversed(since), _RECOVERY_WINDOW))
        if median(recent) >= self._baseline_log + self._log_recovered:
            self._active = None
            return
        if step - active.onset_step >= self.config.accept_after_steps:
            self._level.clear()
            self._level.extend(since)
            self._active = None
            return
        self._active = replace(active, current=math.exp(median(since)))


def _onset(mu0: float, values: list[float]) -> int:
    """Index where ``values`` best split into the old level ``mu0`` and a new level after it.

    The fit is least absolute deviations: the old level before the split, the median of the
    values from the split on after it. The earliest of equally good splits wins.
    """
    best, best_cost = 0, math.inf
    before = 0.0
    for i in range(len(values)):
        tail = values[i:]
        centre = median(tail)
        cost = before + sum(abs(v - centre) for v in tail)
        if cost < best_cost:
            best, best_cost = i, cost
        before += abs(values[i] - mu0)
    return best
