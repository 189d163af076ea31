"""What the configuration names to drain, notify, requeue, reboot and open tickets, replaceable.

The dispatcher keeps one :class:`LiveDrainer`, :class:`LiveNotifier`, :class:`LiveRequeuer`,
:class:`LiveRebooter` and :class:`LiveTicketer` for its life; each passes calls on to what the
configuration built last.
A reload builds the new set first (reading every webhook secret, so a missing one fails the
reload and changes nothing), then swaps it in with one assignment: an action already running
finishes with the adapter it started with.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collector.actions.adapters import (
    SlurmDrainer,
    SlurmRebooter,
    SlurmRequeuer,
    WebhookDrainer,
    WebhookNotifier,
    WebhookRebooter,
    WebhookTicketer,
)
from collector.actions.ports import (
    ActionOutcome,
    Drainer,
    JobRequeuer,
    Notifier,
    Rebooter,
    Ticketer,
)
from collector.actions.slurm import SlurmNodes
from collector.actions.slurm_reboot import SlurmReboots
from collector.actions.slurm_requeue import SlurmJobs
from fleetwatch.config_file import shown_key

if TYPE_CHECKING:
    from collections.abc import Mapping

    from collector.actions.config import ActionsConfig
    from collector.actions.ports import BundleRead
    from fleetwatch.clock import Clock


@dataclass(frozen=True, slots=True)
class Actuators:
    """What drains nodes, notifies people, requeues jobs, reboots nodes and opens RMA tickets.

    ``requeuer`` is None while ``[collector.actions.slurm] requeue`` is off; ``rebooters``
    are Slurm (while it is enabled) and the reboot webhook; ``ticketer`` is the RMA webhook.
    """

    drainers: tuple[Drainer, ...] = ()
    notifier: Notifier | None = None
    requeuer: JobRequeuer | None = None
    rebooters: tuple[Rebooter, ...] = ()
    ticketer: Ticketer | None = None


def build_actuators(
    cfg: ActionsConfig, clock: Clock, environ: Mapping[str, str] | None = None
) -> Actuators:
    """The drain adapters and notify channels ``cfg`` names, with their secrets read.

    ``environ`` holds the variables webhook ``secret_env`` keys name (none: no variables).

    Raises:
        ConfigError: a webhook's secret cannot be read, or its URL is unusable; the message
            names the webhook's key.
    """
    env_vars = environ or {}
    drainers: list[Drainer] = []
    rebooters: list[Rebooter] = []
    env = {"SLURM_CONF": str(cfg.slurm.slurm_conf)} if cfg.slurm.slurm_conf else None
    if cfg.slurm.enabled:
        drainers.append(SlurmDrainer(SlurmNodes(scontrol=cfg.slurm.scontrol, env=env)))
        rebooters.append(SlurmRebooter(SlurmReboots(scontrol=cfg.slurm.scontrol, env=env)))
    requeuer = (
        SlurmRequeuer(SlurmJobs(scontrol=cfg.slurm.scontrol, env=env))
        if cfg.slurm.requeue
        else None
    )
    if cfg.drain_webhook is not None:
        hook = cfg.drain_webhook.sender(clock, "actions.drain_webhook", env_vars)
        drainers.append(WebhookDrainer(hook))
    if cfg.reboot_webhook is not None:
        hook = cfg.reboot_webhook.sender(clock, "actions.reboot_webhook", env_vars)
        rebooters.append(WebhookRebooter(hook))
    ticketer = None
    if cfg.rma_webhook is not None:
        hook = cfg.rma_webhook.sender(clock, "actions.rma_webhook", env_vars)
        ticketer = WebhookTicketer(hook, cfg.rma_max_bundle_bytes)
    channels = {
        name: hook.sender(clock, f"actions.notify.{shown_key(name)}", env_vars)
        for name, hook in cfg.notify.items()
    }
    return Actuators(
        tuple(drainers),
        WebhookNotifier(channels) if channels else None,
        requeuer,
        tuple(rebooters),
        ticketer,
    )


def _combined(outcomes: list[ActionOutcome], what: str = "drain") -> ActionOutcome:
    """Every adapter's outcome as one, as the dispatcher combines its adapters' outcomes."""
    if len(outcomes) == 1:
        return outcomes[0]
    if not outcomes:
        return ActionOutcome(ok=False, detail=f"no {what} adapter is configured")
    return ActionOutcome(
        ok=all(o.ok for o in outcomes),
        detail="; ".join(o.detail for o in outcomes),
        refused=all(o.refused for o in outcomes),
    )


class LiveDrainer:
    """Drains through every adapter of the current configuration."""

    name = "configured"

    def __init__(self, drainers: tuple[Drainer, ...]) -> None:
        """Start with ``drainers``; :attr:`drainers` is replaced on a reload."""
        self.drainers = drainers

    async def drain(self, node: str, reason: str, key: str) -> ActionOutcome:
        """Drain through each adapter at once."""
        drainers = self.drainers  # one configuration for the whole action
        return _combined(
            list(await asyncio.gather(*(d.drain(node, reason, key) for d in drainers)))
        )

    async def resume(self, node: str, key: str) -> ActionOutcome:
        """Resume through each adapter at once."""
        drainers = self.drainers
        return _combined(list(await asyncio.gather(*(d.resume(node, key) for d in drainers))))


class LiveNotifier:
    """Notifies through the current configuration's channels."""

    def __init__(self, notifier: Notifier | None) -> None:
        """Start with ``notifier`` (None: no channels); :attr:`notifier` is replaced on a reload."""
        self.notifier = notifier

    async def notify(self, channel: str, payload: dict[str, object], key: str) -> ActionOutcome:
        """Deliver through the current channels, or say that there are none."""
        notifier = self.notifier
        if notifier is None:
            return ActionOutcome(ok=False, detail="notify: no notify channel is configured")
        return await notifier.notify(channel, payload, key)


class LiveRequeuer:
    """Requeues through the current configuration's requeuer, while requeueing is on."""

    def __init__(self, requeuer: JobRequeuer | None) -> None:
        """Start with ``requeuer`` (None: off); :attr:`requeuer` is replaced on a reload."""
        self.requeuer = requeuer

    @property
    def on(self) -> bool:
        """``[collector.actions.slurm] requeue = true`` in the current configuration."""
        return self.requeuer is not None

    async def requeue(self, job: str, node: str | None) -> ActionOutcome:
        """Requeue through the current requeuer, or say that requeueing is off."""
        requeuer = self.requeuer
        if requeuer is None:
            return ActionOutcome(ok=False, detail="requeue_job: requeue is off")
        return await requeuer.requeue(job, node)


class LiveRebooter:
    """Reboots through every rebooter of the current configuration (Slurm, the webhook)."""

    name = "configured"

    def __init__(self, rebooters: tuple[Rebooter, ...]) -> None:
        """Start with ``rebooters``; :attr:`rebooters` is replaced on a reload."""
        self.rebooters = rebooters

    async def reboot(self, node: str, reason: str, key: str) -> ActionOutcome:
        """Ask each rebooter at once; none configured: the reboot fails."""
        rebooters = self.rebooters
        outcomes = await asyncio.gather(*(r.reboot(node, reason, key) for r in rebooters))
        return _combined(list(outcomes), "reboot")


class LiveTicketer:
    """Opens tickets through the current configuration's RMA webhook."""

    def __init__(self, ticketer: Ticketer | None) -> None:
        """Start with ``ticketer`` (None: none); :attr:`ticketer` is replaced on a reload."""
        self.ticketer = ticketer

    async def open_ticket(
        self, payload: dict[str, object], bundle: BundleRead, key: str
    ) -> ActionOutcome:
        """Open the ticket, or say that no RMA webhook is configured (no bundle is built)."""
        ticketer = self.ticketer
        if ticketer is None:
            return ActionOutcome(
                ok=False, detail="rma_ticket: no [collector.actions.rma_webhook] is configured"
            )
        return await ticketer.open_ticket(payload, bundle, key)


class LiveActuators:
    """The dispatcher's adapters, and the one place a reload swaps what they pass calls to."""

    def __init__(self, actuators: Actuators) -> None:
        """Wrap the configuration's first set."""
        self.drainer = LiveDrainer(actuators.drainers)
        self.notifier = LiveNotifier(actuators.notifier)
        self.requeuer = LiveRequeuer(actuators.requeuer)
        self.rebooter = LiveRebooter(actuators.rebooters)
        self.ticketer = LiveTicketer(actuators.ticketer)

    def swap(self, actuators: Actuators) -> None:
        """Use ``actuators`` from the next action on."""
        self.drainer.drainers = actuators.drainers
        self.notifier.notifier = actuators.notifier
        self.requeuer.requeuer = actuators.requeuer
        self.rebooter.rebooters = actuators.rebooters
        self.ticketer.ticketer = actuators.ticketer

    @property
    def current(self) -> Actuators:
        """What calls go to now."""
        return Actuators(
            self.drainer.drainers,
            self.notifier.notifier,
            self.requeuer.requeuer,
            self.rebooter.rebooters,
            self.ticketer.ticketer,
        )
