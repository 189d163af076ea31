"""The incident state machine: inactive → pending → firing → resolved, per rule and target.

Pure: the caller evaluates conditions and passes the time; the engine never reads a clock or
does I/O. What it returns (transitions, with the actions a firing asks for) is what the caller
journals and acts on.

* A condition that starts holding makes a *pending* incident; once it has held for the rule's
  ``for``, the incident *fires* (at once when ``for`` is 0).
* A pending incident whose condition stops holding is dropped (nothing happened).
* A firing incident whose condition stops holding *resolves* once it has not held for the rule's
  ``keep_firing_for``; holding again in between keeps it firing (anti-flap).
* Escalation: the rule's escalation actions replace its own from the ``after``-th occurrence of
  the fault on the same target within the escalation window. Each firing is an occurrence; so,
  for a rule whose escalation names ``occurrences`` (a number that grows each time the fault
  happens again), is each growth of that number while the incident fires: a fault that recurs
  while ``keep_firing_for`` (or a long window) keeps the incident firing still counts, and may
  escalate the firing incident (a *recurrence* transition that carries the escalation actions).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rules.model import ActionSpec, Rule, RuleSet


class Phase(StrEnum):
    """Where an incident is in its life."""

    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"
    DROPPED = "dropped"  # pending, then the condition cleared before ``for`` elapsed


@dataclass(frozen=True, slots=True)
class Incident:
    """One rule holding for one target (``target`` is a printable key, e.g. ``node-01/gpu/3``)."""

    id: str
    rule: str
    node: str
    target: str
    phase: Phase
    started_at: float
    evidence: str = ""
    fired_at: float | None = None
    clearing_since: float | None = None
    resolved_at: float | None = None
    escalated: bool = False
    firings: int = 0  # occurrences within the escalation window: firings and recurrences


@dataclass(frozen=True, slots=True)
class Transition:
    """An incident changed phase, or recurred while firing.

    ``actions`` are what a firing asks for, or what a recurrence that escalates the firing
    incident asks for (``recurred``: the escalation actions; none for a recurrence that does not
    escalate, which only updates the incident's count).
    """

    incident: Incident
    actions: tuple[ActionSpec, ...] = ()
    recurred: bool = False


class Engine:
    """Incidents of a rule set, keyed by (rule, target)."""

    def __init__(self, rules: RuleSet) -> None:
        """Start with no incidents."""
        self._rules = {rule.name: rule for rule in rules.rules}
        self._open: dict[tuple[str, str], Incident] = {}
        self._firings: dict[tuple[str, str], deque[float]] = {}
        # The last ``occurrences`` value seen of each open incident whose rule counts them.
        self._seen: dict[tuple[str, str], float] = {}
        self.recurrences: Counter[str] = Counter()  # by rule: occurrences while firing

    @property
    def rules(self) -> dict[str, Rule]:
        """The rules, by name."""
        return self._rules

    def open_incidents(self) -> list[Incident]:
        """Pending and firing incidents."""
        return list(self._open.values())

    def get(self, rule: str, target: str) -> Incident | None:
        """The open incident of ``rule`` on ``target``, if any."""
        return self._open.get((rule, target))

    def restore(self, incident: Incident) -> None:
        """Take back an open incident from the journal (after a collector restart)."""
        if incident.phase in (Phase.PENDING, Phase.FIRING):
            self._open[incident.rule, incident.target] = incident
            if incident.fired_at is not None:
                self._firings.setdefault((incident.rule, incident.target), deque()).append(
                    incident.fired_at,
                )

    def observe(  # noqa: PLR0913 - one observation, fully described
        self,
        rule_name: str,
        node: str,
        target: str,
        *,
        holds: bool,
        now: float,
        evidence: str = "",
        occurrences: float | None = None,
    ) -> list[Transition]:
        """Feed one evaluation of ``rule_name`` on ``target``; return what changed.

        ``occurrences`` is the value of the rule's ``escalate.occurrences`` on the target now
        (None: the rule has none, or it gave no number): the value when the incident fires is
        its base, and each evaluation that finds it higher while the incident fires counts one
        more occurrence.
        """
        rule = self._rules[rule_name]
        key = (rule_name, target)
        incident = self._open.get(key)
        if incident is None:
            if not holds:
                return []
            started = self._start(rule, key, node, now, evidence)
            self._base(key, started, occurrences)
            return started
        if incident.phase == Phase.PENDING:
            moved = self._pending(rule, key, incident, holds=holds, now=now, evidence=evidence)
            self._base(key, moved, occurrences)
            return moved
        recurred = self._recur(rule, key, incident, occurrences, now)
        incident = self._open[key]
        return recurred + self._firing(rule, key, incident, holds=holds, now=now, evidence=evidence)

    def _base(self, key: tuple[str, str], moved: list[Transition], value: float | None) -> None:
        """Remember ``value`` as the occurrences base of an incident that just fired."""
        if value is not None and any(t.incident.phase == Phase.FIRING for t in moved):
            self._seen[key] = value

    def _recur(
        self,
        rule: Rule,
        key: tuple[str, str],
        incident: Incident,
        value: float | None,
        now: float,
    ) -> list[Transition]:
        """A firing incident whose occurrences grew: count one more, escalate at ``after``."""
        esc = rule.escalation
        if value is None or esc is None:
            return []
        last = self._seen.get(key)
        self._seen[key] = value
        if last is None or value <= last:
            return []  # no base yet (a restart), the same count, or a counter that was reset
        self.recurrences[rule.name] += 1
        firings = self._firings.setdefault(key, deque())
        firings.append(now)
        while firings and now - firings[0] > esc.within_s:
            firings.popleft()
        escalates = not incident.escalated and len(firings) >= esc.after
        recurred = replace(
            incident, firings=len(firings), escalated=incident.escalated or escalates
        )
        self._open[key] = recurred
        return [Transition(recurred, esc.actions if escalates else (), recurred=True)]

    def _start(
        self,
        rule: Rule,
        key: tuple[str, str],
        node: str,
        now: float,
        evidence: str,
    ) -> list[Transition]:
        incident = Incident(
            id=f"{rule.name}:{key[1]}:{int(now * 1000)}",
            rule=rule.name,
            node=node,
            target=key[1],
            phase=Phase.PENDING,
            started_at=now,
            evidence=evidence,
        )
        self._open[key] = incident
        if rule.for_s > 0:
            return [Transition(incident)]
        return [Transition(incident), self._fire(rule, key, incident, now)]

    def _pending(  # noqa: PLR0913 - the observation, passed through
        self,
        rule: Rule,
        key: tuple[str, str],
        incident: Incident,
        *,
        holds: bool,
        now: float,
        evidence: str,
    ) -> list[Transition]:
        if not holds:
            del self._open[key]
            return [Transition(replace(incident, phase=Phase.DROPPED, resolved_at=now))]
        incident = replace(incident, evidence=evidence or incident.evidence)
        self._open[key] = incident
        if now - incident.started_at >= rule.for_s:
            return [self._fire(rule, key, incident, now)]
        return []

    def _firing(  # noqa: PLR0913 - the observation, passed through
        self,
        rule: Rule,
        key: tuple[str, str],
        incident: Incident,
        *,
        holds: bool,
        now: float,
        evidence: str,
    ) -> list[Transition]:
        if holds:
            if incident.clearing_since is not None or evidence != incident.evidence:
                self._open[key] = replace(
                    incident,
                    clearing_since=None,
                    evidence=evidence or incident.evidence,
                )
            return []
        clearing = incident.clearing_since if incident.clearing_since is not None else now
        if now - clearing >= rule.keep_firing_for_s:
            del self._open[key]
            self._seen.pop(key, None)
            return [Transition(replace(incident, phase=Phase.RESOLVED, resolved_at=now))]
        if incident.clearing_since is None:
            self._open[key] = replace(incident, clearing_since=now)
        return []

    def _fire(self, rule: Rule, key: tuple[str, str], incident: Incident, now: float) -> Transition:
        firings = self._firings.setdefault(key, deque())
        firings.append(now)
        esc = rule.escalation
        window = esc.within_s if esc is not None else 0.0
        while firings and now - firings[0] > window:
            firings.popleft()
        if esc is None:
            firings.clear()
            firings.append(now)
        escalated = esc is not None and len(firings) >= esc.after
        fired = replace(
            incident,
            phase=Phase.FIRING,
            fired_at=now,
            escalated=escalated,
            firings=len(firings),
        )
        self._open[key] = fired
        actions = esc.actions if escalated and esc is not None else rule.actions
        return Transition(fired, actions)
