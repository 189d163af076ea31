"""The dispatcher's actions in the journal: decided and journaled before they run, ended after.

Each action of an incident is journaled under the key ``<action>:<incident>``; a key already in
the journal is not journaled (nor run) again. A firing's first actions can be decided before the
firing is journaled (:meth:`ActionJournal.plan`) and go in the incident's own transaction
(:class:`FirePlan`); the others are decided when their turn comes (:meth:`ActionJournal.decide`).
On a shared journal a drain, a reset or a reboot is decided again under the fleet lock, against
every collector's actions (:meth:`IncidentStore.decide_action`). Each outcome is counted once in
:attr:`ActionJournal.tally`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from collector.actions.tally import UNFINISHED, ActionTally
from collector.store.incidents import ActionRow
from rules.model import ActionSpec

if TYPE_CHECKING:
    from collector.actions.local_checks import SafetyChecks
    from collector.store.incidents import Decision, FleetActions, IncidentRow
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock
    from rules.model import Rule


@dataclass(slots=True)
class Planned:
    """The first action of one of a firing's chains, decided before the firing was journaled.

    Its place (the node under the drain cap, the GPU) is held from the decision until the
    action runs, as it is across the journal's round trip when the action is decided later.
    """

    spec: ActionSpec
    name: str
    state: str
    why: str
    row: ActionRow
    busy: set[str] | None
    where: str
    action_id: int = 0
    new: bool = False

    def release(self) -> None:
        """Give the held place back (once)."""
        if self.busy is not None:
            self.busy.discard(self.where)
            self.busy = None


@dataclass(slots=True)
class FirePlan:
    """What :meth:`ActionJournal.plan` decided: journal :meth:`rows` with the incident.

    Then hand the plan to :meth:`Dispatcher.fire` (after :meth:`journaled`), or
    :meth:`release` it when the journal refused the rows.
    """

    firsts: list[Planned]

    def rows(self) -> list[ActionRow]:
        """The action rows to journal, in the same transaction as their incident's."""
        return [first.row for first in self.firsts]

    def journaled(self, results: list[tuple[int, bool]]) -> None:
        """The journal's (id, new) for each of :meth:`rows`, in order."""
        for first, (action_id, new) in zip(self.firsts, results, strict=True):
            first.action_id, first.new = action_id, new

    def release(self) -> None:
        """Give every held place back (the rows were not journaled)."""
        for first in self.firsts:
            first.release()


def chains(actions: tuple[ActionSpec, ...]) -> list[tuple[ActionSpec, ...]]:
    """What runs one after another (drains to tickets, in order), then each notification."""
    ordered = tuple(spec for spec in actions if spec.name != "notify")
    notes = [(spec,) for spec in actions if spec.name == "notify"]
    return ([ordered] if ordered else []) + notes


def expand(actions: tuple[ActionSpec, ...]) -> tuple[ActionSpec, ...]:
    """``reset_gpu: {drain_first: true}`` is a drain (no new jobs), then a reset once idle."""
    out: list[ActionSpec] = []
    for spec in actions:
        if spec.name == "reset_gpu" and spec.params.get("drain_first"):
            out.append(ActionSpec("drain_node"))
        out.append(spec)
    return tuple(out)


class ActionJournal:
    """Journals the dispatcher's actions, decided by ``checks``, and counts their outcomes."""

    def __init__(self, journal: Journal, clock: Clock, checks: SafetyChecks) -> None:
        """Write through ``journal``; stamp rows with ``clock.now()``."""
        self._journal = journal
        self._clock = clock
        self._checks = checks
        self.tally = ActionTally(clock)
        self._unfinished: dict[int, tuple[str, str]] = {}  # action id -> (action, node)

    @property
    def shared(self) -> bool:
        """Whether other collectors share the journal (a drain or reset is decided there)."""
        return self._journal.store.shared

    def now_ms(self) -> int:
        """The clock's time in Unix milliseconds."""
        return int(self._clock.now() * 1000)

    async def every_action(self) -> list[ActionRow]:
        """What the journal holds, newest first (for a start)."""
        return await self._journal.do(lambda s: s.incidents.actions(limit=100_000))

    async def unfinished(self) -> list[ActionRow]:
        """Actions journaled as planned or running (by the process before this one)."""
        return await self._journal.do(lambda s: s.incidents.unfinished_actions())

    async def finish(self, action_id: int, state: str, detail: str) -> None:
        """Journal how the action ended (or that it waits); count an outcome once."""
        now = self.now_ms()
        await self._journal.do(lambda s: s.incidents.finish_action(action_id, state, detail, now))
        meta = self._unfinished.get(action_id)
        if meta is not None and state not in UNFINISHED:
            del self._unfinished[action_id]
            self.tally.record(meta[0], state, meta[1])

    async def reopen_decided(
        self, action_id: int, incident: IncidentRow, spec: ActionSpec
    ) -> tuple[str, str]:
        """Mark a waiting action running: fleet-wide under the lock when the journal is shared."""
        if not self.shared:
            await self._journal.do(lambda s: s.incidents.reopen_action(action_id, "running"))
            return "planned", ""

        def decide(fleet: FleetActions) -> Decision:
            return self._checks.fleet_refusal(incident, spec, fleet)

        now_ms, window_ms = self.now_ms(), int(self._checks.config.breaker_window_s * 1000)
        return await self._journal.do(
            lambda s: s.incidents.reopen_decided(
                action_id,
                decide,
                now_ms=now_ms,
                breaker_window_ms=window_ms,
                cooldown_ms=int(self._checks.config.node_cooldown_s * 1000),
            )
        )

    def row(
        self, incident: IncidentRow, spec: ActionSpec, state: str, detail: str, action: str
    ) -> ActionRow:
        """The journal row of ``action`` (``spec``, maybe renamed) of ``incident``."""
        params = dict(spec.params)
        if spec.name == "requeue_job" and (job := self._checks.job_of(incident)) is not None:
            params["job"] = job  # which job: the journal says, and the limits learn it back
        if spec.name == "reboot_node":
            # the boot it is asked from: the reboot is in flight until the node has another
            params["boot_id"] = self._checks.boot_of(incident.node)
        return ActionRow(
            idempotency_key=f"{action}:{incident.id}",
            incident_id=incident.id,
            action=action,
            node=incident.node,
            target=incident.target,
            state=state,
            created_ms=self.now_ms(),
            params=params,
            detail=detail,
            finished_ms=None if state in ("planned", "running") else self.now_ms(),
        )

    def count_new(self, action_id: int, action: str, state: str, node: str) -> None:
        """Count a newly journaled action: its outcome now, or when it ends."""
        if state in UNFINISHED:
            self._unfinished[action_id] = (action, node)
        else:
            self.tally.record(action, state, node)

    async def add(
        self,
        incident: IncidentRow,
        spec: ActionSpec,
        state: str,
        detail: str,
        name: str | None = None,
    ) -> tuple[int, bool]:
        """Journal an action as decided here: (id, whether its key is new)."""
        action = name or spec.name
        row = self.row(incident, spec, state, detail, action)
        action_id, new = await self._journal.do(lambda s: s.incidents.add_action(row))
        if new:
            self.count_new(action_id, action, state, incident.node)
        return action_id, new

    async def _add_fleet_wide(
        self, incident: IncidentRow, spec: ActionSpec, name: str
    ) -> tuple[int, bool, str, str]:
        """Journal a drain or reset the local checks let through, deciding it fleet-wide."""
        row = self.row(incident, spec, "planned", "", name)

        def decide(fleet: FleetActions) -> Decision:
            return self._checks.fleet_refusal(incident, spec, fleet)

        safety = self._checks.config
        window_ms = int(safety.breaker_window_s * 1000)
        rebooting = spec.name == "reboot_node"
        cooldown_s = max(safety.node_cooldown_s, safety.reboot_cooldown_s * rebooting)
        action_id, new, state, why = await self._journal.do(
            lambda s: s.incidents.decide_action(
                row,
                decide,
                breaker_window_ms=window_ms,
                cooldown_ms=int(cooldown_s * 1000),
                reboot_window_ms=int(safety.reboot_timeout_s * 1000) if rebooting else None,
            )
        )
        if new:
            self.count_new(action_id, name, state, incident.node)
        return action_id, new, state, why

    async def decide(
        self, incident: IncidentRow, rule: Rule, spec: ActionSpec, prefix: str
    ) -> tuple[int, bool, str, str, str]:
        """Decide an action and journal it: (id, new, state, why, journaled name)."""
        state, why = self._checks.refusal(incident, rule, spec)
        busy = self._checks.busy_set(spec) if state == "planned" else None
        where = self._checks.place(incident, spec)
        if busy is not None:  # hold the place (cap, GPU) before anything awaits
            busy.add(where)
        name = f"{prefix}{spec.name}"
        try:
            if busy is not None and self.shared and spec.name != "requeue_job":
                # a planned drain or reset: decided again fleet-wide
                action_id, new, state, why = await self._add_fleet_wide(incident, spec, name)
            else:
                action_id, new = await self.add(incident, spec, state, why, name)
        finally:
            if busy is not None:
                busy.discard(where)
        return action_id, new, state, why, name

    def plan(
        self,
        incident: IncidentRow,
        rule: Rule,
        actions: tuple[ActionSpec, ...],
        *,
        escalation: bool = False,
    ) -> FirePlan | None:
        """Decide the first action of each chain of a firing now, to journal with the incident.

        A firing's first actions were journaled in a writer call of their own after the
        incident's: at 4,096 nodes that round trip through the busy event loop was a good part
        of a fault's way to its webhook. Decided here, with the places they take held, their
        rows go in the incident's own transaction. None on a shared journal (a drain or a
        reset is decided under the fleet lock there) and when there is nothing to run.
        """
        if self.shared:
            return None
        prefix = "escalated_" if escalation else ""
        plan = FirePlan([])
        try:
            for chain in chains(expand(actions)):
                spec = chain[0]
                state, why = self._checks.refusal(incident, rule, spec)
                busy = self._checks.busy_set(spec) if state == "planned" else None
                where = self._checks.place(incident, spec)
                name = f"{prefix}{spec.name}"
                row = self.row(incident, spec, state, why, name)
                if busy is not None:
                    busy.add(where)
                plan.firsts.append(Planned(spec, name, state, why, row, busy, where))
        except BaseException:
            plan.release()
            raise
        return plan if plan.firsts else None

    async def reset_failed(self, action_id: int) -> bool:
        """Whether the journaled reset ``action_id`` ended failed or refused for good."""
        row = await self._journal.do(lambda s: s.incidents.action(action_id))
        return row is not None and row.state in ("failed", "refused")

    async def released(self, node: str, incident: str, reason: str) -> None:
        """Journal that a person put ``node`` (drained for ``incident``) back in service."""
        row = ActionRow(
            idempotency_key=f"release_node:{incident}:{self.now_ms()}",
            incident_id=incident,
            action="release_node",
            node=node,
            target=node,
            state="succeeded",
            created_ms=self.now_ms(),
            params={},
            detail=f"released by a person: {reason}" if reason else "released by a person",
            finished_ms=self.now_ms(),
        )
        await self._journal.do(lambda s: s.incidents.add_action(row))
        self.tally.record("release_node", "succeeded", node)
