"""Actuators behind the dispatcher's protocols: webhooks for drains and notifications."""

from __future__ import annotations

from typing import TYPE_CHECKING

from collector.actions.dispatcher import ActionOutcome

if TYPE_CHECKING:
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
