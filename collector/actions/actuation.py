"""Runs one action through its actuator: drains, notifier, GPU reset, requeuer, reboots, tickets.

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
from collector.actions.rma import gpu_identity
from collector.model.recent_faults import counts_note

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.actions.ports import (
        Drainer,
        GpuResetter,
        JobRequeuer,
        Notifier,
        Rebooter,
        Ticketer,
    )
    from collector.actions.rma import BundleReads
    from collector.model.evidence_pack import Bundle
    from collector.model.state import NodeState
    from collector.store.incidents import IncidentRow
    from rules.model import ActionSpec, Rule

# What the journal and the scheduler read as fleetwatch's reason: a drain's, a reboot's.
_REASONED = frozenset({"drain_node", "reboot_node"})

log = structlog.get_logger("collector.actions")


class Actuation:
    """The drain adapters, the notifier, the GPU resetter and the job requeuer of the dispatcher."""

    def __init__(  # noqa: PLR0913 - one of each kind of actuator, and what tickets read
        self,
        drainers: tuple[Drainer, ...],
        notifier: Notifier | None,
        resetter: GpuResetter | None,
        requeuer: JobRequeuer | None = None,
        job_of: Callable[[IncidentRow], str | None] | None = None,
        *,
        rebooters: tuple[Rebooter, ...] = (),
        ticketer: Ticketer | None = None,
        bundles: BundleReads | None = None,
        node_state: Callable[[str], NodeState | None] | None = None,
        now: Callable[[], float] | None = None,
    ) -> None:
        """Act through these (none configured: an action of that kind fails).

        ``job_of`` names the job of the rank on an incident's GPU (what ``requeue_job`` requeues).
        An RMA ticket names the GPU as ``node_state`` holds it and carries the node's bundle
        from ``bundles`` (None: none), generated at ``now()`` (Unix seconds).
        """
        self._drainers = drainers
        self._notifier = notifier
        self._resetter = resetter
        self._requeuer = requeuer
        self._job_of = job_of
        self._rebooters = rebooters
        self._ticketer = ticketer
        self._bundles = bundles
        self._node_state = node_state
        self._now = now

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
                drain_reason(
                    rule.name,
                    incident.node,
                    incident.target,
                    incident.id,
                    note=str(spec.params.get("reason") or counts_note(incident.evidence)),
                )
                if spec.name in _REASONED
                else ""
            )
            checked = ("requeue_job", "reboot_node", "rma_ticket")
            node = check_node(incident.node) if spec.name in checked else ""
        except UnsafeArgumentError as exc:
            return _refuse(name, incident, exc)
        if spec.name == "requeue_job":
            return await self._requeue(incident, spec, node)
        if spec.name in ("drain_node", "reboot_node", "rma_ticket"):
            return await self._node_action(incident, rule, spec, (node, reason, key, name))
        if spec.name == "notify" and self._notifier is not None:
            payload = _incident_payload(incident, rule)
            payload["escalated"] = incident.escalated or name.startswith("escalated_")
            return await self._notifier.notify(str(spec.params["channel"]), payload, key)
        if spec.name == "reset_gpu" and self._resetter is not None:
            # Never forced from a rule: with drain_first the drain ran before (see ``expand``)
            # and the reset waits until the jobs have left the GPU.
            return await self._resetter.reset(incident.node, incident.target, force=False)
        return ActionOutcome(ok=False, detail=f"{spec.name}: no actuator is configured")

    async def _node_action(
        self, incident: IncidentRow, rule: Rule, spec: ActionSpec, args: tuple[str, str, str, str]
    ) -> ActionOutcome:
        """A drain, a reboot or an RMA ticket of the incident's node: (node, reason, key, name)."""
        node, reason, key, name = args
        if spec.name == "drain_node":
            return await self._all(d.drain(incident.node, reason, key) for d in self._drainers)
        if spec.name == "reboot_node":
            return await self._all((r.reboot(node, reason, key) for r in self._rebooters), "reboot")
        if self._ticketer is None:
            return ActionOutcome(ok=False, detail="rma_ticket: no actuator is configured")
        return await self._ticket(incident, rule, node, key, name)

    async def _requeue(self, incident: IncidentRow, spec: ActionSpec, node: str) -> ActionOutcome:
        """Requeue the job of the rank on the incident's GPU, off its node (``exclude_node``)."""
        job = self._job_of(incident) if self._job_of is not None else None
        if job is None:
            return ActionOutcome(ok=False, detail=no_slurm_job(incident.target))
        if self._requeuer is None:
            return ActionOutcome(ok=False, detail="requeue_job: no requeuer is configured")
        exclude = node if spec.params.get("exclude_node", True) else None
        return await self._requeuer.requeue(job, exclude)

    async def _ticket(
        self, incident: IncidentRow, rule: Rule, node: str, key: str, name: str
    ) -> ActionOutcome:
        """Open the incident's RMA ticket: the incident, its GPU, the node's evidence bundle."""
        assert self._ticketer is not None  # noqa: S101 - _node_action checked it
        payload = _incident_payload(incident, rule)
        payload["escalated"] = incident.escalated or name.startswith("escalated_")
        state = self._node_state(node) if self._node_state is not None else None
        payload["gpu"] = gpu_identity(node, incident.target, state)
        bundles, now = self._bundles, self._now

        async def bundle() -> tuple[Bundle | None, str]:
            if bundles is None or now is None:
                return None, "this collector builds no evidence bundles"
            return await bundles.read(node, round(now() * 1000))

        return await self._ticketer.open_ticket(payload, bundle, key)

    @staticmethod
    async def _all(runs: object, what: str = "drain") -> ActionOutcome:
        outcomes = await asyncio.gather(*runs)  # type: ignore[misc]
        if not outcomes:
            return ActionOutcome(ok=False, detail=f"no {what} adapter is configured")
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
