"""The newest value of every sample, and which of them changed since the sender last looked.

The poll loop writes; the link's sender reads. A new stream starts with everything (the
collector must get a full picture after every reconnect); after that only the samples whose
value changed travel, so a quiet node costs heartbeats only.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Final

import structlog

from fleetwatch.wire.validate import MAX_TEXT

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fleetwatch.model import SampleKey, SampleValue

_ABSENT: Final = object()
log = structlog.get_logger("agent.changes")


def refusal(value: SampleValue) -> str | None:
    """Why the collector would refuse this value (then the whole report), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return "not finite"
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return f"text longer than {MAX_TEXT} characters"
    return None


class LiveSamples:
    """Latest values plus the set of keys changed since the last :meth:`take_changes`."""

    __slots__ = ("_dirty", "changed", "refused", "values")

    def __init__(self) -> None:
        """Start empty; ``changed`` is set whenever an update changed something."""
        self.values: dict[SampleKey, SampleValue] = {}
        self._dirty: set[SampleKey] = set()
        self.changed = asyncio.Event()
        self.refused = 0  # values the collector would refuse (NaN, inf, overlong text)

    def update(self, samples: Mapping[SampleKey, SampleValue]) -> int:
        """Merge a poll's samples; return how many changed (and wake the sender if any did).

        A value the collector would refuse (and with it every report after a reconnect, which
        carries every value) is kept out and counted in :attr:`refused`; the signal keeps its
        last good value.
        """
        values, dirty = self.values, self._dirty
        before = len(dirty)
        for key, value in samples.items():
            why = refusal(value)
            if why is not None:
                self.refused += 1
                if self.refused == 1 or self.refused % 1000 == 0:
                    log.warning(
                        "sample_refused",
                        target=key[0].label(),
                        signal=key[1],
                        why=why,
                        count=self.refused,
                    )
                continue
            if values.get(key, _ABSENT) != value:
                values[key] = value
                dirty.add(key)
        if dirty:
            self.changed.set()
        return len(dirty) - before

    def take_all(self) -> list[tuple[SampleKey, SampleValue]]:
        """Every sample (for a new stream); nothing is pending afterwards."""
        self._dirty.clear()
        return list(self.values.items())

    def take_changes(self) -> list[tuple[SampleKey, SampleValue]]:
        """The samples changed since the last take, with their newest values."""
        values = self.values
        changes = [(key, values[key]) for key in self._dirty]
        self._dirty.clear()
        return changes
