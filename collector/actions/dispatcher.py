"""Runs what firing incidents ask for, safely, and journals every step.

Each action of an incident has an idempotency key (action and incident); it is journaled before
it runs and its outcome after, and a key already in the journal never runs again, so a collector
restart or a replayed transition cannot drain or reset twice. Before a drain or a reset runs:

* suppressed or silenced incidents, and dry-run (global or the rule's), run nothing;
* a node gets at most one drain per ``node_cooldown_s``, a GPU at most one reset;
* drains stop at ``max_drained_nodes`` or ``max_drained_share`` of the fleet drained by
  fleetwatch at once;
* a circuit breaker opens when more than ``breaker_max_drains`` drains start within
  ``breaker_window_s``, and closes ``breaker_cooldown_s`` after it opened.

A reset the agent refuses for now (compute processes on the GPU) waits, journaled as
``deferred`` with the training job's ranks that hold the GPU (``gpu_ranks``, from the job book),
and is asked again every ``reset_retry_s`` while its incident fires, or at once when every rank
process on the GPU has ended: the GPU is reset once it is idle. ``reset_gpu: {drain_first:
true}`` drains the node first, so no new job lands there and the reset runs when the running
ones are gone. A reset that ran and failed
escalates at once.

A drain held back by the cap or the breaker waits (journaled as ``deferred``): it runs when room
comes back while its incident still fires, and is dropped when the incident resolves. Waiting
drains survive a restart (they are read back from the journal). :meth:`Dispatcher.status` feeds
the ``fleet`` variables of the rules, so the built-in ``drain_cap_reached`` rule raises a
fleet-level incident while drains wait.

Several collectors may share one journal (PostgreSQL). Then a drain or a reset is decided again
in the journal under the fleet lock (:meth:`IncidentStore.decide_action`), against what every
collector is doing: a node drained or draining anywhere is not drained again, a GPU being reset
anywhere is not reset again, cooldowns count every collector's actions, the cap counts every
drained node against every node in the journal, and the breaker counts every drain (and, once
open, holds for all). So an action runs once fleet-wide, even when a node's agent moved to
another collector that opened its own incident for the same fault.

What leaves the collector is built from fixed words and checked names only
(:mod:`collector.actions.guards`): a drain's node and reason, a webhook's idempotency key, the
GPU a reset names. An action whose arguments fail those checks, or that the agent refuses for
good, is journaled as ``refused`` (and counted as that outcome) and runs nothing.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from collector.actions.fleet_checks import drain_refusal, reset_refusal
from collector.actions.guards import (
    REASON_PREFIX,
    UnsafeArgumentError,
    check_node,
    delivery_key,
    drain_reason,
)
from collector.actions.tally import UNFINISHED, ActionTally
from collector.jobs.processes import GONE
from collector.store.incidents import ActionRow, FleetActions
from rules.model import ActionSpec

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.actions.safety import SafetyConfig
    from collector.model.fleet import FleetModel
    from collector.store.incidents import IncidentRow
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock
    from rules.model import Rule

log = structlog.get_logger("collector.actions")

__all__ = [
    "REASON_PREFIX",
    "ActionOutcome",
    "Dispatcher",
    "Drainer",
    "GpuResetter",
    "Notifier",
    "refused",
]

# Actions safe to send again with the same idempotency key after a crash cut them short.
REPEATABLE = frozenset({"drain_node", "notify"})
TAKEN = "taken"  # a waiting action another collector on the shared journal took up
CUT_SHORT = "collector restarted before the outcome was known"


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


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A drain held back by the cap or the breaker, journaled as action ``action_id``."""

    action_id: int
    incident_id: str
    spec: ActionSpec
    next_try: float = 0.0  # monotonic; resets wait for their GPU to be idle
    name: str = ""  # the journaled name when it differs (escalated_...)
    cut_short: bool = False  # decided (and maybe sent) before a restart: runs again as it was


@dataclass(slots=True)
class Planned:
    """The first action of one of a firing's chains, decided before the firing was journaled.

    Its place (the node under the drain cap, the GPU) is held from the decision until the
    action runs, as it is across the journal's round trip when the action is decided later.
    """

    spec: ActionSpec
    name: str
    state: str
    why: str
    row: ActionRow
    busy: set[str] | None
    where: str
    action_id: int = 0
    new: bool = False

    def release(self) -> None:
        """Give the held place back (once)."""
        if self.busy is not None:
            self.busy.discard(self.where)
            self.busy = None


@dataclass(slots=True)
class FirePlan:
    """What :meth:`Dispatcher.plan` decided: journal :meth:`rows` with the incident.

    Then hand the plan to :meth:`Dispatcher.fire` (after :meth:`journaled`), or
    :meth:`release` it when the journal refused the rows.
    """

    firsts: list[Planned]

    def rows(self) -> list[ActionRow]:
        """The action rows to journal, in the same transaction as their incident's."""
        return [first.row for first in self.firsts]

    def journaled(self, results: list[tuple[int, bool]]) -> None:
        """The journal's (id, new) for each of :meth:`rows`, in order."""
        for first, (action_id, new) in zip(self.firsts, results, strict=True):
            first.action_id, first.new = action_id, new

    def release(self) -> None:
        """Give every held place back (the rows were not journaled)."""
        for first in self.firsts:
            first.release()


class Dispatcher:
    """The action sink of the incident service."""

    def __init__(  # noqa: PLR0913 - every kind of actuator is injected
        self,
        *,
        journal: Journal,
        fleet: FleetModel,
        clock: Clock,
        safety: SafetyConfig,
        drainers: tuple[Drainer, ...] = (),
        notifier: Notifier | None = None,
        resetter: GpuResetter | None = None,
        gpu_ranks: Callable[[str, int], list[tuple[str, int, str]]] | None = None,
    ) -> None:
        """Nothing is drained until :meth:`start` has read what the journal says.

        ``gpu_ranks(node, index)`` names the (job, rank, process state) on a GPU.
        """
        self._gpu_ranks = gpu_ranks
        self._journal = journal
        self._fleet = fleet
        self._clock = clock
        self.safety = safety
        self._drainers = drainers
        self._notifier = notifier
        self._resetter = resetter
        self.drained: dict[str, str] = {}  # node -> incident that drained it
        self._last_action: dict[tuple[str, str], float] = {}
        self._drain_starts: deque[float] = deque()
        self.breaker_open_until: float | None = None
        self.deferred = 0
        self.dropped_cleared = 0  # waiting drains dropped because their fault had cleared
        self.waiting: dict[int, _Waiting] = {}  # by action id, oldest first
        self.draining: set[str] = set()  # nodes whose drain is running now
        self.resetting: set[str] = set()  # GPUs (node/gpu/N) whose reset is running now
        self.tally = ActionTally(clock)
        self._unfinished: dict[int, tuple[str, str]] = {}  # action id -> (action, node)
        # Whose waiting and unfinished actions :meth:`start` takes up: every node's on a journal
        # of its own; on a shared one, the collector sets it to the nodes it watches.
        self.owns: Callable[[str], bool] = _everyone

    async def start(self) -> None:
        """Learn which nodes fleetwatch has drained, and settle actions a crash interrupted."""
        rows = await self._journal.do(lambda s: s.incidents.actions(limit=100_000))
        for row in reversed(rows):  # oldest first
            if not self.owns(row.node):
                # a peer's node (shared journal): the fleet-wide checks count it; counted here
                # too, against a cap of this collector's own nodes, it held this one's drains
                # back for good once the peers' drains filled it
                continue
            if row.action.endswith("drain_node") and row.state == "succeeded":
                self.drained[row.node] = row.incident_id
            elif row.action in ("resume_node", "release_node") and row.state == "succeeded":
                self.drained.pop(row.node, None)
        for row in reversed(rows):
            kind = row.action.removeprefix("escalated_")
            if not self.owns(row.node):
                continue  # a peer's node (shared journal): its collector settles it
            # a notification is deferred only by a start that found it cut short (below): a
            # crash before it ran again must not drop it
            if kind in ("drain_node", "reset_gpu", "notify") and row.state == "deferred":
                self.waiting[row.id] = _Waiting(
                    row.id,
                    row.incident_id,
                    ActionSpec(kind, dict(row.params)),
                    name=row.action,
                    cut_short=row.detail.startswith(CUT_SHORT),
                )
        await self._settle_unfinished()
        if self.drained or self.waiting:
            log.info("drains_known", drained=sorted(self.drained), waiting=len(self.waiting))

    async def _settle_unfinished(self) -> None:
        """Actions journaled as planned or running by the process before this one."""
        for row in await self._journal.do(lambda s: s.incidents.unfinished_actions()):
            if not self.owns(row.node):
                continue
            kind = row.action.removeprefix("escalated_")
            if kind in REPEATABLE:
                # Drains and notifications are idempotent at the receiver (same key, same
                # reason): run them again once their incident fires, rather than lose them.
                await self._finish(row.id, "deferred", f"{CUT_SHORT}: will run again")
                spec = ActionSpec(kind, dict(row.params))
                self.waiting[row.id] = _Waiting(
                    row.id, row.incident_id, spec, name=row.action, cut_short=True
                )
                continue
            # A reset may have run; running it twice is not safe. People decide.
            await self._finish(row.id, "failed", CUT_SHORT)

    def status(self) -> dict[str, Any]:
        """The drain counts rules see as ``fleet.*`` variables.

        ``drained_nodes``, ``drains_waiting``, ``drain_cap`` and ``drain_breaker_open``.
        """
        mono = self._clock.monotonic()
        return {
            "drained_nodes": len(self.drained),
            "drains_waiting": sum(w.spec.name == "drain_node" for w in self.waiting.values()),
            "drain_cap": self._cap(len(self._fleet.view())),
            "drain_breaker_open": self.breaker_open_until is not None
            and mono < self.breaker_open_until,
        }

    def _now_ms(self) -> int:
        return int(self._clock.now() * 1000)

    async def _finish(self, action_id: int, state: str, detail: str) -> None:
        now = self._now_ms()
        await self._journal.do(lambda s: s.incidents.finish_action(action_id, state, detail, now))
        meta = self._unfinished.get(action_id)
        if meta is not None and state not in UNFINISHED:
            del self._unfinished[action_id]
            self.tally.record(meta[0], state, meta[1])

    async def _reopen(self, action_id: int) -> None:
        await self._journal.do(lambda s: s.incidents.reopen_action(action_id, "running"))

    async def _reopen_decided(
        self, action_id: int, incident: IncidentRow, spec: ActionSpec
    ) -> tuple[str, str]:
        """Mark a waiting action running: fleet-wide under the lock when the journal is shared."""
        if not self._shared:
            await self._reopen(action_id)
            return "planned", ""

        def decide(fleet: FleetActions) -> tuple[str, str, int]:
            return self._fleet_refusal(incident, spec, fleet)

        now_ms, window_ms = self._now_ms(), int(self.safety.breaker_window_s * 1000)
        return await self._journal.do(
            lambda s: s.incidents.reopen_decided(
                action_id,
                decide,
                now_ms=now_ms,
                breaker_window_ms=window_ms,
                cooldown_ms=int(self.safety.node_cooldown_s * 1000),
            )
        )

    def _action_row(
        self, incident: IncidentRow, spec: ActionSpec, state: str, detail: str, action: str
    ) -> ActionRow:
        return ActionRow(
            idempotency_key=f"{action}:{incident.id}",
            incident_id=incident.id,
            action=action,
            node=incident.node,
            target=incident.target,
            state=state,
            created_ms=self._now_ms(),
            params=dict(spec.params),
            detail=detail,
            finished_ms=None if state in ("planned", "running") else self._now_ms(),
        )

    def _count_new(self, action_id: int, action: str, state: str, node: str) -> None:
        if state in UNFINISHED:
            self._unfinished[action_id] = (action, node)
        else:
            self.tally.record(action, state, node)

    async def _journal_action(
        self,
        incident: IncidentRow,
        spec: ActionSpec,
        state: str,
        detail: str,
        name: str | None = None,
    ) -> tuple[int, bool]:
        action = name or spec.name
        row = self._action_row(incident, spec, state, detail, action)
        action_id, new = await self._journal.do(lambda s: s.incidents.add_action(row))
        if new:
            self._count_new(action_id, action, state, incident.node)
        return action_id, new

    @property
    def _shared(self) -> bool:
        return self._journal.store.shared

    async def _journal_fleet_wide(
        self, incident: IncidentRow, spec: ActionSpec, name: str
    ) -> tuple[int, bool, str, str]:
        """Journal a drain or reset the local checks let through, deciding it fleet-wide."""
        row = self._action_row(incident, spec, "planned", "", name)

        def decide(fleet: FleetActions) -> tuple[str, str, int]:
            return self._fleet_refusal(incident, spec, fleet)

        window_ms = int(self.safety.breaker_window_s * 1000)
        action_id, new, state, why = await self._journal.do(
            lambda s: s.incidents.decide_action(
                row,
                decide,
                breaker_window_ms=window_ms,
                cooldown_ms=int(self.safety.node_cooldown_s * 1000),
            )
        )
        if new:
            self._count_new(action_id, name, state, incident.node)
        return action_id, new, state, why

    def _fleet_refusal(
        self, incident: IncidentRow, spec: ActionSpec, fleet: FleetActions
    ) -> tuple[str, str, int]:
        """(state, why, open the breaker until ms) from every collector's actions."""
        now_ms = self._now_ms()
        if spec.name == "reset_gpu":
            return reset_refusal(_cooldown_key(incident, spec), fleet, now_ms, self.safety)
        size = max(fleet.nodes, len(self._fleet.view()))
        return drain_refusal(
            incident, fleet, now_ms=now_ms, safety=self.safety, cap=self._cap(size), size=size
        )

    def _refusal(self, incident: IncidentRow, rule: Rule, spec: ActionSpec) -> tuple[str, str]:
        """(state, why) when the action must not run now; ("planned", "") when it may."""
        why = (
            (incident.suppressed_by and f"suppressed by {incident.suppressed_by}")
            or (incident.silenced_by and f"silenced by {incident.silenced_by}")
            or (
                spec.name == "drain_node"
                and incident.node in self.drained
                and f"{incident.node} is already drained by {self.drained[incident.node]}"
            )
            or (
                spec.name == "drain_node"
                and incident.node in self.draining
                and f"{incident.node} is being drained for another incident"
            )
            or (
                spec.name == "reset_gpu"
                and _cooldown_key(incident, spec) in self.resetting
                and f"{_cooldown_key(incident, spec)} is being reset for another incident"
            )
        )
        if why:
            return "skipped", why
        if self.safety.dry_run or rule.dry_run:
            return "dry_run", "dry run: nothing was done"
        mono = self._clock.monotonic()
        where = _cooldown_key(incident, spec)
        last = self._last_action.get((where, spec.name))
        if spec.name != "notify" and last is not None and mono - last < self.safety.node_cooldown_s:
            return (
                "skipped",
                f"cooldown: {spec.name} ran on {where} {mono - last:.0f} s ago",
            )
        if spec.name == "drain_node":
            return self._drain_refusal(mono)
        return "planned", ""

    def drains(self) -> dict[str, Any]:
        """Nodes fleetwatch holds drained (and by which incident), and the drains that wait."""
        return {
            "drained": dict(sorted(self.drained.items())),
            "waiting": [
                {"action_id": w.action_id, "incident": w.incident_id, "action": w.spec.name}
                for w in self.waiting.values()
            ],
            **self.status(),
        }

    async def release(self, node: str, reason: str) -> bool:
        """A person says ``node`` is back in service; it stops counting toward the drain cap.

        For nodes resumed outside fleetwatch (by hand in Slurm, after a repair). Journaled;
        False when fleetwatch held no drain of it.
        """
        incident = self.drained.pop(node, None)
        if incident is None:
            return False
        row = ActionRow(
            idempotency_key=f"release_node:{incident}:{self._now_ms()}",
            incident_id=incident,
            action="release_node",
            node=node,
            target=node,
            state="succeeded",
            created_ms=self._now_ms(),
            params={},
            detail=f"released by a person: {reason}" if reason else "released by a person",
            finished_ms=self._now_ms(),
        )
        await self._journal.do(lambda s: s.incidents.add_action(row))
        self.tally.record("release_node", "succeeded", node)
        log.warning("drain_released", node=node, incident=incident, reason=reason)
        return True

    def _cap(self, fleet_size: int) -> int:
        return min(
            self.safety.max_drained_nodes,
            max(1, math.floor(fleet_size * self.safety.max_drained_share)),
        )

    def _drain_refusal(self, mono: float) -> tuple[str, str]:
        if self.breaker_open_until is not None:
            if mono < self.breaker_open_until:
                return "deferred", "circuit breaker open: drains came too fast"
            self.breaker_open_until = None
        fleet_size = len(self._fleet.view())
        cap = self._cap(fleet_size)
        taken = len(self.drained) + len(self.draining)
        if taken >= cap:
            return (
                "deferred",
                f"drain cap reached: {taken} of {fleet_size} nodes drained or draining (cap {cap})",
            )
        while self._drain_starts and mono - self._drain_starts[0] > self.safety.breaker_window_s:
            self._drain_starts.popleft()
        if len(self._drain_starts) >= self.safety.breaker_max_drains:
            self.breaker_open_until = mono + self.safety.breaker_cooldown_s
            log.error("drain_breaker_open", drains=len(self._drain_starts))
            return "deferred", "circuit breaker opened: drains came too fast"
        return "planned", ""

    async def fire(
        self,
        incident: IncidentRow,
        rule: Rule,
        actions: tuple[ActionSpec, ...],
        *,
        escalation: bool = False,
        plan: FirePlan | None = None,
    ) -> None:
        """Run the firing incident's actions, each journaled twice (see :meth:`_fire`).

        A GPU reset that fails escalates at once: the rule's escalation actions run for this
        incident (a reset that cannot help is no reason to wait for the fault to come back).
        ``escalation``: these are the escalation's actions (the incident fired escalated, or the
        fault came back while it fired and escalated it), journaled as ``escalated_<action>``
        (as a failed reset's are, so an incident runs each escalation action once, whichever
        way it escalated). ``plan``: what :meth:`plan` decided for these actions and the
        journal took with the incident; the first action of each chain is not decided again.
        """
        if escalation:
            await self._fire(incident, rule, _expand(actions), prefix="escalated_", plan=plan)
            return
        failed_reset = await self._fire(incident, rule, _expand(actions), plan=plan)
        if failed_reset:
            await self._escalate(incident, rule)

    def plan(
        self,
        incident: IncidentRow,
        rule: Rule,
        actions: tuple[ActionSpec, ...],
        *,
        escalation: bool = False,
    ) -> FirePlan | None:
        """Decide the first action of each chain of a firing now, to journal with the incident.

        A firing's first actions were journaled in a writer call of their own after the
        incident's: at 4,096 nodes that round trip through the busy event loop was a good part
        of a fault's way to its webhook. Decided here, with the places they take held, their
        rows go in the incident's own transaction. None on a shared journal (a drain or a
        reset is decided under the fleet lock there) and when there is nothing to run.
        """
        if self._shared:
            return None
        prefix = "escalated_" if escalation else ""
        plan = FirePlan([])
        try:
            for chain in _chains(_expand(actions)):
                spec = chain[0]
                state, why = self._refusal(incident, rule, spec)
                busy = self._busy_set(spec) if state == "planned" else None
                where = _place(incident, spec)
                name = f"{prefix}{spec.name}"
                row = self._action_row(incident, spec, state, why, name)
                if busy is not None:
                    busy.add(where)
                plan.firsts.append(Planned(spec, name, state, why, row, busy, where))
        except BaseException:
            plan.release()
            raise
        return plan if plan.firsts else None

    async def _escalate(self, incident: IncidentRow, rule: Rule) -> None:
        esc = rule.escalation
        if esc is not None and not incident.escalated:
            log.warning("reset_failed_escalating", incident=incident.id, rule=rule.name)
            await self._fire(incident, rule, _expand(esc.actions), prefix="escalated_")

    async def _fire(
        self,
        incident: IncidentRow,
        rule: Rule,
        actions: tuple[ActionSpec, ...],
        prefix: str = "",
        plan: FirePlan | None = None,
    ) -> bool:
        """Run ``actions``; True when a GPU reset among them ran and failed.

        Drains and resets run in the order listed, one after another (a drain before a reset
        keeps new jobs off the GPU). Notifications go out at once, beside them: a page says
        nothing about how the drain or reset went, and a reset may take minutes (the agent
        waits up to 180 s for it), so waiting behind one only makes the page late. The first
        chain runs in this task, the others in tasks of their own: a task starts a turn of the
        event loop later, and a turn of a busy collector's loop is milliseconds.
        """
        chains = _chains(actions)
        if not chains:
            return False
        firsts: list[Planned | None] = list(plan.firsts) if plan is not None else []
        firsts += [None] * (len(chains) - len(firsts))
        others = [
            asyncio.ensure_future(self._fire_in_order(incident, rule, chain, prefix, first))
            for chain, first in zip(chains[1:], firsts[1:], strict=True)
        ]
        results: list[bool | BaseException] = []
        try:
            results.append(await self._fire_in_order(incident, rule, chains[0], prefix, firsts[0]))
        except Exception as exc:  # noqa: BLE001 - raised below, once the others ran
            results.append(exc)
        except BaseException:  # cancelled: so are the chains beside this one
            for other in others:
                other.cancel()
            raise
        if others:
            results += await asyncio.gather(*others, return_exceptions=True)
        for result in results:  # each ran to its end; the first failure goes on up
            if isinstance(result, BaseException):
                raise result
        return any(results)

    async def _fire_in_order(
        self,
        incident: IncidentRow,
        rule: Rule,
        actions: tuple[ActionSpec, ...],
        prefix: str,
        first: Planned | None = None,
    ) -> bool:
        """Run ``actions`` one after another; True when a GPU reset among them ran and failed.

        ``first``: the first action, decided and journaled already (:meth:`plan`).
        """
        failed_reset = False
        for i, spec in enumerate(actions):
            if i == 0 and first is not None:
                first.release()  # _run_journaled holds the place again while it runs
                action_id, new, state, why = first.action_id, first.new, first.state, first.why
                name = first.name
                if new:
                    self._count_new(action_id, name, state, incident.node)
            else:
                action_id, new, state, why, name = await self._decide(incident, rule, spec, prefix)
            if not new:  # this action of this incident was decided before: never twice
                if spec.name == "reset_gpu" and await self._reset_failed(action_id):
                    failed_reset = True  # a crash cut its escalation short: hand that on
                continue
            if state != "planned":
                if state == "deferred":
                    self.deferred += 1
                    self.waiting[action_id] = _Waiting(action_id, incident.id, spec, name=name)
                log.warning("action_not_run", action=name, incident=incident.id, why=why)
                continue
            outcome = await self._run_journaled(action_id, incident, rule, spec, name)
            failed_reset |= spec.name == "reset_gpu" and not outcome.ok and not outcome.retry
        return failed_reset

    async def _decide(
        self, incident: IncidentRow, rule: Rule, spec: ActionSpec, prefix: str
    ) -> tuple[int, bool, str, str, str]:
        """Decide an action and journal it: (id, new, state, why, journaled name)."""
        state, why = self._refusal(incident, rule, spec)
        busy = self._busy_set(spec) if state == "planned" else None
        where = _place(incident, spec)
        if busy is not None:  # hold the place (cap, GPU) before anything awaits
            busy.add(where)
        name = f"{prefix}{spec.name}"
        try:
            if busy is not None and self._shared:  # a planned drain or reset
                action_id, new, state, why = await self._journal_fleet_wide(incident, spec, name)
            else:
                action_id, new = await self._journal_action(incident, spec, state, why, name)
        finally:
            if busy is not None:
                busy.discard(where)
        return action_id, new, state, why, name

    async def _reset_failed(self, action_id: int) -> bool:
        """Whether the journaled reset ``action_id`` ended failed or refused for good."""
        row = await self._journal.do(lambda s: s.incidents.action(action_id))
        return row is not None and row.state in ("failed", "refused")

    def _busy_set(self, spec: ActionSpec) -> set[str] | None:
        """Where an action of this kind marks what it is working on, if anywhere."""
        return {"drain_node": self.draining, "reset_gpu": self.resetting}.get(spec.name)

    async def _run_journaled(
        self, action_id: int, incident: IncidentRow, rule: Rule, spec: ActionSpec, name: str = ""
    ) -> ActionOutcome:
        """Run an action journaled as ``action_id``; record its outcome.

        A reset the agent refuses for now (a busy GPU) is journaled as deferred and waits:
        :meth:`settle` asks again every ``reset_retry_s`` while the incident fires.
        """
        draining = spec.name == "drain_node"
        if draining:
            self._drain_starts.append(self._clock.monotonic())
        busy = self._busy_set(spec)
        where = _place(incident, spec)
        if busy is not None:
            busy.add(where)  # a drain counts toward the cap while it runs
        try:
            outcome = await self._run(incident, rule, spec, name or spec.name)
        finally:
            if busy is not None:
                busy.discard(where)
        if draining and outcome.ok:
            self.drained[incident.node] = incident.id
        if not outcome.retry:  # a refusal for now is not an action that ran
            self._last_action[_cooldown_key(incident, spec), spec.name] = self._clock.monotonic()
        if outcome.retry:
            self.deferred += 1
            retry_at = self._clock.monotonic() + self.safety.reset_retry_s
            self.waiting[action_id] = _Waiting(action_id, incident.id, spec, retry_at, name)
            holders = self._holders(incident)
            held = f"; held by {holders}" if holders else ""
            await self._finish(action_id, "deferred", f"waiting: {outcome.detail}{held}")
            return outcome
        state = "refused" if outcome.refused else "succeeded" if outcome.ok else "failed"
        await self._finish(action_id, state, outcome.detail)
        log.info(
            "action_done",
            action=spec.name,
            incident=incident.id,
            node=incident.node,
            ok=outcome.ok,
            detail=outcome.detail,
        )
        return outcome

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
                await self._finish(action_id, "skipped", why)
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
                await self._finish(action_id, "skipped", why)
                continue
            if wait.spec.name == "drain_node":
                if not drains_blocked:
                    drains_blocked = await self._settle_drain(action_id, wait, *found)
            elif self._clock.monotonic() >= wait.next_try or self._gpu_freed(found[0]):
                await self._settle_reset(action_id, wait, *found)

    def _ranks_on(self, incident: IncidentRow) -> list[tuple[str, int, str]]:
        """The training ranks on the incident's GPU (none known: empty)."""
        if self._gpu_ranks is None or "/gpu/" not in incident.target:
            return []
        node, _, rest = incident.target.partition("/gpu/")
        index = rest.split("/", 1)[0]
        return self._gpu_ranks(node, int(index)) if index.isdigit() else []

    def _holders(self, incident: IncidentRow) -> str:
        """``job J rank R (hung)``, ... for the ranks on the incident's GPU."""
        ranks = self._ranks_on(incident)
        return ", ".join(f"job {j} rank {r}" + (f" ({s})" if s else "") for j, r, s in ranks[:4])

    def _gpu_freed(self, incident: IncidentRow) -> bool:
        """Every rank process known on the incident's GPU has ended (ask for the reset now)."""
        ranks = self._ranks_on(incident)
        return bool(ranks) and all(state in GONE for _, _, state in ranks)

    async def _settle_drain(
        self, action_id: int, wait: _Waiting, incident: IncidentRow, rule: Rule
    ) -> bool:
        """Run a waiting drain if there is room now; True when drains stay blocked."""
        state, why = self._refusal(incident, rule, wait.spec)
        if state == "deferred":
            return True  # still no room: later drains wait behind this one
        del self.waiting[action_id]
        if state == "planned":
            self.draining.add(incident.node)  # hold the place under the cap across the await
            try:
                state, why = await self._reopen_decided(action_id, incident, wait.spec)
            finally:
                self.draining.discard(incident.node)
            if state == "deferred":  # another collector took the room first
                self.waiting[action_id] = wait
                return True
        if state == TAKEN:
            return False
        if state != "planned":
            await self._finish(action_id, state, why)
            return False
        await self._run_journaled(action_id, incident, rule, wait.spec, wait.name)
        return False

    async def _settle_reset(
        self, action_id: int, wait: _Waiting, incident: IncidentRow, rule: Rule
    ) -> None:
        """Ask again for a reset that waited for its GPU to be idle."""
        del self.waiting[action_id]
        state, why = self._refusal(incident, rule, wait.spec)
        if state == "planned":  # not silenced, the GPU not reset for another incident
            state, why = await self._reopen_decided(action_id, incident, wait.spec)
        if state == TAKEN:
            return
        if state != "planned":
            await self._finish(action_id, state, why)
            return
        outcome = await self._run_journaled(action_id, incident, rule, wait.spec, wait.name)
        if wait.spec.name == "reset_gpu" and not outcome.ok and not outcome.retry:
            await self._escalate(incident, rule)

    async def _run(
        self, incident: IncidentRow, rule: Rule, spec: ActionSpec, name: str
    ) -> ActionOutcome:
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
                drain_reason(rule.name, incident.node, incident.target, incident.id)
                if spec.name == "drain_node"
                else ""
            )
        except UnsafeArgumentError as exc:
            return _refuse(name, incident, exc)
        if spec.name == "drain_node":
            return await self._all(d.drain(incident.node, reason, key) for d in self._drainers)
        if spec.name == "notify" and self._notifier is not None:
            payload = _incident_payload(incident, rule)
            payload["escalated"] = incident.escalated or name.startswith("escalated_")
            return await self._notifier.notify(str(spec.params["channel"]), payload, key)
        if spec.name == "reset_gpu" and self._resetter is not None:
            # Never forced from a rule: with drain_first the drain ran before (see _expand)
            # and the reset waits until the jobs have left the GPU.
            return await self._resetter.reset(incident.node, incident.target, force=False)
        return ActionOutcome(ok=False, detail=f"{spec.name}: no actuator is configured")

    @staticmethod
    async def _all(runs: object) -> ActionOutcome:
        outcomes = await asyncio.gather(*runs)  # type: ignore[misc]
        if not outcomes:
            return ActionOutcome(ok=False, detail="no drain adapter is configured")
        return ActionOutcome(
            ok=all(o.ok for o in outcomes),
            detail="; ".join(o.detail for o in outcomes),
            refused=all(o.refused for o in outcomes),
        )

    async def resolve(self, incident: IncidentRow, rule: Rule) -> None:
        """Resume a node this incident drained, when its drain action asks for that."""
        wants_resume = any(
            spec.name == "drain_node" and spec.params.get("resume_on_resolve")
            for spec in rule.actions + (rule.escalation.actions if rule.escalation else ())
        )
        if not wants_resume or self.drained.get(incident.node) != incident.id:
            return
        spec = ActionSpec("resume_node")
        action_id, new = await self._journal_action(incident, spec, "running", "", "resume_node")
        if not new:
            return
        try:
            key = delivery_key("resume_node", incident.id)
            node = check_node(incident.node)
        except UnsafeArgumentError as exc:
            outcome = _refuse("resume_node", incident, exc)
        else:
            outcome = await self._all(d.resume(node, key) for d in self._drainers)
        if outcome.ok:
            self.drained.pop(incident.node, None)
        state = "refused" if outcome.refused else "succeeded" if outcome.ok else "failed"
        await self._finish(action_id, state, outcome.detail)


def _everyone(_node: str) -> bool:
    return True


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


def _place(incident: IncidentRow, spec: ActionSpec) -> str:
    """What an action holds while it is decided and runs: a drain its node, a reset its GPU."""
    return incident.node if spec.name == "drain_node" else _cooldown_key(incident, spec)


def _cooldown_key(incident: IncidentRow, spec: ActionSpec) -> str:
    """Cooldowns are per node, except resets: per GPU (``node/gpu/N``)."""
    if spec.name == "reset_gpu" and "/gpu/" in incident.target:
        node, _, rest = incident.target.partition("/gpu/")
        return f"{node}/gpu/{rest.split('/', 1)[0]}"
    return incident.node


def _chains(actions: tuple[ActionSpec, ...]) -> list[tuple[ActionSpec, ...]]:
    """What runs one after another: the drains and resets in order, then each notification."""
    ordered = tuple(spec for spec in actions if spec.name != "notify")
    notes = [(spec,) for spec in actions if spec.name == "notify"]
    return ([ordered] if ordered else []) + notes


def _expand(actions: tuple[ActionSpec, ...]) -> tuple[ActionSpec, ...]:
    """``reset_gpu: {drain_first: true}`` is a drain (no new jobs), then a reset once idle."""
    out: list[ActionSpec] = []
    for spec in actions:
        if spec.name == "reset_gpu" and spec.params.get("drain_first"):
            out.append(ActionSpec("drain_node"))
        out.append(spec)
    return tuple(out)


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
