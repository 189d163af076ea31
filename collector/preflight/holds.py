"""Holding a node that failed pre-flight out, through the ordinary drain action.

A failed node gets an incident of its own, ``preflight_<check>:<node>:<run start ms>`` (rule
``preflight_<check>``, the check that failed), journaled like a rule's, and the dispatcher runs
its ``drain_node`` action: the same journal entries before and after, the same drain cap, circuit
breaker, cooldown and dry-run, the same Slurm and webhook adapters. The drain reason reads
``fleetwatch: preflight_<check>: node <node> (incident ...)``.

:meth:`PreflightHolds.release_allowed` is what ``drains release --require-preflight`` asks:
whether the node passed a ``quick`` run (or deeper) since it was drained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import structlog

from collector.store.incidents import IncidentRow
from fleetwatch.clock import unix_ms
from rules.model import ActionSpec, Rule, Scope, Severity

if TYPE_CHECKING:
    from collector.actions.dispatcher import Dispatcher
    from collector.store.events import EventStore
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock

log = structlog.get_logger("collector.preflight.holds")

DRAIN: Final = (ActionSpec("drain_node"),)


def hold_rule(check: str) -> Rule:
    """The rule a pre-flight hold is journaled under (it is never evaluated)."""
    return Rule(
        name=f"preflight_{check}",
        scope=Scope.NODE,
        when="false",
        severity=Severity.CRITICAL,
        description=f"the node failed pre-flight check {check}",
        actions=DRAIN,
        source="preflight",
    )


class PreflightHolds:
    """Drains nodes that failed a run, under the dispatcher's limits."""

    def __init__(self, dispatcher: Dispatcher, journal: Journal, clock: Clock) -> None:
        """Act through ``dispatcher``; journal the incident first."""
        self._dispatcher = dispatcher
        self._journal = journal
        self._clock = clock
        self.held: dict[str, str] = {}  # node -> incident id, for the nodes held by pre-flight
        # The holds' incidents, firing until the node passes a run: a drain waiting under the
        # cap runs once there is room (the incident service asks :meth:`firing`).
        self._open: dict[str, tuple[IncidentRow, Rule]] = {}

    async def hold(self, node: str, check: str, run_id: str, run_started_ms: int) -> str:
        """Drain ``node`` for ``check``; the incident's id."""
        rule = hold_rule(check)
        now = unix_ms(self._clock)
        incident = IncidentRow(
            id=f"{rule.name}:{node}:{run_started_ms}",
            rule=rule.name,
            node=node,
            target=node,
            severity=rule.severity.value,
            phase="firing",
            started_ms=now,
            updated_ms=now,
            fired_ms=now,
            evidence=f"pre-flight run {run_id}: {check} failed on {node}",
            firings=1,
        )
        await self._journal.do(lambda s: s.incidents.upsert_incident(incident))
        self._open[incident.id] = (incident, rule)
        await self._dispatcher.fire(incident, rule, DRAIN)
        self.held[node] = incident.id
        log.warning("preflight_hold", node=node, check=check, run=run_id, incident=incident.id)
        return incident.id

    def firing(self, incident_id: str) -> tuple[IncidentRow, Rule] | None:
        """A hold's incident and rule while it stands (the incident service's lookup)."""
        return self._open.get(incident_id)

    def passed(self, node: str) -> None:
        """``node`` passed a run: its holds no longer stand (a drain still waiting is dropped)."""
        for key, (row, _) in list(self._open.items()):
            if row.node == node:
                del self._open[key]

    async def drained_at(self, node: str, incident_id: str) -> int:
        """When the drain of ``node`` for ``incident_id`` was journaled (Unix ms; 0: not found)."""

        def find(store: EventStore) -> int:
            rows = store.incidents.actions(node=node, limit=1000)
            return max(
                (
                    r.created_ms
                    for r in rows
                    if r.incident_id == incident_id and r.action.endswith("drain_node")
                ),
                default=0,
            )

        return await self._journal.do(find)

    async def release_allowed(self, node: str, incident_id: str) -> tuple[bool, str]:
        """Whether ``node`` passed a quick (or deeper) run since it was drained, and why not."""
        since_ms = await self.drained_at(node, incident_id)
        run = await self._journal.do(lambda s: s.preflight.latest_passing(node, "quick", since_ms))
        if run is None:
            return False, f"{node} has not passed a pre-flight run since it was drained"
        return True, f"{node} passed pre-flight run {run.id}"
