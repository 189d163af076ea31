"""Actuators behind the dispatcher's protocols: Slurm and webhooks drain, webhooks notify."""

from __future__ import annotations

from typing import TYPE_CHECKING

from collector.actions.ports import ActionOutcome
from collector.actions.slurm import DrainOutcome, ResumeOutcome, SlurmError, SlurmRefusedError

if TYPE_CHECKING:
    from collector.actions.slurm import SlurmNodes
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
