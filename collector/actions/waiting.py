"""Actions that wait, journaled as ``deferred``, and when they run.

A drain held back by the cap or the breaker waits for room, oldest first, while its incident
fires. A reset the agent refuses for now (compute processes on the GPU) is asked again every
``reset_retry_s``, or at once when every rank process on the GPU has ended. What waits for an
incident that stopped firing is dropped. Waiting actions survive a restart (read back from the
journal), and so do drains and notifications a restart cut short: they are idempotent at the
receiver and run again; a reset cut short may have run, and is journaled failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from rules.model import ActionSpec

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from collector.actions.journaling import ActionJournal
    from collector.actions.local_checks import SafetyChecks
    from collector.actions.ports import ActionOutcome
    from collector.store.incidents import ActionRow, IncidentRow
    from fleetwatch.clock import Clock
    from rules.model import Rule

    # Run an action journaled as the id, under the journaled name; record its outcome.
    RunJournaled = Callable[[int, IncidentRow, Rule, ActionSpec, str], Awaitable[ActionOutcome]]
    Escalate = Callable[[IncidentRow, Rule], Awaitable[None]]

log = structlog.get_logger("collector.actions")

# Actions safe to send again with the same idempotency key after a crash cut them short (a
# reboot is not: it may have been asked for, and a node rebooted twice loses what it ran).
REPEATABLE = frozenset({"drain_node", "notify", "rma_ticket"})
TAKEN = "taken"  # a waiting action another collector on the shared journal took up
CUT_SHORT = "collector restarted before the outcome was known"


@dataclass(frozen=True, slots=True)
class Waiting:
    """An action held back (the cap, the breaker, a busy GPU), journaled as ``action_id``."""

    action_id: int
    incident_id: str
    spec: ActionSpec
    next_try: float = 0.0  # monotonic; resets wait for their GPU to be idle
    name: str = ""  # the journaled name when it differs (escalated_...)
    cut_short: bool = False  # decided (and maybe sent) before a restart: runs again as it was


class WaitingActions:
    """The actions that wait, by action id (oldest first), and the counts of what befell them."""

    def __init__(
        self,
        *,
        actions: ActionJournal,
        checks: SafetyChecks,
        clock: Clock,
        run: RunJournaled,
        escalate: Escalate,
    ) -> None:
        """``run`` runs a waiting action once it may; ``escalate`` follows a failed reset."""
        self._actions = actions
        self._checks = checks
        self._clock = clock
        self._run = run
        self._escalate = escalate
        self.waiting: dict[int, Waiting] = {}
        self.deferred = 0
        self.dropped_cleared = 0  # waiting drains dropped because their fault had cleared

    def defer(self, wait: Waiting) -> None:
        """An action starts to wait (counted in :attr:`deferred`)."""
        self.deferred += 1
        self.waiting[wait.action_id] = wait

    def drains_waiting(self) -> int:
        """How many drains wait."""
        return sum(w.spec.name == "drain_node" for w in self.waiting.values())

    def listed(self) -> list[dict[str, Any]]:
        """What waits, for the drains API."""
        return [
            {"action_id": w.action_id, "incident": w.incident_id, "action": w.spec.name}
            for w in self.waiting.values()
        ]

    def take_up(self, rows: list[ActionRow], owns: Callable[[str], bool]) -> None:
        """Wait again for what the journal's ``rows`` hold as deferred on nodes ``owns``."""
        for row in reversed(rows):
            kind = row.action.removeprefix("escalated_")
            if not owns(row.node):
                continue  # a peer's node (shared journal): its collector settles it
            # a notification is deferred only by a start that found it cut short (below): a
            # crash before it ran again must not drop it
            if kind in ("drain_node", "reset_gpu", *REPEATABLE) and row.state == "deferred":
                self.waiting[row.id] = Waiting(
                    row.id,
                    row.incident_id,
                    ActionSpec(kind, dict(row.params)),
                    name=row.action,
                    cut_short=row.detail.startswith(CUT_SHORT),
                )

    async def settle_unfinished(self, owns: Callable[[str], bool]) -> None:
        """Actions journaled as planned or running by the process before this one."""
        for row in await self._actions.unfinished():
            if not owns(row.node):
                continue
            kind = row.action.removeprefix("escalated_")
            if kind in REPEATABLE:
                # Drains and notifications are idempotent at the receiver (same key, same
                # reason): run them again once their incident fires, rather than lose them.
                await self._actions.finish(row.id, "deferred", f"{CUT_SHORT}: will run again")
                spec = ActionSpec(kind, dict(row.params))
                self.waiting[row.id] = Waiting(
                    row.id, row.incident_id, spec, name=row.action, cut_short=True
                )
                continue
            # A reset may have run; running it twice is not safe. People decide. So with a
            # requeue, which may have left its job held between its requeuehold and release,
            # and a reboot, which may have been asked for (scontrol show node says).
            job = row.params.get("job") if kind == "requeue_job" else None
            held = f": job {job} may be held in Slurm (scontrol release {job})" if job else ""
            if kind == "reboot_node":
                held = f": {row.node} may be rebooting (scontrol show node {row.node})"
            await self._actions.finish(row.id, "failed", CUT_SHORT + held)

    async def settle(
        self,
        firing: Callable[[str], tuple[IncidentRow, Rule] | None],
        holds: Callable[[str], bool | None] | None = None,
    ) -> None:
        """Run what waits, if it may run now.

        Drains wait for room under the cap, oldest first (a later drain never jumps the queue);
        resets wait for their GPU to be idle, asked again every ``reset_retry_s``. What waits
        for an incident that no longer fires is dropped. ``firing`` finds a firing incident
        (with its rule) by id. A waiting drain is also dropped when ``holds`` says its rule's
        condition no longer holds on its target: ``keep_firing_for`` keeps an incident firing
        for a while after its fault cleared, and a node must not be drained for a fault it no
        longer has (counted in :attr:`dropped_cleared`). Not so a drain a restart cut short: it
        was decided, and may have been sent, while the fault held; the restarted collector's
        model has lost the history a rule like ``increase(..., "24h")`` reads, so its "no
        longer holds" would drop a drain that is owed.
        """
        drains_blocked = False
        for action_id, wait in list(self.waiting.items()):
            found = firing(wait.incident_id)
            if found is None:
                del self.waiting[action_id]
                why = f"the incident stopped firing while the {wait.spec.name} waited"
                await self._actions.finish(action_id, "skipped", why)
                continue
            if (
                wait.spec.name == "drain_node"
                and not wait.cut_short
                and holds is not None
                and holds(wait.incident_id) is False
            ):
                del self.waiting[action_id]
                self.dropped_cleared += 1
                incident, rule = found
                why = (
                    f"the fault cleared while the drain_node waited: {rule.name} no longer "
                    f"holds on {incident.target}"
                )
                log.info("waiting_drain_dropped", incident=incident.id, why=why)
                await self._actions.finish(action_id, "skipped", why)
                continue
            if wait.spec.name == "drain_node":
                if not drains_blocked:
                    drains_blocked = await self._settle_drain(action_id, wait, *found)
            elif self._clock.monotonic() >= wait.next_try or self._checks.gpu_freed(found[0]):
                await self._settle_reset(action_id, wait, *found)

    async def _settle_drain(
        self, action_id: int, wait: Waiting, incident: IncidentRow, rule: Rule
    ) -> bool:
        """Run a waiting drain if there is room now; True when drains stay blocked."""
        state, why = self._checks.refusal(incident, rule, wait.spec)
        if state == "deferred":
            return True  # still no room: later drains wait behind this one
        del self.waiting[action_id]
        if state == "planned":
            draining = self._checks.draining
            draining.add(incident.node)  # hold the place under the cap across the await
            try:
                state, why = await self._actions.reopen_decided(action_id, incident, wait.spec)
            finally:
                draining.discard(incident.node)
            if state == "deferred":  # another collector took the room first
                self.waiting[action_id] = wait
                return True
        if state == TAKEN:
            return False
        if state != "planned":
            await self._actions.finish(action_id, state, why)
            return False
        await self._run(action_id, incident, rule, wait.spec, wait.name)
        return False

    async def _settle_reset(
        self, action_id: int, wait: Waiting, incident: IncidentRow, rule: Rule
    ) -> None:
        """Ask again for a reset that waited for its GPU to be idle."""
        del self.waiting[action_id]
        state, why = self._checks.refusal(incident, rule, wait.spec)
        if state == "planned":  # not silenced, the GPU not reset for another incident
            state, why = await self._actions.reopen_decided(action_id, incident, wait.spec)
        if state == TAKEN:
            return
        if state != "planned":
            await self._actions.finish(action_id, state, why)
            return
        outcome = await self._run(action_id, incident, rule, wait.spec, wait.name)
        if wait.spec.name == "reset_gpu" and not outcome.ok and not outcome.retry:
            await self._escalate(incident, rule)
