"""Reboot a Slurm node through ``scontrol reboot``, so Slurm drains it first and holds it after.

:meth:`SlurmReboots.reboot` runs, each as an argument list under a timeout:

1. ``scontrol show node -o NODE``: a node that carries someone else's reason (drained, down or
   failed by a person or by Slurm itself) is left alone, as a drain leaves it
   (:mod:`collector.actions.slurm`); a node whose reboot fleetwatch asked for already
   (``REBOOT_REQUESTED`` or ``REBOOT_ISSUED`` with our reason) is not asked again.
2. ``scontrol reboot ASAP nextstate=DOWN reason=REASON NODE``: ``ASAP`` drains the node (no new
   job starts there) and reboots it once its running jobs have ended; ``nextstate=DOWN`` keeps
   it down after the reboot, for re-qualification to bring it back; ``reason`` is fleetwatch's
   (prefixed and sanitised: letters, digits, spaces and ``. _ : / ( ) , -`` only), and Slurm
   appends ``: reboot issued`` and ``: reboot complete`` to it as the reboot goes on.
3. ``scontrol show node -o NODE`` again: the state the journal records (``DRAIN`` and
   ``REBOOT_REQUESTED`` while jobs run, ``REBOOT_ISSUED`` once slurmd ran the RebootProgram).

slurmd runs slurm.conf's ``RebootProgram`` on the node (without arguments); without one
slurmctld refuses the reboot and the error says so. A node that does not register again within
``ResumeTimeout`` is marked DOWN by Slurm (``reboot timed out``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Final

import structlog

from collector.actions.slurm import (
    DEFAULT_REASON_PREFIX,
    SlurmNodes,
    SlurmRefusedError,
    is_single_node_name,
    run_scontrol,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from collector.actions.slurm import SlurmNodeState

__all__ = ["REBOOT_FLAGS", "RebootOutcome", "RebootResult", "SlurmReboots", "reboot_args"]

log = structlog.get_logger("collector.actions.slurm")

# State flags of a node whose reboot Slurm was asked for (22.05; REBOOT before 20.02).
REBOOT_FLAGS: Final = frozenset({"REBOOT", "REBOOT_REQUESTED", "REBOOT_ISSUED"})
# What a reason we write may hold, as for a drain (collector.actions.slurm): no shell or Slurm
# syntax at all.
_REASON_TEXT: Final = re.compile(r"[A-Za-z0-9 ._:/(),-]+")
_REASON_CHARS: Final = "letters, digits, spaces and . _ : / ( ) , -"


class RebootOutcome(StrEnum):
    """What :meth:`SlurmReboots.reboot` did."""

    REQUESTED = "requested"
    """We ran ``scontrol reboot ASAP nextstate=DOWN``."""
    ALREADY_REQUESTED = "already_requested"
    """A reboot of ours was asked for already (requested or issued); nothing was run."""
    HELD_BY_OTHER = "held_by_other"
    """The node carries someone else's reason; it was left alone."""


@dataclass(frozen=True, slots=True)
class RebootResult:
    """What :meth:`SlurmReboots.reboot` found and did; the caller journals it.

    Attributes:
        node: the node.
        outcome: requested now, requested before, or left alone.
        reason: the sanitised reason we asked for (with the prefix).
        state: the node after the call (before it, when nothing was run).
    """

    node: str
    outcome: RebootOutcome
    reason: str
    state: SlurmNodeState


def reboot_args(node: str, reason: str) -> tuple[str, ...]:
    """The arguments of ``scontrol`` that reboot ``node`` with ``reason`` (checked already).

    One argument each, never through a shell: the reason's spaces need no quotes.
    """
    return ("reboot", "ASAP", "nextstate=DOWN", f"reason={reason}", node)


class SlurmReboots:
    """Reboots Slurm nodes with ``scontrol reboot``; every method is a coroutine."""

    __slots__ = ("_env", "_nodes", "_scontrol", "_timeout_s")

    def __init__(
        self,
        scontrol: str = "scontrol",
        env: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        reason_prefix: str = DEFAULT_REASON_PREFIX,
    ) -> None:
        """Check the options now (as :class:`SlurmNodes` does), so a bad one fails at start-up.

        Raises:
            ValueError: an option is empty or out of range; the message names it.
        """
        self._nodes = SlurmNodes(scontrol, env, timeout_s, reason_prefix)
        self._scontrol = scontrol
        self._env = {**(env or {}), "SLURM_TIME_FORMAT": "standard"}
        self._timeout_s = timeout_s

    def reason_for(self, text: str) -> str:
        """The reason :meth:`reboot` writes for ``text`` (prefixed and sanitised)."""
        return self._nodes.reason_for(text)

    async def reboot(self, node: str, reason: str) -> RebootResult:
        """Reboot ``node`` as soon as it is idle, to come back DOWN; see the module's steps.

        Raises:
            SlurmRefusedError: the node name or the sanitised reason failed its check; nothing
                was run.
            SlurmError: scontrol failed, timed out or is missing (no RebootProgram, an unknown
                node); the message names the node and carries scontrol's words.
        """
        if not is_single_node_name(node):
            msg = f"refusing node name {node[:80]!r}: not a single Slurm node name"
            log.error("slurm_argument_refused", node=node[:80], argument="node", error=msg)
            raise SlurmRefusedError(msg, node=node)
        wanted = self.reason_for(reason)
        if not _REASON_TEXT.fullmatch(wanted):
            msg = f"refusing reason {wanted[:80]!r} for node {node!r}: only {_REASON_CHARS}"
            log.error("slurm_argument_refused", node=node, argument="reason", error=msg)
            raise SlurmRefusedError(msg, node=node)
        before = await self._nodes.state(node)
        skip = self._skip(before)
        if skip is not None:
            log.info(
                "slurm_reboot_skipped",
                node=node,
                outcome=str(skip),
                slurm_reason=before.reason,
                states=sorted(before.states),
            )
            return RebootResult(node, skip, wanted, before)
        await run_scontrol(
            self._scontrol,
            reboot_args(node, wanted),
            env=self._env,
            timeout_s=self._timeout_s,
            node=node,
        )
        after = await self._nodes.state(node)
        log.warning("slurm_reboot_requested", node=node, reason=wanted, states=sorted(after.states))
        return RebootResult(node, RebootOutcome.REQUESTED, wanted, after)

    def _skip(self, before: SlurmNodeState) -> RebootOutcome | None:
        """Why the reboot must not be asked for on a node in ``before``; None when it may."""
        if self._nodes.is_ours(before):
            pending = not before.states.isdisjoint(REBOOT_FLAGS)
            return RebootOutcome.ALREADY_REQUESTED if pending else None
        # Someone else's reason (a person's, Slurm's on a down node), or a drain without one:
        # a reboot would write over it.
        if before.reason is not None or before.drained or before.draining:
            return RebootOutcome.HELD_BY_OTHER
        return None
