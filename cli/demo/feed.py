"""Incidents and actions, printed by the demo as they happen.

:class:`IncidentFeed` sits in front of the collector's dispatcher as the incident service's
action sink: the dispatcher acts first, then the feed writes a line for the incident with what
its actions came to. :meth:`IncidentFeed.poll` adds what changed later, outside a firing (a drain
that waited for room, then ran or was dropped) and incidents dropped before their ``for`` was up.
Lines wait for :meth:`IncidentFeed.flush`, so that the demo prints the events that led to an
incident before it. The collector is not changed for this: the feed is handed to it as its sink.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TextIO

from cli.demo.view import FINAL_STATES, action_line, dropped_line, incident_line
from rules.engine import Phase

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.actions.journaling import FirePlan
    from collector.incidents.service import ActionSink
    from collector.store.incidents import ActionRow, IncidentRow
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock
    from rules.engine import Engine
    from rules.model import ActionSpec, Rule

LIMIT: Final = 1000


class IncidentFeed:
    """An action sink that lets ``inner`` act, then shows the incident and its actions."""

    def __init__(
        self,
        inner: ActionSink | None,
        journal: Journal,
        engine: Engine,
        clock: Clock,
        out: TextIO,
    ) -> None:
        """Lines go to ``out`` and carry the seconds since :meth:`begin`."""
        self._inner = inner
        self._journal = journal
        self._engine = engine
        self._clock = clock
        self._out = out
        self._lines: list[str] = []
        self._start = clock.monotonic()
        self._shown: dict[int, str] = {}  # action id -> the state printed
        self._incidents: set[str] = set()  # incidents shown
        self._acting = 0  # the inner sink is running a firing or a resolution

    def begin(self) -> None:
        """The demo's timeline starts now."""
        self._start = self._clock.monotonic()

    def elapsed(self) -> float:
        """Seconds since :meth:`begin`."""
        return self._clock.monotonic() - self._start

    def firing(self) -> int:
        """How many incidents fire now."""
        return sum(i.phase == Phase.FIRING for i in self._engine.open_incidents())

    async def fire(
        self,
        incident: IncidentRow,
        rule: Rule,
        actions: tuple[ActionSpec, ...],
        *,
        escalation: bool = False,
        plan: FirePlan | None = None,
    ) -> None:
        """Let the dispatcher run the actions, then note the firing and their outcomes."""
        self._acting += 1
        try:
            if self._inner is not None:
                await self._inner.fire(incident, rule, actions, escalation=escalation, plan=plan)
        finally:
            self._acting -= 1
        await self._show("ESCALATED" if escalation else "FIRING", incident)

    def plan(
        self,
        incident: IncidentRow,
        rule: Rule,
        actions: tuple[ActionSpec, ...],
        *,
        escalation: bool = False,
    ) -> FirePlan | None:
        """The dispatcher's plan: the feed shows actions once they ran."""
        if self._inner is None:
            return None
        return self._inner.plan(incident, rule, actions, escalation=escalation)

    async def resolve(self, incident: IncidentRow, rule: Rule) -> None:
        """Let the dispatcher undo what it should, then note the resolution."""
        self._acting += 1
        try:
            if self._inner is not None:
                await self._inner.resolve(incident, rule)
        finally:
            self._acting -= 1
        await self._show("RESOLVED", incident)

    async def settle(
        self,
        firing: Callable[[str], tuple[IncidentRow, Rule] | None],
        holds: Callable[[str], bool | None] | None = None,
    ) -> None:
        """Pass on: the dispatcher runs drains that waited; :meth:`poll` notes them."""
        if self._inner is not None:
            await self._inner.settle(firing, holds)

    def flush(self) -> None:
        """Print the lines written since the last flush."""
        for line in self._lines:
            print(line, file=self._out)
        self._lines.clear()

    async def poll(self) -> None:
        """Note actions that changed since their incident was shown, and dropped incidents."""
        if self._acting:
            return  # a firing is under way: its own line shows its actions
        for row in await self._actions():
            if row.incident_id in self._incidents and self._take(row):
                self._lines.append(action_line(self.elapsed(), row))
        rows = await self._journal.do(lambda s: s.incidents.incidents(limit=LIMIT))
        for incident in reversed(rows):
            if incident.phase == "dropped" and incident.id not in self._incidents:
                self._incidents.add(incident.id)
                rule = self._engine.rules.get(incident.rule)
                for_s = rule.for_s if rule is not None else 0.0
                self._lines.append(dropped_line(self.elapsed(), incident, for_s))

    async def _show(self, word: str, incident: IncidentRow) -> None:
        self._incidents.add(incident.id)
        rows = await self._actions()
        done = [r for r in rows if r.incident_id == incident.id and self._take(r)]
        self._lines.append(incident_line(self.elapsed(), word, incident, done))

    async def _actions(self) -> list[ActionRow]:
        """Every action, oldest first."""
        rows = await self._journal.do(lambda s: s.incidents.actions(limit=LIMIT))
        return rows[::-1]

    def _take(self, row: ActionRow) -> bool:
        """Whether ``row`` has an outcome not printed yet (and mark it printed)."""
        if row.state not in FINAL_STATES or self._shown.get(row.id) == row.state:
            return False
        self._shown[row.id] = row.state
        return True
