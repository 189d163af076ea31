"""What the dispatcher acts through: the actuator protocols, and what running an action gave."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from collector.model.evidence_pack import Bundle

    # Reads the incident node's evidence bundle, off the event loop: (bundle, "") or (None, why).
    BundleRead = Callable[[], Awaitable[tuple[Bundle | None, str]]]

__all__ = [
    "ActionOutcome",
    "Drainer",
    "GpuResetter",
    "JobRequeuer",
    "Notifier",
    "Rebooter",
    "Ticketer",
    "refused",
]


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    """What running an action gave."""

    ok: bool
    detail: str
    retry: bool = False  # not done, not failed: ask again later (a busy GPU)
    refused: bool = False  # never ran: an argument failed its check, or the agent said no


def refused(detail: str) -> ActionOutcome:
    """An action that ran nothing because a check said no; journaled as ``refused``."""
    return ActionOutcome(ok=False, detail=f"refused: {detail}", refused=True)


class Drainer(Protocol):
    """Takes nodes out of (and back into) the scheduler: Slurm, a webhook, ..."""

    name: str

    async def drain(self, node: str, reason: str, key: str) -> ActionOutcome:
        """Drain ``node`` with ``reason``; idempotent."""
        ...

    async def resume(self, node: str, key: str) -> ActionOutcome:
        """Resume ``node`` if fleetwatch drained it."""
        ...


class Notifier(Protocol):
    """Tells people: chat, paging."""

    async def notify(self, channel: str, payload: dict[str, object], key: str) -> ActionOutcome:
        """Deliver ``payload`` to ``channel``."""
        ...


class GpuResetter(Protocol):
    """Resets a GPU through its node's agent."""

    async def reset(self, node: str, target: str, *, force: bool) -> ActionOutcome:
        """Reset the GPU ``target`` (a key like ``node/gpu/3``) of ``node``."""
        ...


class JobRequeuer(Protocol):
    """Puts a training job back in its scheduler's queue, to start again without a node."""

    async def requeue(self, job: str, node: str | None) -> ActionOutcome:
        """Requeue ``job`` keeping it off ``node`` (None: anywhere); refused when it may not be."""
        ...


class Rebooter(Protocol):
    """Reboots a node through its scheduler (Slurm) or another system (a webhook)."""

    name: str

    async def reboot(self, node: str, reason: str, key: str) -> ActionOutcome:
        """Reboot ``node`` once it is drained, to come back held out of service; idempotent."""
        ...


class Ticketer(Protocol):
    """Opens a ticket with the vendor's or the site's RMA desk."""

    async def open_ticket(
        self, payload: dict[str, object], bundle: BundleRead, key: str
    ) -> ActionOutcome:
        """Send the incident's ``payload`` and the node's evidence (``bundle`` reads it)."""
        ...
