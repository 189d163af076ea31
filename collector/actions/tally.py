"""Actions counted by outcome, for ``/metrics``: how many, and when the last one was.

Written on the event loop by the dispatcher, read by the scrape thread (dict copies are atomic
under the GIL). Only outcomes count (succeeded, failed, skipped, dry_run, shadow, refused); an
action held back to wait is counted by ``fleetwatch_actions_deferred_total`` and counts here once
it ends.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Final

from collector.model.target_keys import FLEET_KEY

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetwatch.clock import Clock

UNFINISHED: Final = frozenset({"planned", "running", "deferred"})
Key = tuple[str, str, str]  # (action, outcome, node)


def metric_node(node: str) -> str:
    """The ``node`` label of something an incident is about: empty for fleet and job targets."""
    return "" if node == FLEET_KEY or node.startswith("job/") else node


class ActionTally:
    """Counts and last times of actions by (action, outcome, node)."""

    def __init__(self, clock: Clock) -> None:
        """Start empty; ``clock.now()`` stamps each outcome."""
        self._clock = clock
        self._counts: Counter[Key] = Counter()
        self._last: dict[Key, float] = {}
        # Told of each outcome as (action, outcome, node): the reliability counts the rules read.
        self.listeners: list[Callable[[str, str, str], None]] = []

    def record(self, action: str, outcome: str, node: str) -> None:
        """Count an action that ended in ``outcome`` (unfinished states are ignored)."""
        if outcome in UNFINISHED:
            return
        key = (action, outcome, metric_node(node))
        self._counts[key] += 1
        self._last[key] = self._clock.now()
        for told in self.listeners:
            told(action, outcome, node)

    def snapshot(self) -> list[tuple[Key, int, float]]:
        """Every (key, count, last unix time), sorted by key."""
        counts, last = dict(self._counts), dict(self._last)
        return [(key, counts[key], last.get(key, 0.0)) for key in sorted(counts)]
