"""What changed since the last tick: targets marked, signals sampled, paced samples held back.

A signal whose every reading rule holds for a while (``for`` at least PACED_MIN_FOR_S) is paced:
its samples send their target through those rules at most every PACE_S (the first sample of a
pause at the next tick, the ones after it within PACE_S). A busy GPU's temperature changes at
every poll; evaluating its two heat rules at each was most of a 4,096-node collector's rule CPU,
and a rule that must hold 2 minutes decides the same a few seconds on.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

from collector.incidents.rule_reads import MODEL_SIGNALS, rule_words, watched_signals
from collector.model.slots import SLOT_ALSO, SLOT_KEY
from collector.model.target_keys import node_key

if TYPE_CHECKING:
    from collector.model.history import History
    from collector.model.slots import TargetSlot
    from fleetwatch.clock import Clock
    from fleetwatch.model import SampleValue
    from rules.model import Rule, RuleSet

PACE_S: Final = 5.0
PACED_MIN_FOR_S: Final = 60.0


def paced_signals(rules: RuleSet, watched: frozenset[str] | None) -> frozenset[str]:
    """The watched signals every rule reading them holds ``PACED_MIN_FOR_S`` or longer."""
    if watched is None:
        return frozenset()
    readers: dict[str, list[Rule]] = {}
    for rule in rules.rules:
        for word in rule_words(rule) & watched:
            readers.setdefault(word, []).append(rule)
    return frozenset(
        signal
        for signal, rules_of in readers.items()
        if signal not in MODEL_SIGNALS and all(r.for_s >= PACED_MIN_FOR_S for r in rules_of)
    )


class Changes:
    """The targets a tick must look at for what happened since the last one.

    ``dirty``: (node, target key) marked changed, to evaluate with every rule of its scope;
    ``evented``: those of them an event marked; ``touched``: (node, key) sampled, with the
    watched signals that changed there (only the rules reading one of them); ``whole_next``:
    nodes whose inventory changed, to evaluate whole once their first Report is in.
    """

    def __init__(self, *, rules: RuleSet, clock: Clock) -> None:
        """Watch the signals the conditions of ``rules`` read; pace those they read slowly."""
        self.clock = clock
        self.watched = watched_signals(rules)  # None: every signal
        self.paced = paced_signals(rules, self.watched)
        self.dirty: set[tuple[str, str]] = set()
        self.evented: set[tuple[str, str]] = set()
        self.touched: dict[tuple[str, str], set[str]] = {}
        self.whole_next: set[str] = set()
        # (node, key) -> (when its paced signals were last let through, signals held since)
        self._paced_at: dict[tuple[str, str], tuple[float, set[str]]] = {}
        self._pace_queue: deque[tuple[float, tuple[str, str]]] = deque()

    def note_samples(
        self, node: str, noted: list[tuple[TargetSlot, str, SampleValue]], history: History
    ) -> None:
        """Samples that matter were applied: keep windowed values in ``history``, mark targets.

        A node to be evaluated whole (it said Hello: this is its first Report) needs no target
        marked: the mark of the node is enough for an urgent tick to take it up. Marking and
        pacing each of a first Report's 1,500 samples was a third of what it cost.
        """
        now = self.clock.monotonic()
        watched, dirty, touched = self.watched, self.dirty, self.touched
        if node in self.whole_next:
            for slot, signal, value in noted:
                if history.wants(signal) and isinstance(value, int | float):
                    history.add_sample(slot[SLOT_KEY], signal, now, float(value))
            dirty.add((node, node_key(node)))
            return
        paced = self.paced
        for slot, signal, value in noted:
            key = slot[SLOT_KEY]
            if history.wants(signal) and isinstance(value, int | float):
                history.add_sample(key, signal, now, float(value))
            if watched is None or signal in MODEL_SIGNALS:
                dirty.add((node, key))
            elif signal in paced:
                self._pace(node, key, signal, now)
                continue
            elif signal in watched:
                # Only the rules that read it: a busy GPU's temperature changes every poll, and
                # sending its target through every GPU rule for it was most of a fleet's ticks.
                touched.setdefault((node, key), set()).add(signal)
            else:
                continue
            also = slot[SLOT_ALSO]
            if also is not None:  # the GPU's view (nvlinks_down) changed too
                dirty.add((node, also))

    def _pace(self, node: str, key: str, signal: str, now: float) -> None:
        """Hold a paced signal's sample until its target's pace lets it through."""
        target = (node, key)
        held = self._paced_at.get(target)
        if held is None or now - held[0] >= PACE_S:
            # Through at the next tick, and the pause starts now.
            self.touched.setdefault(target, set()).add(signal)
            self._paced_at[target] = (now, set())
            self._pace_queue.append((now, target))
        elif held[0] == now and not held[1]:
            # The same report's other signals of the target go with the first (an NVLink's
            # three counters come together: not one now and two more at the pause's end).
            self.touched.setdefault(target, set()).add(signal)
        else:
            held[1].add(signal)

    def has_changes(self) -> bool:
        """Whether an urgent tick now would evaluate anything.

        That is a target marked or sampled, or a paced pause that may be over.
        """
        if self.dirty or self.touched:
            return True
        queue = self._pace_queue
        return bool(queue) and self.clock.monotonic() - queue[0][0] >= PACE_S

    def take(self, now: float) -> tuple[set[tuple[str, str]], dict[tuple[str, str], set[str]]]:
        """The targets marked changed, and those sampled (with their signals), since the last tick.

        Every tick first lets through the paced samples whose pause is over, urgent ones too:
        released only at regular ticks, every busy GPU's pause came to begin at one, and each
        regular tick at 4,096 nodes evaluated some 11,000 of them at once (140 ms of the loop,
        when the tail of the fault benchmark's faults arrived). A pause begins again at the
        tick that lets it through, so pauses let through together stay together.
        """
        self._release_paced(now)
        wanted = set(self.dirty)
        self.dirty.clear()
        self.evented.clear()
        touched, self.touched = self.touched, {}
        return wanted, touched

    def take_evented(self) -> set[tuple[str, str]]:
        """The targets events marked since the last tick; they stay marked changed too."""
        evented, self.evented = self.evented, set()
        return evented

    def _release_paced(self, now: float) -> None:
        """Let through the held samples whose target's pause is over.

        Pauses end in the order they began (they all last ``PACE_S``): the queue is read from
        its front while they are over; an entry for a pause since begun again is skipped.
        """
        queue, paused = self._pace_queue, self._paced_at
        while queue and now - queue[0][0] >= PACE_S:
            since, target = queue.popleft()
            held = paused.get(target)
            if held is None or held[0] != since:
                continue
            if held[1]:
                self.touched.setdefault(target, set()).update(held[1])
                paused[target] = (now, set())
                queue.append((now, target))
            else:
                del paused[target]  # a quiet target: its next sample goes through at once
