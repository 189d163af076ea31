"""Runs one action through its actuator: drain adapters, notifier, GPU reset, job requeuer.

What leaves the collector is built from fixed words and checked names only
(:mod:`collector.actions.guards`); an action whose arguments fail those checks runs nothing and
comes back refused. An actuator that raises gives a failed outcome.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from collector.actions.guards import UnsafeArgumentError, check_node, delivery_key, drain_reason
from collector.actions.local_checks import no_slurm_job
from collector.actions.ports import ActionOutcome, refused

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.actions.ports import Drainer, GpuResetter, JobRequeuer, Notifier
    from collector.store.incidents import IncidentRow
    from rules.model import ActionSpec, Rule

log = structlog.get_logger("collector.actions")


class Actuation:
    """The drain adapters, the notifier, the GPU resetter and the job requeuer of the dispatcher."""

    def __init__(
        self,
        drainers: tuple[Drainer, ...],
        notifier: Notifier | None,
        resetter: GpuResetter | None,
        requeuer: JobRequeuer | None = None,
        job_of: Callable[[IncidentRow], str | None] | None = None,
    ) -> None:
        """Act through these (none configured: an action of that kind fails).

        ``job_of`` names the job of the rank on an incident's GPU (what ``requeue_job`` requeues).
        """
        self._drainers = drainers
        self._notifier = notifier
        self._resetter = resetter
        self._requeuer = requeuer
        self._job_of = job_of

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
            node = check_node(incident.node) if spec.name == "requeue_job" else ""
        except UnsafeArgumentError as exc:
            return _refuse(name, incident, exc)
        if spec.name == "requeue_job":
            return await self._requeue(incident, spec, node)
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

    async def _requeue(self, incident: IncidentRow, spec: ActionSpec, node: str) -> ActionOutcome:
        """Requeue the job of the rank on the incident's GPU, off its node (``exclude_node``)."""
        job = self._job_of(incident) if self._job_of is not None else None
        if job is None:
            return ActionOutcome(ok=False, detail=no_slurm_job(incident.target))
        if self._requeuer is None:
            return ActionOutcome(ok=False, detail="requeue_job: no requeuer is configured")
        exclude = node if spec.params.get("exclude_node", True) else None
        return await self._requeuer.requeue(job, exclude)

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
