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

``requeue_job`` requeues the training job whose rank the GPU rule saw (``gpu_job``), kept off
the incident's node, only while ``requeue_on()`` says requeueing is switched on (skipped
otherwise): once per incident, not again for the same job within ``requeue_cooldown_s``, at
most ``max_requeues`` within ``requeue_window_s``, never in dry run. It never waits: what the
limits hold back is skipped. These limits count this collector's requeues (and, after a restart,
what its journal holds), not a peer's on a shared journal.

``reboot_node`` reboots the incident's node through the scheduler (Slurm's ``reboot ASAP
nextstate=DOWN``, or a webhook whose receiver drains first), once per ``reboot_cooldown_s`` per
node, at most ``max_rebooting_nodes`` in flight, and under the drain cap when the node is still
in service (:mod:`~collector.actions.local_checks`); the node is then held drained by the
incident and in repair. ``rma_ticket`` sends the incident, its GPU and the node's evidence
bundle (built in a worker thread, :mod:`~collector.actions.rma`) to the RMA webhook; the node
is then in RMA.

The dispatcher coordinates; the parts are :mod:`~collector.actions.local_checks` (may it run
now), :mod:`~collector.actions.journaling` (rows, plans, outcomes in the journal),
:mod:`~collector.actions.waiting` (what waits, and settling it), :mod:`~collector.actions.actuation`
(running it through the adapters) and :mod:`~collector.actions.ports` (the adapters' protocols).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from collector.actions.actuation import Actuation
from collector.actions.journaling import ActionJournal, chains, expand
from collector.actions.local_checks import SafetyChecks
from collector.actions.rma import BundleReads
from collector.actions.waiting import Waiting, WaitingActions
from collector.model.lifecycle import (
    OUT_OF_SERVICE,
    PERSON_MOVES,
    Lifecycle,
    LifecycleError,
    State,
)
from rules.model import ActionSpec

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.actions.journaling import FirePlan, Planned
    from collector.actions.ports import (
        ActionOutcome,
        Drainer,
        GpuResetter,
        JobRequeuer,
        Notifier,
        Rebooter,
        Ticketer,
    )
    from collector.actions.rma import BuildBundle
    from collector.actions.safety import SafetyConfig
    from collector.actions.tally import ActionTally
    from collector.model.fleet import FleetModel
    from collector.store.incidents import IncidentRow
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock
    from rules.model import Rule

log = structlog.get_logger("collector.actions")

# Where an accepted reboot or RMA ticket moves its node in the lifecycle.
_MOVES = {"reboot_node": State.IN_REPAIR, "rma_ticket": State.RMA}

__all__ = ["Dispatcher"]


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
        requeuer: JobRequeuer | None = None,
        gpu_job: Callable[[str, int], str | None] | None = None,
        requeue_on: Callable[[], bool] | None = None,
        rebooters: tuple[Rebooter, ...] = (),
        ticketer: Ticketer | None = None,
        evidence: BuildBundle | None = None,
    ) -> None:
        """Nothing is drained until :meth:`start` has read what the journal says.

        ``rebooters`` run ``reboot_node``, ``ticketer`` ``rma_ticket``, whose tickets carry
        the node's evidence bundle as ``evidence`` builds it (blocking; run in a worker thread).

        ``gpu_ranks(node, index)`` names the (job, rank, process state) on a GPU, ``gpu_job``
        the job of the rank a GPU rule sees there (the one ``requeue_job`` requeues through
        ``requeuer``). ``requeue_on()`` says whether requeueing is switched on (None: whenever
        a requeuer is given).
        """
        self._clock = clock
        if requeue_on is None:
            requeue_on = (lambda: True) if requeuer is not None else (lambda: False)
        self._checks = SafetyChecks(
            config=safety,
            fleet=fleet,
            clock=clock,
            gpu_ranks=gpu_ranks,
            gpu_job=gpu_job,
            requeue_on=requeue_on,
        )
        self._actuation = Actuation(
            drainers,
            notifier,
            resetter,
            requeuer,
            job_of=self._checks.job_of,
            rebooters=rebooters,
            ticketer=ticketer,
            bundles=BundleReads(evidence) if evidence is not None else None,
            node_state=lambda node: fleet.view().get(node),
            now=clock.now,
        )
        self._actions = ActionJournal(journal, clock, self._checks)
        self._waits = WaitingActions(
            actions=self._actions,
            checks=self._checks,
            clock=clock,
            run=self._run_journaled,
            escalate=self._escalate,
        )
        # Each node's lifecycle: a drain that succeeded, a release (None: not kept).
        self.lifecycle: Lifecycle | None = None
        # Starts the re-qualification of a repaired node (node, actor, why) -> started; None:
        # a repaired node is released at once ([collector] requalify = "").
        self.requalify: Callable[[str, str, str], bool] | None = None
        # Whose waiting and unfinished actions :meth:`start` takes up: every node's on a journal
        # of its own; on a shared one, the collector sets it to the nodes it watches.
        self.owns: Callable[[str], bool] = _everyone

    @property
    def safety(self) -> SafetyConfig:
        """The limits in force (a reload replaces them)."""
        return self._checks.config

    @safety.setter
    def safety(self, config: SafetyConfig) -> None:
        self._checks.config = config

    @property
    def drained(self) -> dict[str, str]:
        """Nodes fleetwatch holds drained, and the incident that drained each."""
        return self._checks.drained

    @property
    def draining(self) -> set[str]:
        """Nodes whose drain is running now."""
        return self._checks.draining

    @property
    def waiting(self) -> dict[int, Waiting]:
        """The actions that wait, by action id, oldest first."""
        return self._waits.waiting

    @property
    def deferred(self) -> int:
        """How many actions were held back to wait."""
        return self._waits.deferred

    @property
    def dropped_cleared(self) -> int:
        """Waiting drains dropped because their fault had cleared."""
        return self._waits.dropped_cleared

    @property
    def tally(self) -> ActionTally:
        """Actions counted by outcome."""
        return self._actions.tally

    async def start(self) -> None:
        """Learn which nodes fleetwatch has drained, and settle actions a crash interrupted."""
        rows = await self._actions.every_action()
        self._checks.learn_drained(rows, self.owns)
        self._checks.learn_requeued(rows, self.owns)
        self._checks.learn_rebooted(rows, self.owns)
        self._waits.take_up(rows, self.owns)
        await self._waits.settle_unfinished(self.owns)
        if self.drained or self.waiting:
            log.info("drains_known", drained=sorted(self.drained), waiting=len(self.waiting))

    def status(self) -> dict[str, Any]:
        """The drain counts rules see as ``fleet.*`` variables.

        ``drained_nodes``, ``drains_waiting``, ``drain_cap`` and ``drain_breaker_open``.
        """
        mono = self._clock.monotonic()
        checks = self._checks
        return {
            "drained_nodes": len(checks.drained),
            "drains_waiting": self._waits.drains_waiting(),
            "drain_cap": checks.cap(checks.fleet_size()),
            "drain_breaker_open": checks.breaker_open_until is not None
            and mono < checks.breaker_open_until,
        }

    def drains(self) -> dict[str, Any]:
        """Nodes fleetwatch holds drained (and by which incident), and the drains that wait."""
        return {
            "drained": dict(sorted(self.drained.items())),
            "waiting": self._waits.listed(),
            **self.status(),
        }

    async def release(
        self, node: str, reason: str, by: str = "", *, actor: str | None = None
    ) -> bool:
        """A person says ``node`` is back in service; it stops counting toward the drain cap.

        Its drain cooldown ends too (here and, through the journal, on every collector): a
        fault after the release drains it again at once.

        For nodes resumed outside fleetwatch (by hand in Slurm, after a repair). Journaled;
        False when fleetwatch held no drain of it.
        """
        incident = self.drained.pop(node, None)
        if incident is None:
            return False
        await self._actions.released(node, incident, reason)
        self._checks.released(node)
        if self.lifecycle is not None:
            who = actor or f"person:{by or 'unknown'}"  # a re-qualification passed: its run
            self.lifecycle.move(node, State.IN_SERVICE, actor=who, reason=reason)
        log.warning("drain_released", node=node, incident=incident, reason=reason)
        return True

    async def person_move(self, node: str, move: str, reason: str, by: str = "") -> dict[str, Any]:
        """A person moves ``node``: ``repair`` (in repair), ``rma``, or ``repaired``.

        A repaired node out of service is re-qualified (``requalify``: pre-flight, then released
        when it passes); without re-qualification, a repaired node that fleetwatch holds drained
        is released (as ``drains release`` does), one that is not goes back in service.

        Raises:
            LifecycleError: no lifecycle is kept, or the node may not go there from where it is.
        """
        if self.lifecycle is None:
            msg = "this collector keeps no lifecycle"
            raise LifecycleError(msg)
        actor = f"person:{by or 'unknown'}"
        before = self.lifecycle.state(node).value
        out = self.lifecycle.state(node) in OUT_OF_SERVICE
        if move == "repaired" and self.requalify is not None and out:
            self.requalify(node, actor, reason or "repaired")
        elif move == "repaired" and node in self.drained:
            await self.release(node, reason or "repaired", by)
        else:
            to = State.IN_SERVICE if move == "repaired" else PERSON_MOVES[move]
            self.lifecycle.move(node, to, actor=actor, reason=reason, strict=True)
        # A repaired node whose fault still fires is suspect at once: say where it ends up.
        return {"node": node, "state": self.lifecycle.state(node).value, "previous": before}

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
            await self._fire(incident, rule, expand(actions), prefix="escalated_", plan=plan)
            return
        failed_reset = await self._fire(incident, rule, expand(actions), plan=plan)
        if failed_reset:
            await self._escalate(incident, rule)

    def would(
        self, incident: IncidentRow, rule: Rule, spec: ActionSpec, more_drains: int = 0
    ) -> tuple[str, str]:
        """What this collector's safety limits would answer now for one action; changes nothing.

        What a dry run of rules asks (``fleetwatch rules eval``).
        """
        return self._checks.would(incident, rule, spec, more_drains=more_drains)

    def plan(
        self,
        incident: IncidentRow,
        rule: Rule,
        actions: tuple[ActionSpec, ...],
        *,
        escalation: bool = False,
    ) -> FirePlan | None:
        """Decide the first action of each chain of a firing now (:meth:`ActionJournal.plan`)."""
        return self._actions.plan(incident, rule, actions, escalation=escalation)

    async def _escalate(self, incident: IncidentRow, rule: Rule) -> None:
        esc = rule.escalation
        if esc is not None and not incident.escalated:
            log.warning("reset_failed_escalating", incident=incident.id, rule=rule.name)
            await self._fire(incident, rule, expand(esc.actions), prefix="escalated_")

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
        chained = chains(actions)
        if not chained:
            return False
        firsts: list[Planned | None] = list(plan.firsts) if plan is not None else []
        firsts += [None] * (len(chained) - len(firsts))
        others = [
            asyncio.ensure_future(self._fire_in_order(incident, rule, chain, prefix, first))
            for chain, first in zip(chained[1:], firsts[1:], strict=True)
        ]
        results: list[bool | BaseException] = []
        try:
            results.append(await self._fire_in_order(incident, rule, chained[0], prefix, firsts[0]))
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
                    self._actions.count_new(action_id, name, state, incident.node)
            else:
                action_id, new, state, why, name = await self._actions.decide(
                    incident, rule, spec, prefix
                )
            if not new:  # this action of this incident was decided before: never twice
                if spec.name == "reset_gpu" and await self._actions.reset_failed(action_id):
                    failed_reset = True  # a crash cut its escalation short: hand that on
                continue
            if state != "planned":
                if state == "deferred":
                    self._waits.defer(Waiting(action_id, incident.id, spec, name=name))
                log.warning("action_not_run", action=name, incident=incident.id, why=why)
                continue
            outcome = await self._run_journaled(action_id, incident, rule, spec, name)
            failed_reset |= spec.name == "reset_gpu" and not outcome.ok and not outcome.retry
        return failed_reset

    async def _run_journaled(
        self, action_id: int, incident: IncidentRow, rule: Rule, spec: ActionSpec, name: str = ""
    ) -> ActionOutcome:
        """Run an action journaled as ``action_id``; record its outcome.

        A reset the agent refuses for now (a busy GPU) is journaled as deferred and waits:
        :meth:`settle` asks again every ``reset_retry_s`` while the incident fires.
        """
        draining = spec.name == "drain_node"
        if draining:
            self._checks.drain_started()
        busy = self._checks.busy_set(spec)
        where = self._checks.place(incident, spec)
        if busy is not None:
            busy.add(where)  # a drain counts toward the cap while it runs
        try:
            outcome = await self._actuation.run(incident, rule, spec, name or spec.name)
        finally:
            if busy is not None:
                busy.discard(where)
        if draining and outcome.ok:
            self.drained[incident.node] = incident.id
            if self.lifecycle is not None:
                self.lifecycle.move(
                    incident.node,
                    State.DRAINED,
                    actor=f"action:{name or spec.name}",
                    incident=incident.id,
                    reason=rule.name,
                )
        if spec.name in _MOVES and outcome.ok:
            self._out_of_service(incident, rule, spec, name or spec.name)
        if not outcome.retry:  # a refusal for now is not an action that ran
            self._checks.ran(incident, spec, where=where, refused=outcome.refused)
        if outcome.retry:
            retry_at = self._clock.monotonic() + self.safety.reset_retry_s
            self._waits.defer(Waiting(action_id, incident.id, spec, retry_at, name))
            holders = self._checks.holders(incident)
            held = f"; held by {holders}" if holders else ""
            await self._actions.finish(action_id, "deferred", f"waiting: {outcome.detail}{held}")
            return outcome
        state = "refused" if outcome.refused else "succeeded" if outcome.ok else "failed"
        await self._actions.finish(action_id, state, outcome.detail)
        log.info(
            "action_done",
            action=spec.name,
            incident=incident.id,
            node=incident.node,
            ok=outcome.ok,
            detail=outcome.detail,
        )
        return outcome

    def _out_of_service(
        self, incident: IncidentRow, rule: Rule, spec: ActionSpec, name: str
    ) -> None:
        """A reboot or an RMA ticket was accepted: the node moves in its lifecycle.

        A reboot drained the node too (Slurm's ``reboot ASAP``; a webhook's receiver drains
        first): fleetwatch holds it out, for this incident, until a release or re-qualification,
        and the reboot is in flight until the node says hello from a new boot.
        """
        node = incident.node
        if spec.name == "reboot_node":
            self.drained[node] = incident.id
            self._checks.reboot_asked(node, self._checks.boot_of(node))
        if self.lifecycle is not None:
            self.lifecycle.move(
                node,
                _MOVES[spec.name],
                actor=f"action:{name}",
                incident=incident.id,
                reason=rule.name,
            )

    async def settle(
        self,
        firing: Callable[[str], tuple[IncidentRow, Rule] | None],
        holds: Callable[[str], bool | None] | None = None,
    ) -> None:
        """Run what waits, if it may run now (:meth:`WaitingActions.settle`)."""
        await self._waits.settle(firing, holds)

    async def resolve(self, incident: IncidentRow, rule: Rule) -> None:
        """Resume a node this incident drained, when its drain action asks for that."""
        wants_resume = any(
            spec.name == "drain_node" and spec.params.get("resume_on_resolve")
            for spec in rule.actions + (rule.escalation.actions if rule.escalation else ())
        )
        if not wants_resume or self.drained.get(incident.node) != incident.id:
            return
        if self.lifecycle is not None and self.lifecycle.state(incident.node) in _MOVES.values():
            return  # rebooted or sent for RMA: re-qualification brings it back, not a resolution
        spec = ActionSpec("resume_node")
        action_id, new = await self._actions.add(incident, spec, "running", "", "resume_node")
        if not new:
            return
        outcome = await self._actuation.resume(incident)
        if outcome.ok:
            self.drained.pop(incident.node, None)
        state = "refused" if outcome.refused else "succeeded" if outcome.ok else "failed"
        await self._actions.finish(action_id, state, outcome.detail)


def _everyone(_node: str) -> bool:
    return True
