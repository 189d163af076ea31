"""Durations as rule files write them: ``90s``, ``5m``, ``1h30m``, ``7d``, or plain seconds."""

from __future__ import annotations

import math
import re
from typing import Final

from fleetwatch.config_file import short_repr

_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_SECONDS: Final = 366 * 86400.0


def parse_duration(value: object) -> float:
    """Seconds in ``value``; raise ValueError saying what a duration looks like."""
    shown = short_repr(value)
    if isinstance(value, bool):
        msg = f"{shown} is not a duration"
        raise ValueError(msg)  # noqa: TRY004 - callers catch ValueError for every bad duration
    if isinstance(value, int) and abs(value) > MAX_SECONDS:
        seconds = math.inf  # too large for a float, and out of range anyway
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        pos, seconds = 0, 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match[1]) * _SECONDS[match[2]]
            pos = match.end()
        if pos != len(text):
            msg = f"{shown} is not a duration (write e.g. 30s, 5m, 1h30m, 7d)"
            raise ValueError(msg)
    else:
        msg = f"{shown} is not a duration (write e.g. 30s, 5m, 1h30m, 7d)"
        raise ValueError(msg)
    if not 0 <= seconds <= MAX_SECONDS:
        msg = f"duration {shown} is out of range (0 to 366 days)"
        raise ValueError(msg)
    return seconds
