"""What the dispatcher acts through: the actuator protocols, and what running an action gave."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["ActionOutcome", "Drainer", "GpuResetter", "JobRequeuer", "Notifier", "refused"]


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
