"""Runs one action through the actuators: every drain adapter, the notifier, the agent's reset.

What leaves the collector is built from fixed words and checked names only
(:mod:`collector.actions.guards`); an action whose arguments fail those checks runs nothing and
comes back refused. An actuator that raises gives a failed outcome.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from collector.actions.guards import UnsafeArgumentError, check_node, delivery_key, drain_reason
from collector.actions.ports import ActionOutcome, refused

if TYPE_CHECKING:
    from collector.actions.ports import Drainer, GpuResetter, Notifier
    from collector.store.incidents import IncidentRow
    from rules.model import ActionSpec, Rule

log = structlog.get_logger("collector.actions")


class Actuation:
    """The drain adapters, the notifier and the GPU resetter the dispatcher acts through."""

    def __init__(
        self,
        drainers: tuple[Drainer, ...],
        notifier: Notifier | None,
        resetter: GpuResetter | None,
    ) -> None:
        """Act through these (none configured: an action of that kind fails)."""
        self._drainers = drainers
        self._notifier = notifier
        self._resetter = resetter

    async def run(
        self, incident: IncidentRow, rule: Rule, spec: ActionSpec, name: str
    ) -> ActionOutcome:
        """Run ``spec`` (journaled as ``name``) for ``incident``; what raises is an outcome."""
        try:
            return await self._actuate(incident, rule, spec, name)
        except Exception as exc:
            log.exception("action_failed", action=spec.name, incident=incident.id)
            return ActionOutcome(ok=False, detail=f"{type(exc).__name__}: {exc}")

    async def _actuate(
        self, incident: IncidentRow, rule: Rule, spec: ActionSpec, name: str
    ) -> ActionOutcome:
        try:
            # escalated_notify is not the first notify again; the key becomes a header
            key = delivery_key(name, incident.id)
            reason = (
                drain_reason(rule.name, incident.node, incident.target, incident.id)
                if spec.name == "drain_node"
                else ""
            )
        except UnsafeArgumentError as exc:
            return _refuse(name, incident, exc)
        if spec.name == "drain_node":
            return await self._all(d.drain(incident.node, reason, key) for d in self._drainers)
        if spec.name == "notify" and self._notifier is not None:
            payload = _incident_payload(incident, rule)
            payload["escalated"] = incident.escalated or name.startswith("escalated_")
            return await self._notifier.notify(str(spec.params["channel"]), payload, key)
        if spec.name == "reset_gpu" and self._resetter is not None:
            # Never forced from a rule: with drain_first the drain ran before (see ``expand``)
            # and the reset waits until the jobs have left the GPU.
            return await self._resetter.reset(incident.node, incident.target, force=False)
        return ActionOutcome(ok=False, detail=f"{spec.name}: no actuator is configured")

    @staticmethod
    async def _all(runs: object) -> ActionOutcome:
        outcomes = await asyncio.gather(*runs)  # type: ignore[misc]
        if not outcomes:
            return ActionOutcome(ok=False, detail="no drain adapter is configured")
        return ActionOutcome(
            ok=all(o.ok for o in outcomes),
            detail="; ".join(o.detail for o in outcomes),
            refused=all(o.refused for o in outcomes),
        )

    async def resume(self, incident: IncidentRow) -> ActionOutcome:
        """Resume the incident's node on every drain adapter."""
        try:
            key = delivery_key("resume_node", incident.id)
            node = check_node(incident.node)
        except UnsafeArgumentError as exc:
            return _refuse("resume_node", incident, exc)
        return await self._all(d.resume(node, key) for d in self._drainers)


def _refuse(action: str, incident: IncidentRow, exc: UnsafeArgumentError) -> ActionOutcome:
    """Log and answer an action whose arguments failed their checks: nothing runs."""
    log.error(
        "action_refused",
        action=action,
        incident=incident.id[:80],
        node=incident.node[:80],
        argument=exc.what,
        why=str(exc),
    )
    return refused(str(exc))


def _incident_payload(incident: IncidentRow, rule: Rule) -> dict[str, object]:
    """What a notification says."""
    return {
        "incident": incident.id,
        "rule": rule.name,
        "severity": rule.severity.value,
        "node": incident.node,
        "target": incident.target,
        "evidence": incident.evidence,
        "description": rule.description,
        "runbook": rule.runbook,
        "escalated": incident.escalated,
    }
