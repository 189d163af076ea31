"""Figures from samples: the nearest-rank percentile, and a percentile in ms for a JSON line."""

from __future__ import annotations

import math


def percentile(values: list[float], share: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(len(ordered) * share)) - 1]


def figure(values: list[float], share: float | None) -> float | None:
    """A percentile (None: the maximum) in ms, rounded; None when it lands on a missing one."""
    if not values:
        return None
    value = max(values) if share is None else percentile(values, share)
    if value is None or math.isinf(value):
        return None
    return round(value, 1)
