"""Actuators behind the dispatcher's protocols: Slurm and webhooks drain, webhooks notify.

Slurm requeues jobs too (:class:`SlurmRequeuer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collector.actions.ports import ActionOutcome
from collector.actions.slurm import DrainOutcome, ResumeOutcome, SlurmError, SlurmRefusedError
from collector.actions.slurm_requeue import RequeueOutcome

if TYPE_CHECKING:
    from collector.actions.slurm import SlurmNodes
    from collector.actions.slurm_requeue import RequeueResult, SlurmJobs
    from collector.actions.webhook import DeliveryResult, WebhookSender


def _outcome(result: DeliveryResult, what: str) -> ActionOutcome:
    if result.delivered:
        return ActionOutcome(ok=True, detail=f"{what}: delivered (HTTP {result.status})")
    return ActionOutcome(
        ok=False,
        detail=f"{what}: not delivered after {result.attempts} attempts: {result.error}",
    )


class WebhookDrainer:
    """Asks an external system (a Kubernetes controller, a ticket bot) to drain a node."""

    name = "webhook"

    def __init__(self, sender: WebhookSender) -> None:
        """Send drain and resume requests through ``sender``."""
        self._sender = sender

    async def drain(self, node: str, reason: str, key: str) -> ActionOutcome:
        """POST a ``drain_request``."""
        result = await self._sender.send(
            {"node": node, "reason": reason}, key, kind="drain_request"
        )
        return _outcome(result, "drain webhook")

    async def resume(self, node: str, key: str) -> ActionOutcome:
        """POST a ``resume_request``."""
        result = await self._sender.send({"node": node}, key, kind="resume_request")
        return _outcome(result, "resume webhook")


class WebhookNotifier:
    """Notifications to named channels, each a webhook."""

    def __init__(self, channels: dict[str, WebhookSender]) -> None:
        """``channels`` maps a rule's channel name to its sender."""
        self._channels = channels

    async def notify(self, channel: str, payload: dict[str, object], key: str) -> ActionOutcome:
        """POST a ``notification`` to ``channel`` (or to ``default`` when it has no sender)."""
        sender = self._channels.get(channel) or self._channels.get("default")
        if sender is None:
            return ActionOutcome(ok=False, detail=f"no notify channel {channel!r} or default")
        return _outcome(await sender.send(payload, key, kind="notification"), f"notify {channel}")


class SlurmDrainer:
    """Drains and resumes nodes in Slurm (through ``scontrol``), never over a person's drain."""

    name = "slurm"

    def __init__(self, nodes: SlurmNodes) -> None:
        """Use ``nodes`` (one adapter for the collector's life)."""
        self._nodes = nodes

    async def drain(self, node: str, reason: str, key: str) -> ActionOutcome:  # noqa: ARG002
        """``scontrol update State=DRAIN``; a node held by someone else is left as it is."""
        try:
            result = await self._nodes.drain(node, reason)
        except SlurmRefusedError as exc:
            return ActionOutcome(ok=False, detail=f"slurm: {exc}", refused=True)
        except SlurmError as exc:
            return ActionOutcome(ok=False, detail=f"slurm: {exc}")
        if result.outcome == DrainOutcome.HELD_BY_OTHER:
            held = result.state.reason or "no reason"
            return ActionOutcome(
                ok=False, detail=f"slurm: left alone, drained by someone else ({held})"
            )
        return ActionOutcome(
            ok=True, detail=f"slurm: {result.outcome.value.lower()} ({result.reason})"
        )

    async def resume(self, node: str, key: str) -> ActionOutcome:  # noqa: ARG002
        """``scontrol update State=RESUME``, only for our own drain."""
        try:
            result = await self._nodes.resume(node)
        except SlurmRefusedError as exc:
            return ActionOutcome(ok=False, detail=f"slurm: {exc}", refused=True)
        except SlurmError as exc:
            return ActionOutcome(ok=False, detail=f"slurm: {exc}")
        if result.outcome == ResumeOutcome.RESUMED:
            return ActionOutcome(ok=True, detail="slurm: resumed")
        return ActionOutcome(
            ok=False, detail=f"slurm: not resumed ({result.outcome.value.lower()})"
        )


# Why a job was not requeued, in the words the journal shows.
_NOT_REQUEUED = {
    RequeueOutcome.NOT_RUNNING: "is {state}: only a RUNNING or SUSPENDED job is requeued",
    RequeueOutcome.NOT_REQUEUEABLE: (
        "may not be requeued (Requeue=0: submitted with --no-requeue, or JobRequeue=0 in "
        "slurm.conf without --requeue)"
    ),
    RequeueOutcome.NOT_BATCH: "is not a batch job (salloc, srun): Slurm requeues sbatch jobs only",
    RequeueOutcome.NOT_ON_NODE: (
        "does not run on {node} (NodeList={nodes}): the rank there is not this job's"
    ),
    RequeueOutcome.ASKS_FOR_NODE: (
        "asks for {node} by name (ReqNodeList={required}): with {node} excluded it could never "
        "start again"
    ),
}


def _requeued(result: RequeueResult) -> str:
    """``slurm: job 123 requeued (restart 2), excluding node-07 (ExcNodeList=...), released``."""
    after = result.after
    restarts = f" (restart {after.restarts})" if after is not None else ""
    if result.node is None:
        kept = ""
    elif result.excluded is None:
        kept = f", {result.node} already excluded"
    else:
        kept = f", excluding {result.node} (ExcNodeList={result.excluded})"
    state = f", now {after.state}{' and HELD' if after.held else ''}" if after else ""
    return f"slurm: job {result.job} requeued{restarts}{kept}, released{state}"


class SlurmRequeuer:
    """Requeues jobs in Slurm (through ``scontrol``), each kept off the node to blame."""

    def __init__(self, jobs: SlurmJobs) -> None:
        """Use ``jobs`` (one adapter for the collector's life)."""
        self._jobs = jobs

    async def requeue(self, job: str, node: str | None) -> ActionOutcome:
        """``requeuehold``, ``update ExcNodeList``, ``release``; refused when Slurm would not."""
        try:
            result = await self._jobs.requeue(job, node)
        except SlurmRefusedError as exc:
            return ActionOutcome(ok=False, detail=f"refused: slurm: {exc}", refused=True)
        except SlurmError as exc:
            return ActionOutcome(ok=False, detail=f"slurm: {exc}")
        if result.outcome is not RequeueOutcome.REQUEUED:
            why = _NOT_REQUEUED[result.outcome].format(
                state=result.before.state,
                node=node,
                required=result.before.required,
                nodes=result.before.nodes,
            )
            return ActionOutcome(
                ok=False, detail=f"refused: slurm: job {job} {why}; not requeued", refused=True
            )
        return ActionOutcome(ok=True, detail=_requeued(result))
