"""Each node's recent remediations and incident episodes, kept in memory for the rules.

A lemon is a node that needs fixing again and again. The rules read it as three ``node`` fields
(:data:`NO_FAULTS` names them): ``remediations_7d`` (remediations that succeeded in the last 7
days: drains, GPU resets, reboots, RMA tickets, escalated ones too), ``incidents_7d`` (incident
episodes that began in them) and ``seen_by_person`` (a person moved the node through its
lifecycle, released, repaired, in repair or RMA, after its newest remediation and episode).

The counts are taken from the journal once, at start (:meth:`RecentFaults.load`), then kept up to
date by the dispatcher's action outcomes (:meth:`RecentFaults.action`) and the lifecycle's moves
(:meth:`RecentFaults.moved`), both on the event loop: a rule's evaluation reads memory, never the
journal. Whoever is in :attr:`RecentFaults.changed` is told of a node whose counts moved (the
evaluator looks at it at its next tick); a count that ages out is seen by the regular sweep.

The same moves feed the fleet's histograms of time to repair and between incidents
(:class:`~collector.model.reliability.Buckets`), observed as repairs end and episodes begin, so
Prometheus sees each once (loading the journal observes nothing).
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_left
from collections import deque
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from collector.model.reliability import (
    LEMON_WINDOW_S,
    Buckets,
    MoveRow,
    is_episode,
    leaves_service,
    remediation_kind,
    returns_to_service,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from fleetwatch.clock import Clock

__all__ = ["NO_FAULTS", "PERSON", "RecentFaults", "counts_note", "counts_words", "reads_counts"]

PERSON: Final = "person:"  # the actor of a move a person made
# The fields of a node with nothing recent (read-only: every such node shares it).
NO_FAULTS: Final[Mapping[str, Any]] = MappingProxyType(
    {"remediations_7d": 0, "incidents_7d": 0, "seen_by_person": False}
)

# A condition that reads one of the counts is a lemon rule's (its incident marks a lemon).
_READS_COUNTS: Final = re.compile(r"\bnode\s*\.\s*(?:remediations_7d|incidents_7d)\b")


@functools.cache  # a scrape asks it of every firing incident's rule: a few conditions in all
def reads_counts(condition: str) -> bool:
    """Whether a rule condition reads ``node.remediations_7d`` or ``node.incidents_7d``."""
    return _READS_COUNTS.search(condition) is not None


def counts_words(fields: Mapping[str, Any]) -> str:
    """The counts in words, for an incident's evidence and a lemon's drain reason.

    ``5 remediations and 2 incident episodes in 7 days``: digits and fixed words only.
    """
    fixed, began = int(fields["remediations_7d"]), int(fields["incidents_7d"])
    remediations = f"{fixed} remediation{'' if fixed == 1 else 's'}"
    episodes = f"{began} incident episode{'' if began == 1 else 's'}"
    return f"{remediations} and {episodes} in 7 days"


# What counts_words gives, and only that: digits and fixed words.
_COUNTS_WORDS: Final = re.compile(
    r"\d{1,9} remediations? and \d{1,9} incident episodes? in 7 days", re.ASCII
)


def counts_note(evidence: str) -> str:
    """A lemon incident's evidence if it is its counts in words (``""`` otherwise).

    What a lemon's drain adds to its reason: the incident's evidence never reaches a reason
    otherwise (it may quote telemetry), but these are the collector's own digits and words.
    """
    return evidence if _COUNTS_WORDS.fullmatch(evidence) else ""


class RecentFaults:
    """Remediations, episodes and people's moves of each node in the last 7 days."""

    def __init__(self, clock: Clock, window_s: float = LEMON_WINDOW_S) -> None:
        """Count over ``window_s`` back from ``clock.now()``; nothing counted yet."""
        self._clock = clock
        self.window_ms = round(window_s * 1000)
        self._remediations: dict[str, deque[int]] = {}  # node -> when each succeeded (ms)
        self._episodes: dict[str, deque[int]] = {}  # node -> when each began (ms)
        self._person: dict[str, int] = {}  # node -> a person's newest move (ms)
        self._left: dict[str, int] = {}  # node out of service -> when it left service (ms)
        self._last_episode: dict[str, int] = {}  # node -> when its newest episode began (ms)
        self.repairs = Buckets()  # time to repair, as repairs end
        self.between = Buckets()  # time between incidents, as episodes begin
        self.changed: list[Callable[[str], None]] = []

    def load(
        self,
        moves: Iterable[MoveRow],
        actions: Iterable[tuple[str, str, int]],
        left: Mapping[str, int] | None = None,
    ) -> None:
        """Take the journal's ``moves`` and ``actions`` back (oldest first), observing nothing.

        ``actions`` are (node, action, when it succeeded); ``left``: when each node out of
        service at the start of ``moves`` had left service.
        """
        self._left.update(left or {})
        for row in moves:
            self._apply(row, observe=False)
        cutoff = self._cutoff()
        for node, action, at_ms in actions:
            if remediation_kind(action) is not None and at_ms >= cutoff:
                self._remediations.setdefault(node, deque()).append(at_ms)
        for node, times in self._remediations.items():
            self._remediations[node] = deque(sorted(times))

    def action(self, action: str, outcome: str, node: str) -> None:
        """An action ended in ``outcome``: a remediation that succeeded counts now.

        An :class:`~collector.actions.tally.ActionTally` listener.
        """
        if outcome != "succeeded" or remediation_kind(action) is None:
            return
        self._remediations.setdefault(node, deque()).append(self._now())
        self._tell(node)

    def moved(self, row: MoveRow) -> None:
        """A lifecycle move was made (a :class:`~collector.model.lifecycle.Lifecycle` hook)."""
        if self._apply(row, observe=True):
            self._tell(row.node)

    def _apply(self, row: MoveRow, *, observe: bool) -> bool:
        """Take one move in; whether the node's rule fields may have changed."""
        node, at = row.node, row.at_ms
        if leaves_service(row):
            self._left[node] = at
        elif returns_to_service(row):
            began = self._left.pop(node, None)
            if observe and began is not None:
                self.repairs.observe((at - began) / 1000)
        if row.actor.startswith(PERSON):
            self._person[node] = max(at, self._person.get(node, at))
            return True
        if not is_episode(row):
            return False
        last = self._last_episode.get(node)
        if observe and last is not None:
            self.between.observe((at - last) / 1000)
        self._last_episode[node] = at
        if at >= self._cutoff():
            self._episodes.setdefault(node, deque()).append(at)
        return True

    def fields(self, node: str) -> Mapping[str, Any]:
        """The node's rule fields now (``node.remediations_7d`` ...); changes nothing.

        Called on the event loop for every node map a tick builds: two lookups for a node with
        nothing recent, two binary searches for one with something.
        """
        remediations = self._remediations.get(node)
        episodes = self._episodes.get(node)
        person = self._person.get(node)
        if remediations is None and episodes is None and person is None:
            return NO_FAULTS
        cutoff = self._cutoff()
        fixed, began = _since(remediations, cutoff), _since(episodes, cutoff)
        newest = max(
            remediations[-1] if remediations and fixed else 0,
            episodes[-1] if episodes and began else 0,
        )
        return {
            "remediations_7d": fixed,
            "incidents_7d": began,
            "seen_by_person": person is not None and person > newest,
        }

    def counts(self) -> dict[str, tuple[int, int]]:
        """(remediations, episodes) in the window of each node with any (any thread).

        Reads copies: the scrape and API threads call it while the event loop counts.
        """
        cutoff = self._cutoff()
        found: dict[str, tuple[int, int]] = {}
        remediations, episodes = dict(self._remediations), dict(self._episodes)
        for node in remediations.keys() | episodes.keys():
            fixed = _since(list(remediations.get(node, ())), cutoff)
            began = _since(list(episodes.get(node, ())), cutoff)
            if fixed or began:
                found[node] = (fixed, began)
        return found

    def prune(self) -> None:
        """Drop what left the window (on the event loop, now and then)."""
        cutoff = self._cutoff()
        for table in (self._remediations, self._episodes):
            for node in list(table):
                times = table[node]
                while times and times[0] < cutoff:
                    times.popleft()
                if not times:
                    del table[node]
        for node in [n for n, at in self._person.items() if at < cutoff]:
            del self._person[node]

    def _now(self) -> int:
        return round(self._clock.now() * 1000)

    def _cutoff(self) -> int:
        return self._now() - self.window_ms

    def _tell(self, node: str) -> None:
        for told in self.changed:
            told(node)


def _since(times: Sequence[int] | None, cutoff: int) -> int:
    """How many of the (sorted) ``times`` are at or after ``cutoff``."""
    return len(times) - bisect_left(times, cutoff) if times else 0
