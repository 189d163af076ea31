"""The rules at run time: evaluate on a tick, journal every incident change, hand on actions.

An incident is journaled on each phase change before anything acts on it. After a restart the
open incidents are taken back from the journal, so a firing incident does not fire again, and
silences are loaded before the first evaluation. Each firing incident taken back is handed to the
action sink once more: a crash after its firing was journaled and before its actions were must
not lose them, and the sink runs only actions whose idempotency key it has not journaled.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

import structlog

from collector.exceptions import LoopBusyError
from collector.store.incidents import IncidentRow, SilenceRow
from fleetwatch.clock import wait_for_event
from rules.engine import Incident, Phase

T = TypeVar("T")

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Generator

    from collector.actions.dispatcher import Dispatcher
    from collector.actions.journaling import FirePlan
    from collector.incidents.evaluator import Evaluator
    from collector.incidents.verdict import Outcome, Verdict
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock
    from rules.model import ActionSpec, Rule

log = structlog.get_logger("collector.incidents.evaluator")

# Least time between two ticks: events arriving closer together are evaluated together.
EVENT_GAP_S: Final = 0.005
# A tick gives the event loop a turn after this long: a tick evaluating thousands of nodes (a
# fleet reconnecting after a restart, a sweep of a large fleet) ran for seconds as one callback,
# with no stream read and no event acked meanwhile. At 4,096 nodes a regular tick is some
# 160 ms of evaluation a second; with 20 ms slices a probe event waited 15-21 ms (median) from
# the load's write to its dispatch and a journal call's return 27-40 ms (p99), with 5 ms slices
# 6-10 ms and 8-18 ms (bench/collector_ingest.py's load, docs/performance.md).
TICK_SLICE_S: Final = 0.005
# Between two slices of a tick the loop pauses this long (when nothing else is ready), so that
# the journal's writer thread gets the interpreter lock at once: given only a bare turn of the
# loop, it waited up to the 5 ms switch interval at each of its calls while a tick ran, and an
# event (its incident is evaluated once it is journaled) took 50-60 ms to its incident at
# 4,096 nodes; 29 ms at p99 with the pause (docs/performance.md, ninth measurement).
SLICE_PAUSE_S: Final = 0.001
# Between two regular ticks, what changed (samples, paced samples whose pause is over) is
# evaluated this often in a small tick. A regular tick at 4,096 nodes evaluated a second's worth
# at once (11,000 evaluations, 140 ms of the loop): the messages that arrived meanwhile waited,
# and they were the fault benchmark's slowest (docs/performance.md, ninth measurement).
SMALL_TICK_S: Final = 0.2


class ActionSink(Protocol):
    """Where firing and resolved incidents go to be acted on (the dispatcher)."""

    async def fire(
        self,
        incident: IncidentRow,
        rule: Rule,
        actions: tuple[ActionSpec, ...],
        *,
        escalation: bool = False,
        plan: FirePlan | None = None,
    ) -> None:
        """Run (or journal as skipped) a firing incident's actions.

        ``escalation``: the actions are the rule's escalation's (the incident fired escalated,
        or the fault recurred while it fired and escalated it), journaled as
        ``escalated_<action>`` whichever way it escalated. ``plan``: what :meth:`plan` decided,
        journaled with the incident.
        """
        ...

    def plan(
        self,
        incident: IncidentRow,
        rule: Rule,
        actions: tuple[ActionSpec, ...],
        *,
        escalation: bool = False,
    ) -> FirePlan | None:
        """Decide a firing's first actions now, to journal with the incident (or None)."""
        ...

    async def resolve(self, incident: IncidentRow, rule: Rule) -> None:
        """Undo what should be undone now that the incident resolved (e.g. resume a node)."""
        ...

    async def settle(
        self,
        firing: Callable[[str], tuple[IncidentRow, Rule] | None],
        holds: Callable[[str], bool | None] | None = None,
    ) -> None:
        """After each tick: run what waited (drains held back by the cap), if it may run now.

        ``holds`` says whether an incident's condition holds now (None: cannot tell).
        """
        ...


class IncidentWatcher(Protocol):
    """Told of each incident the service carries as it changes (Alertmanager's forwarder)."""

    def changed(self, incident: IncidentRow, rule: Rule) -> None:
        """``incident`` was journaled (or, firing, taken back at start); must not block."""
        ...


def _close_unstarted(step: Coroutine[object, object, None]) -> None:
    """Close a step whose task was cancelled before the step began (the service stopping).

    Nothing of it ran; closing it says so, where a coroutine never awaited would warn.
    """
    if inspect.getcoroutinestate(step) == inspect.CORO_CREATED:
        step.close()


class IncidentService:
    """Ticks the evaluator and journals what comes of it."""

    def __init__(  # noqa: PLR0913 - the service's collaborators
        self,
        *,
        evaluator: Evaluator,
        journal: Journal,
        clock: Clock,
        sink: ActionSink | None = None,
        interval_s: float = 1.0,
        extra_firing: Callable[[str], tuple[IncidentRow, Rule] | None] | None = None,
    ) -> None:
        """Nothing runs until :meth:`start`.

        ``extra_firing`` finds firing incidents raised outside the rules (a node pre-flight
        holds out), so their drains that wait under the cap are not dropped as no longer firing.
        """
        self.evaluator = evaluator
        self._journal = journal
        self._clock = clock
        self.sink = sink
        # Told of every journaled change, and of each firing incident taken back at start.
        self.watchers: list[IncidentWatcher] = []
        self.interval_s = interval_s
        self._silences: list[SilenceRow] = []
        self._task: asyncio.Task[None] | None = None
        # Whose open incidents :meth:`start` takes back: every node's on a journal of its own;
        # on a shared one, the collector sets it to the nodes it watches.
        self.owns: Callable[[str], bool] = lambda _node: True
        self.extra_firing = extra_firing or (lambda _id: None)
        self._event = asyncio.Event()
        # Actions run beside the evaluation, so a slow webhook delays no other incident; an
        # incident's own steps (fire, then resolve) still run in order, chained by its id.
        self._acting: dict[str, asyncio.Task[None]] = {}
        self._settling: asyncio.Task[None] | None = None
        # Changes the journal refused (it was down) and incidents whose actions failed half-way:
        # journaled and handed on again at the next tick, until the journal takes them.
        self._unrecorded: list[Outcome] = []
        self._retry: set[str] = set()
        self.ticks = 0
        self.small_ticks = 0  # ticks of what changed, between two regular ones
        self.slices = 0  # turns given to the event loop within ticks
        self.urgent_between = 0  # events evaluated between two parts of a tick
        evaluator.silencer = self._silenced_by
        evaluator.on_event = self._event.set

    def _wall_ms(self, mono: float | None) -> int | None:
        """A monotonic time of this process as Unix milliseconds."""
        if mono is None:
            return None
        return int((self._clock.now() - (self._clock.monotonic() - mono)) * 1000)

    def _silenced_by(self, incident: Incident, rule: Rule) -> str | None:
        now_ms = int(self._clock.now() * 1000)
        for silence in self._silences:
            if silence.matches(incident.node, rule.name, now_ms):
                return f"silence {silence.id}"
        return None

    async def start(self) -> None:
        """Take back open incidents and silences, then tick in the background."""
        rows = await self._journal.do(
            lambda s: s.incidents.incidents(open_only=True, limit=100_000)
        )
        mono, now = self._clock.monotonic(), self._clock.now()

        def to_mono(ms: int | None) -> float | None:
            return None if ms is None else mono - (now - ms / 1000)

        firing: list[Incident] = []
        taken: list[tuple[IncidentRow, Rule]] = []
        for row in rows:
            if row.rule not in self.evaluator.engine.rules:
                continue  # the rule is gone from the rule files: the incident ends with it
            if not self.owns(row.node):
                continue  # a peer's node (shared journal): its collector carries it on
            incident = Incident(
                id=row.id,
                rule=row.rule,
                node=row.node,
                target=row.target,
                phase=Phase(row.phase),
                started_at=to_mono(row.started_ms) or mono,
                evidence=row.evidence,
                fired_at=to_mono(row.fired_ms),
                escalated=row.escalated,
                firings=row.firings,
            )
            self.evaluator.engine.restore(incident)
            if incident.phase == Phase.FIRING:
                firing.append(incident)
                taken.append((row, self.evaluator.engine.rules[row.rule]))
        await self.reload_silences()
        for row, rule in taken:
            self._tell(row, rule)
        for incident in firing:
            self._act_again(incident)
        self._task = asyncio.create_task(self._run(), name="incidents")
        log.info("incidents_started", open=len(rows), rules=len(self.evaluator.rules.rules))

    def _adopt(self, other: IncidentRow) -> None:
        """Another collector on the shared journal fires this rule on this target already.

        It took the node's stream, or held it while this one took it for a silent peer's: its
        incident (and its actions) stand, and this collector carries that one on instead of
        opening a second (whose actions would run again under new keys).
        """
        mono, now = self._clock.monotonic(), self._clock.now()
        fired = None if other.fired_ms is None else mono - (now - other.fired_ms / 1000)
        self.evaluator.engine.restore(
            Incident(
                id=other.id,
                rule=other.rule,
                node=other.node,
                target=other.target,
                phase=Phase(other.phase),
                started_at=mono - (now - other.started_ms / 1000),
                evidence=other.evidence,
                fired_at=fired,
                escalated=other.escalated,
                firings=other.firings,
            )
        )
        log.info("incident_adopted", rule=other.rule, target=other.target, incident=other.id)
        rule = self.evaluator.engine.rules.get(other.rule)
        if rule is not None and other.phase == Phase.FIRING.value:
            self._tell(other, rule)

    def _tell(self, row: IncidentRow, rule: Rule) -> None:
        """Tell the watchers of ``row``; one that fails is logged and stops nothing."""
        for watcher in self.watchers:
            try:
                watcher.changed(row, rule)
            except Exception:
                log.exception("incident_watcher_failed", incident=row.id)

    def _act_again(self, incident: Incident) -> None:
        """Hand a firing incident taken back from the journal to the sink once more.

        The process before may have died between journaling the firing and journaling its
        actions (or between two of them), and the engine does not fire a restored incident
        again. The sink journals each action under its idempotency key first and runs only
        the keys it finds new, so actions already journaled are not repeated: those cut short
        are settled by the sink's own start. An escalated incident is handed its escalation's
        actions (journaled as ``escalated_<action>`` however it escalated); the rule's own
        actions of an incident that escalated later were handed on when it was not yet.
        """
        rule = self.evaluator.engine.rules[incident.rule]
        if self.sink is None:
            return
        escalation = incident.escalated and rule.escalation is not None
        actions = rule.escalation.actions if escalation and rule.escalation else rule.actions
        if not actions:
            return
        row = self._row(incident, rule, self.evaluator.verdict(incident, rule))
        self._act(row.id, self.sink.fire(row, rule, actions, escalation=escalation))

    async def reload_silences(self) -> None:
        """Read the silences again (after one was added or removed)."""
        now_ms = int(self._clock.now() * 1000)
        self._silences = await self._journal.do(lambda s: s.incidents.silences(active_at_ms=now_ms))

    async def stop(self, grace: float = 5.0) -> None:
        """Stop ticking; give running actions ``grace`` seconds to finish, then cancel them.

        An action cancelled here stays journaled as running, and the next start settles it.
        """
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        pending = [t for t in (*self._acting.values(), self._settling) if t is not None]
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def idle(self) -> None:
        """Wait until no action is running (for tests and orderly shutdown)."""
        while pending := [t for t in (*self._acting.values(), self._settling) if t is not None]:
            await asyncio.gather(*pending, return_exceptions=True)
            if all(t.done() for t in pending):
                self._acting = {k: t for k, t in self._acting.items() if not t.done()}
                if self._settling is not None and self._settling.done():
                    self._settling = None

    def _act(self, incident_id: str, step: Coroutine[object, object, None]) -> None:
        """Run ``step`` after what this incident already has running."""
        before = self._acting.get(incident_id)

        async def run() -> None:
            if before is not None:
                await asyncio.gather(before, return_exceptions=True)
            try:
                await step
            except Exception:
                # the journal went away mid-way (a database restart): hand the incident on
                # again at the next tick; only the actions it has not journaled run then
                log.exception("incident_action_failed", incident=incident_id)
                self._retry.add(incident_id)
            finally:
                if self._acting.get(incident_id) is task:
                    del self._acting[incident_id]

        task = asyncio.create_task(run(), name=f"act-{incident_id}")
        task.add_done_callback(lambda _: _close_unstarted(step))
        self._acting[incident_id] = task

    async def _run(self) -> None:
        """Tick every ``interval_s``, at once when an event arrives, and in between for changes.

        Events (an Xid, a GPU lost, a node unreachable) are what rules act on without waiting,
        so an event wakes the loop; a burst of them within ``EVENT_GAP_S`` costs one tick.
        Every ``SMALL_TICK_S`` between regular ticks, a small (urgent) tick evaluates what
        changed since, if anything did, so that the regular tick is not a second's worth.
        """
        small_s = SMALL_TICK_S if self.interval_s > SMALL_TICK_S else None
        due = self._clock.monotonic() + self.interval_s
        while True:
            now = self._clock.monotonic()
            wait = due - now if small_s is None else min(due - now, small_s)
            urgent = await self._wait_for_event(wait)
            if self._clock.monotonic() >= due:
                urgent = False
                due = self._clock.monotonic() + self.interval_s
            elif not urgent:
                if not self.evaluator.has_changes():
                    continue
                urgent = True
                self.small_ticks += 1
            try:
                await self.tick(urgent=urgent)
            except Exception:
                log.exception("incident_tick_failed")
            await self._clock.sleep(EVENT_GAP_S)

    async def _wait_for_event(self, seconds: float) -> bool:
        """True when an event ended the wait."""
        woke = await wait_for_event(self._event, seconds, self._clock)
        self._event.clear()
        return woke

    async def tick(self, *, urgent: bool = False) -> list[Outcome]:
        """One evaluation round: journal each change, then hand firings to the sink."""
        self.ticks += 1
        await self._record_again()
        outcomes = await self._evaluate(urgent=urgent)
        if self.sink is not None and (self._settling is None or self._settling.done()):
            self._settling = asyncio.create_task(
                self.sink.settle(self._firing, self.holds), name="settle"
            )
        return outcomes

    async def _evaluate(self, *, urgent: bool) -> list[Outcome]:
        """The evaluator's tick, with a turn of the event loop every ``TICK_SLICE_S``; record it.

        What a slice found is recorded (journaled, its actions started) at the turn after it,
        not at the end of the tick: at 4,096 nodes a regular tick lasts some 160 ms, and an
        incident found in its first slice waited for all of it before its webhook. An event
        that arrives during a tick is evaluated at the next turn (a tick of the targets events
        marked, between two parts), after what the tick found so far is recorded, so each
        incident's changes are journaled in order. A reload that swaps the rules during a turn
        ends this tick there: what it evaluated is recorded, and the new evaluator (which took
        over the engine as it was) goes on next tick.
        """
        evaluator = self.evaluator
        return await self._sliced(evaluator, evaluator.steps(urgent=urgent), nested=False)

    async def _sliced(
        self, evaluator: Evaluator, steps: Generator[list[Outcome]], *, nested: bool
    ) -> list[Outcome]:
        """Run a tick's ``steps`` a slice at a time, recording what each slice found.

        An event that arrives meanwhile gets a tick of its own at the next turn (``nested``):
        one that evaluates only the targets events marked (:meth:`Evaluator.steps`), sliced
        too. It was an urgent tick, which evaluates every node that sent its first Report
        since the last tick: in a 4,096-node restart those ran 0.3 to 2.5 s each, and an Xid
        that arrived during one waited for its end. An event that arrives during a nested tick
        gets its own after it, at the next turn of the tick around it.
        """
        done: list[Outcome] = []
        found: list[Outcome] = []
        slice_end = self._clock.monotonic() + TICK_SLICE_S
        try:
            for part in steps:
                found += part
                if self._clock.monotonic() < slice_end:
                    continue
                self.slices += 1
                if found:  # the journal's round trip is the loop's turn
                    done += await self._record_all(found)
                    found = []
                else:  # a pause, not a bare turn: see SLICE_PAUSE_S
                    await asyncio.sleep(SLICE_PAUSE_S)
                if self.evaluator is not evaluator:
                    break
                if not nested and self._event.is_set():  # an event: evaluated at once
                    self._event.clear()
                    self.urgent_between += 1
                    marked = evaluator.steps(events=True)
                    done += await self._sliced(evaluator, marked, nested=True)
                    if self.evaluator is not evaluator:
                        break
                slice_end = self._clock.monotonic() + TICK_SLICE_S
        finally:
            steps.close()
        return done + await self._record_all(found)

    async def _record_all(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Journal each change and hand firings to the sink; return ``outcomes``.

        On a journal of its own the changes go in one call to its writer thread, with the
        first action of each firing (:meth:`ActionSink.plan`): each call is a round trip
        through a busy event loop (a few milliseconds at 4,096 nodes), and a fault paid one for
        its incident, one for its action and one per other change fired beside it. A shared
        journal claims each firing in turn (another collector may hold it).
        """
        if self._journal.store.shared:
            for outcome in outcomes:
                try:
                    await self._record(outcome)
                except Exception:  # journaled (and acted on) at a later tick
                    log.exception("incident_record_failed", incident=outcome.transition.incident.id)
                    self._unrecorded.append(outcome)
            return outcomes
        rows = [self._row(o.transition.incident, o.rule, o.verdict) for o in outcomes]
        plans = self._plans(outcomes, rows)
        actions = [a for plan in plans if plan is not None for a in plan.rows()]
        try:
            results = await self._journal.do(lambda s: s.incidents.record(rows, actions))
        except Exception:  # one by one at the next tick (_record_again)
            for plan in plans:
                if plan is not None:
                    plan.release()
            log.exception("incident_record_failed", incidents=len(outcomes))
            self._unrecorded += outcomes
            return outcomes
        for outcome, row, plan in zip(outcomes, rows, plans, strict=True):
            if plan is not None:
                plan.journaled(results[: len(plan.firsts)])
                results = results[len(plan.firsts) :]
            self._announce(outcome, row, plan)
        return outcomes

    def _plans(self, outcomes: list[Outcome], rows: list[IncidentRow]) -> list[FirePlan | None]:
        """Each change's first actions, decided now (None: decided when they run)."""
        plans: list[FirePlan | None] = []
        planned: set[str] = set()
        for outcome, row in zip(outcomes, rows, strict=True):
            fired = self._fired(outcome)
            plan = None
            # an incident with a step still running acts after it, on what that step left
            idle = row.id not in self._acting and row.id not in planned
            if fired is not None and self.sink is not None and idle:
                actions, escalation = fired
                try:
                    plan = self.sink.plan(row, outcome.rule, actions, escalation=escalation)
                except Exception:  # decided when they run, as without a plan
                    log.exception("action_plan_failed", incident=row.id)
                planned.add(row.id)
            plans.append(plan)
        return plans

    @staticmethod
    def _fired(outcome: Outcome) -> tuple[tuple[ActionSpec, ...], bool] | None:
        """The actions a change hands the sink, and whether they are an escalation's."""
        transition, incident = outcome.transition, outcome.transition.incident
        if transition.recurred:
            return (transition.actions, True) if transition.actions else None
        if incident.phase == Phase.FIRING:
            return transition.actions, incident.escalated
        return None

    async def _record_again(self) -> None:
        """Journal what a tick could not (the journal was down), then retry failed actions."""
        waiting, self._unrecorded = self._unrecorded, []
        for i, outcome in enumerate(waiting):
            try:
                await self._record(outcome)
            except Exception:  # noqa: BLE001 - still down: next tick, in the same order
                self._unrecorded = waiting[i:] + self._unrecorded
                return
        retry, self._retry = self._retry, set()
        for incident in self.evaluator.engine.open_incidents():
            if incident.id in retry and incident.phase == Phase.FIRING:
                self._act_again(incident)

    def _firing(self, incident_id: str) -> tuple[IncidentRow, Rule] | None:
        for incident in self.evaluator.engine.open_incidents():
            if incident.id == incident_id and incident.phase == Phase.FIRING:
                rule = self.evaluator.engine.rules[incident.rule]
                return self._row(incident, rule, self.evaluator.verdict(incident, rule)), rule
        return self.extra_firing(incident_id)

    def holds(self, incident_id: str) -> bool | None:
        """Whether an open incident's condition holds on its target now (None: cannot tell)."""
        for incident in self.evaluator.engine.open_incidents():
            if incident.id == incident_id:
                return self.evaluator.holds_now(incident)
        return None

    def _row(self, incident: Incident, rule: Rule, verdict: Verdict) -> IncidentRow:
        return IncidentRow(
            id=incident.id,
            rule=incident.rule,
            node=incident.node,
            target=incident.target,
            severity=rule.severity.value,
            phase=incident.phase.value,
            started_ms=self._wall_ms(incident.started_at) or 0,
            updated_ms=int(self._clock.now() * 1000),
            fired_ms=self._wall_ms(incident.fired_at),
            resolved_ms=self._wall_ms(incident.resolved_at),
            evidence=incident.evidence,
            escalated=incident.escalated,
            firings=incident.firings,
            suppressed_by=verdict.suppressed_by,
            silenced_by=verdict.silenced_by,
        )

    async def _record(self, outcome: Outcome) -> None:
        incident, rule, verdict = outcome.transition.incident, outcome.rule, outcome.verdict
        row = self._row(incident, rule, verdict)
        if (
            self._journal.store.shared
            and incident.phase == Phase.FIRING
            and not outcome.transition.recurred
        ):
            other = await self._journal.do(lambda s: s.incidents.claim_firing(row))
            if other is not None:
                self._adopt(other)
                return
        else:
            await self._journal.do(lambda s: s.incidents.upsert_incident(row))
        self._announce(outcome, row)

    def _announce(self, outcome: Outcome, row: IncidentRow, plan: FirePlan | None = None) -> None:
        """Log a journaled change and hand it to the sink (with what was planned for it)."""
        incident, rule, verdict = outcome.transition.incident, outcome.rule, outcome.verdict
        self._tell(row, rule)
        event = f"incident_{incident.phase.value}"
        if outcome.transition.recurred:
            log.warning(
                "incident_recurred",
                rule=rule.name,
                target=incident.target,
                occurrences=incident.firings,
                escalated=bool(outcome.transition.actions),
            )
        elif incident.phase == Phase.FIRING:
            log.warning(
                event,
                rule=rule.name,
                target=incident.target,
                severity=rule.severity.value,
                evidence=incident.evidence,
                suppressed_by=verdict.suppressed_by,
                silenced_by=verdict.silenced_by,
            )
        elif incident.phase == Phase.RESOLVED:
            log.info(event, rule=rule.name, target=incident.target)
            if self.sink is not None:
                self._act(row.id, self.sink.resolve(row, rule))
            return
        fired = self._fired(outcome)
        if self.sink is not None and fired is not None:
            actions, escalation = fired
            self._act(row.id, self.sink.fire(row, rule, actions, escalation=escalation, plan=plan))


class _Handoff:
    """Whether a coroutine handed to the loop began, or its caller gave up on it first."""

    __slots__ = ("_lock", "_state")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = "waiting"

    def begin(self) -> bool:
        """On the loop: True when the caller still waits (the work may begin)."""
        with self._lock:
            if self._state == "waiting":
                self._state = "begun"
            return self._state == "begun"

    def give_up(self) -> bool:
        """On the caller's thread: True when the work had not begun (and now never will)."""
        with self._lock:
            if self._state == "waiting":
                self._state = "abandoned"
            return self._state == "abandoned"


class _LoopBridge:
    """Runs coroutines on the collector's event loop for the HTTP server's threads.

    A thread waits at most :attr:`wait_s` for the loop: a loop busy for longer (a long tick, a
    GC pause, a slow disk) makes the call raise LoopBusyError, which the API answers with 503,
    well before its clients give up (the CLI waits 10 s). Work the loop had not begun by then
    never runs, so a refused change is not made later behind the client's back.
    """

    what = "this bridge"
    wait_s: float = 4.0

    def __init__(self) -> None:
        """Bind to the running loop with :meth:`bind` before use."""
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Remember the loop the journal, the incident service and the dispatcher run on."""
        self._loop = loop

    def _call(self, coro: Coroutine[object, object, T]) -> T:
        if self._loop is None:
            coro.close()
            msg = f"{self.what} is not bound to a running collector"
            raise RuntimeError(msg)
        handoff = _Handoff()

        async def run() -> T | None:
            if not handoff.begin():
                coro.close()  # the caller gave up before the loop came to it
                return None
            return await coro

        wrapper = run()
        try:
            future = asyncio.run_coroutine_threadsafe(wrapper, self._loop)
        except RuntimeError:  # the loop is closed: the collector is stopping
            wrapper.close()
            coro.close()
            raise LoopBusyError(self.what, waited_s=0.0, started=False) from None
        try:
            result = future.result(timeout=self.wait_s)
        except TimeoutError:
            started = not handoff.give_up()
            raise LoopBusyError(self.what, waited_s=self.wait_s, started=started) from None
        return result  # type: ignore[return-value]  # None only when given up, and then not here


class SilenceBook(_LoopBridge):
    """Adds and removes silences for the HTTP thread, through the event loop's journal writer."""

    what = "the silence book"

    def __init__(self, journal: Journal, service: IncidentService) -> None:
        """Bind to the running loop with :meth:`bind` before use."""
        super().__init__()
        self._journal = journal
        self._service = service

    def add(self, row: SilenceRow) -> int:
        """Store a silence and apply it to the next evaluation."""

        async def add() -> int:
            silence_id = await self._journal.do(lambda s: s.incidents.add_silence(row))
            await self._service.reload_silences()
            log.info(
                "silence_added",
                id=silence_id,
                node=row.node or "*",
                rule=row.rule or "*",
                until_ms=row.ends_ms,
                created_by=row.created_by,
                reason=row.reason,
            )
            return silence_id

        return self._call(add())

    def remove(self, silence_id: int, by: str = "") -> bool:
        """Delete a silence; ``by`` (who asked) goes to the log."""

        async def remove() -> bool:
            removed = await self._journal.do(lambda s: s.incidents.remove_silence(silence_id))
            await self._service.reload_silences()
            if removed:
                log.info("silence_removed", id=silence_id, removed_by=by)
            return removed

        return self._call(remove())


class DrainDesk(_LoopBridge):
    """Lists and releases fleetwatch's drains for the HTTP thread, on the event loop."""

    what = "the drain desk"

    def __init__(self, dispatcher: Dispatcher) -> None:
        """Bind to the running loop with :meth:`bind` before use."""
        super().__init__()
        self._dispatcher = dispatcher

    def drains(self) -> dict[str, Any]:
        """What is drained and what waits."""

        async def read() -> dict[str, Any]:
            return self._dispatcher.drains()

        return self._call(read())

    def release(self, node: str, reason: str, by: str = "") -> bool:
        """Stop holding ``node`` as drained (``by``: who asked, as the API tells)."""
        return self._call(self._dispatcher.release(node, reason, by))

    def move(self, node: str, move: str, reason: str, by: str = "") -> dict[str, Any]:
        """A person's lifecycle move (repair, repaired, rma); where the node stands after it."""
        return self._call(self._dispatcher.person_move(node, move, reason, by))
