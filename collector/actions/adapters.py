"""Actuators behind the dispatcher's protocols: Slurm and webhooks drain, webhooks notify.

Slurm requeues jobs too (:class:`SlurmRequeuer`); Slurm and a webhook reboot nodes
(:class:`SlurmRebooter`, :class:`WebhookRebooter`); a webhook opens RMA tickets
(:class:`WebhookTicketer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collector.actions.ports import ActionOutcome
from collector.actions.rma import RMA_KIND, attachment
from collector.actions.slurm import DrainOutcome, ResumeOutcome, SlurmError, SlurmRefusedError
from collector.actions.slurm_reboot import RebootOutcome
from collector.actions.slurm_requeue import RequeueOutcome

if TYPE_CHECKING:
    from collector.actions.ports import BundleRead
    from collector.actions.slurm import SlurmNodes
    from collector.actions.slurm_reboot import SlurmReboots
    from collector.actions.slurm_requeue import RequeueResult, SlurmJobs
    from collector.actions.webhook import DeliveryResult, WebhookSender

REBOOT_KIND = "reboot_request"


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


class SlurmRebooter:
    """Reboots nodes through Slurm (``scontrol reboot ASAP nextstate=DOWN``)."""

    name = "slurm"

    def __init__(self, reboots: SlurmReboots) -> None:
        """Use ``reboots`` (one adapter for the collector's life)."""
        self._reboots = reboots

    async def reboot(self, node: str, reason: str, key: str) -> ActionOutcome:  # noqa: ARG002
        """Ask Slurm for the reboot; a node held by someone else is left as it is."""
        try:
            result = await self._reboots.reboot(node, reason)
        except SlurmRefusedError as exc:
            return ActionOutcome(ok=False, detail=f"slurm: {exc}", refused=True)
        except SlurmError as exc:
            return ActionOutcome(ok=False, detail=f"slurm: reboot of {node} not asked for: {exc}")
        states = "+".join(sorted(result.state.states))
        if result.outcome is RebootOutcome.HELD_BY_OTHER:
            held = result.state.reason or "no reason"
            return ActionOutcome(
                ok=False,
                detail=f"slurm: {node} left alone, held out by someone else ({held}); not rebooted",
            )
        if result.outcome is RebootOutcome.ALREADY_REQUESTED:
            return ActionOutcome(
                ok=True, detail=f"slurm: reboot of {node} already asked ({states})"
            )
        return ActionOutcome(
            ok=True, detail=f"slurm: reboot of {node} asked ({states}; {result.reason})"
        )


class WebhookRebooter:
    """Asks another system (a BMC controller, a Kubernetes operator) to reboot a node.

    The receiver drains the node first, reboots it once its jobs are gone, and brings it back
    held out of service (``next_state: down``) for re-qualification (docs/webhooks.md).
    """

    name = "webhook"

    def __init__(self, sender: WebhookSender) -> None:
        """Send reboot requests through ``sender``."""
        self._sender = sender

    async def reboot(self, node: str, reason: str, key: str) -> ActionOutcome:
        """POST a ``reboot_request``."""
        payload = {"node": node, "reason": reason, "drain_first": True, "next_state": "down"}
        return _outcome(await self._sender.send(payload, key, kind=REBOOT_KIND), "reboot webhook")


class WebhookTicketer:
    """Opens RMA tickets through a webhook, each with the node's evidence bundle."""

    def __init__(self, sender: WebhookSender, max_bundle_bytes: int) -> None:
        """Send each ``rma_request`` through ``sender``, a bundle attached up to the size given."""
        self._sender = sender
        self._max_bundle_bytes = max_bundle_bytes

    async def open_ticket(
        self, payload: dict[str, object], bundle: BundleRead, key: str
    ) -> ActionOutcome:
        """POST an ``rma_request``: the incident's payload, and the bundle (or its manifest)."""
        built, why = await bundle()
        shown = attachment(built, self._max_bundle_bytes, why)
        result = await self._sender.send({**payload, "bundle": shown}, key, kind=RMA_KIND)
        outcome = _outcome(result, "rma webhook")
        what = (
            f"bundle {shown['name']} attached ({shown['bytes']} bytes, sha256 {shown['sha256']})"
            if shown["attached"]
            else f"no bundle attached: {shown['why']}"
        )
        return ActionOutcome(ok=outcome.ok, detail=f"{outcome.detail}; {what}")
