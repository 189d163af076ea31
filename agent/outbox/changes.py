"""The newest value of every sample, and which of them changed since the sender last looked.

The poll loop writes; the link's sender reads. A new stream starts with everything (the
collector must get a full picture after every reconnect); after that only the samples whose
value changed travel, so a quiet node costs heartbeats only.

Gauges that move at every poll of a busy GPU (its temperature, power, utilisation and SM
clock: :data:`PACED_GAUGES`) travel at most once every ``gauge_interval`` seconds per series,
with their newest value; every other change travels at the next report. A state the rules act
on at once (a link down, a throttle flag, an error counter) is never held back.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Final

import structlog

from fleetwatch.wire.validate import MAX_TEXT

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from fleetwatch.model import SampleKey, SampleValue

_ABSENT: Final = object()
# Signals whose every small move need not travel at once: nothing acts on them within seconds
# (the rules that read the temperature hold for a minute or more and pace it themselves; the job
# diagnosis looks at windows of steps), and on a busy GPU each changes at every poll.
PACED_GAUGES: Final = frozenset(
    {
        "temperature_celsius",
        "power_watts",
        "utilization_gpu_percent",
        "utilization_memory_percent",
        "sm_clock_mhz",
        "agent_cpu_seconds",
        "agent_rss_bytes",
    }
)
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

    __slots__ = ("_dirty", "_gauge_s", "_monotonic", "_sent", "changed", "refused", "values")

    def __init__(
        self, gauge_interval: float = 0.0, monotonic: Callable[[], float] | None = None
    ) -> None:
        """Start empty; ``changed`` is set whenever an update changed something.

        ``gauge_interval``: a series of :data:`PACED_GAUGES` travels at most this often (0:
        at every change), timed by ``monotonic`` (the agent's clock).
        """
        self.values: dict[SampleKey, SampleValue] = {}
        self._dirty: set[SampleKey] = set()
        self.changed = asyncio.Event()
        self.refused = 0  # values the collector would refuse (NaN, inf, overlong text)
        self._gauge_s = gauge_interval if monotonic is not None else 0.0
        self._monotonic = monotonic
        self._sent: dict[SampleKey, float] = {}  # when each paced gauge last travelled

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
        if self._monotonic is not None and self._gauge_s > 0:
            now = self._monotonic()
            self._sent = {key: now for key in self.values if key[1] in PACED_GAUGES}
        return list(self.values.items())

    def take_changes(self) -> list[tuple[SampleKey, SampleValue]]:
        """The samples changed since the last take, with their newest values.

        A paced gauge that travelled less than ``gauge_interval`` ago stays pending, with its
        newest value, until :meth:`next_due`.
        """
        values = self.values
        if self._monotonic is None or self._gauge_s <= 0:
            changes = [(key, values[key]) for key in self._dirty]
            self._dirty.clear()
            return changes
        now, pace, sent = self._monotonic(), self._gauge_s, self._sent
        changes = []
        held: set[SampleKey] = set()
        for key in self._dirty:
            if key[1] in PACED_GAUGES:
                if now - sent.get(key, -math.inf) < pace:
                    held.add(key)
                    continue
                sent[key] = now
            changes.append((key, values[key]))
        self._dirty = held
        return changes

    def next_due(self) -> float | None:
        """When the first held gauge may travel (the agent's monotonic time), or None."""
        if not self._dirty or self._monotonic is None or self._gauge_s <= 0:
            return None
        sent = self._sent
        return min(sent.get(key, -math.inf) for key in self._dirty) + self._gauge_s
