"""Rules applied to the fleet: what happened, each tick's evaluation, and what came of it.

The evaluator is the fleet model's observer: it keeps the events and samples the rules' windows
read and marks the targets they touch (:mod:`collector.incidents.changes`). Each tick it takes
the targets to evaluate (:mod:`collector.incidents.sweep`) with their data
(:mod:`collector.incidents.cel_data`), runs the conditions in CEL, and lets the engine turn the
results into incident transitions, returned with the verdict on whether their actions may run
(:mod:`collector.incidents.verdict`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import structlog

from collector.incidents.cel_data import (
    FleetTally,
    StillContext,
    WindowContext,
    XidEntries,
    cel_view,
)
from collector.incidents.changes import Changes
from collector.incidents.condition_memo import ConditionMemo
from collector.incidents.rule_reads import reads_named_signals, reads_windows_only, sample_windows
from collector.incidents.sweep import Sweep, Sweeper
from collector.incidents.verdict import Outcome, Verdict, evidence, verdict_for
from collector.model.history import History, PastEvent
from collector.model.slots import rules_key
from collector.model.target_keys import FLEET_KEY, gpu_key, job_key, node_key
from fleetwatch.model import EventKind
from rules.cel_env import RuleEnvironment
from rules.engine import Engine
from rules.model import Scope

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterator, Mapping

    from cel_expr_python import cel

    from collector.jobs.book import JobBook
    from collector.model.fleet import FleetModel
    from collector.model.slots import TargetSlot
    from collector.model.state import NodeState
    from fleetwatch.clock import Clock
    from fleetwatch.model import SampleValue, Target
    from rules.cel_env import TargetContext
    from rules.engine import Incident
    from rules.model import Rule, RuleSet
    from rules.xid_catalog import XidCatalog

log = structlog.get_logger("collector.incidents.evaluator")

ERROR_LOG_EVERY: Final = 1000  # a rule that fails on every target logs once, then now and then
NO_DRAINS: Final = {
    "drained_nodes": 0,
    "drains_waiting": 0,
    "drain_cap": 0,
    "drain_breaker_open": False,
}
EVENT_WINDOW_S: Final = 24 * 3600.0
# Events that interrupt a training job whatever the Xid catalog says, by failure category.
FAILURE_KINDS: Final = {
    EventKind.GPU_LOST: "gpu_lost",
    EventKind.PCI_REMOVED: "pcie",
    EventKind.NODE_UNREACHABLE: "node",
}


class Evaluator:
    """Runs a rule set over the fleet model and feeds the incident engine."""

    def __init__(  # noqa: PLR0913 - the collector's collaborators
        self,
        *,
        rules: RuleSet,
        fleet: FleetModel,
        catalog: XidCatalog,
        clock: Clock,
        full_sweep_s: float = 30.0,
        env: RuleEnvironment | None = None,
        jobs: JobBook | None = None,
        fleet_extras: Callable[[], dict[str, Any]] | None = None,
        node_faults: Callable[[str], Mapping[str, Any]] | None = None,
    ) -> None:
        """Compile every rule once; ``jobs`` gives job and rank variables (none: no jobs).

        ``fleet_extras`` gives more ``fleet`` variables from elsewhere (the dispatcher's drain
        counts); without it the drain counts are zero. ``node_faults`` gives a node's recent
        remediations and incident episodes (``node.remediations_7d`` ...); without it, none.
        """
        self.rules = rules
        self.fleet = fleet
        self.catalog = catalog
        self.entries = XidEntries()  # the catalog's entries as xids() lists them
        self.clock = clock
        self.env = env or RuleEnvironment()
        self.engine = Engine(rules)
        self.history = History(EVENT_WINDOW_S, sample_windows(rules))
        self._compiled: dict[str, cel.Expression] = {
            r.name: self.env.compile(r.scope, r.when) for r in rules.rules
        }
        # Escalations that count occurrences: the number each grows with.
        self._occurrences: dict[str, cel.Expression] = {
            r.name: self.env.compile(r.scope, r.escalation.occurrences)
            for r in rules.rules
            if r.escalation is not None and r.escalation.occurrences
        }
        self.changes = Changes(rules=rules, clock=clock)
        self.sweeper = Sweeper(
            rules=rules,
            fleet=fleet,
            engine=self.engine,
            changes=self.changes,
            full_sweep_s=full_sweep_s,
            never_when_still=self._never_when_still,
        )
        self.node_faults = node_faults
        self.sweeper.faults = node_faults
        self.tally = FleetTally(fleet)
        self._cut_signals = {r.name: reads_named_signals(r) for r in rules.rules}
        # Answers of the conditions that read nothing but the values they name.
        self.memo = ConditionMemo({r.name: r.when for r in rules.rules})
        self.evaluations = 0
        self.errors: dict[str, int] = {}
        self.failures: Counter[tuple[str, str]] = Counter()  # (node, category)
        self.silencer: Callable[[Incident, Rule], str | None] = lambda _i, _r: None
        # Called when an event arrives, so the incident service evaluates at once.
        self.on_event: Callable[[], None] = lambda: None
        self.fleet_extras: Callable[[], dict[str, Any]] = fleet_extras or (lambda: dict(NO_DRAINS))
        self.jobs: JobBook | None = None
        if jobs is not None:
            self.attach_jobs(jobs)

    def _never_when_still(self, rule: Rule) -> bool:
        """Whether ``rule`` reads windows alone and does not hold while they are all zero."""
        if not reads_windows_only(rule):
            return False
        holds, error = self.env.evaluate(self._compiled[rule.name], {}, StillContext())
        return error is None and not holds

    def attach_jobs(self, jobs: JobBook) -> None:
        """Take job and rank variables from ``jobs``, and lend it the windows' history."""
        self.jobs = jobs
        jobs.history = self.history
        jobs.on_change = self.note_job

    # ---- what happened --------------------------------------------------------------------

    def target_key(self, node: NodeState, target: Target) -> str:
        """The key a wire target has in this node."""
        return rules_key(node, target)

    def note_event(self, node: str, kind: EventKind, target: Target, xid: int) -> None:
        """An event was journaled: remember it for windows and mark its targets for a look."""
        self.changes.evented |= self._remember(node, kind, target, xid, self.clock.monotonic())
        category = self.failure_category(kind, xid)
        if category is not None:
            self.failures[node, category] += 1
            if self.jobs is not None:
                self.jobs.note_failure(node)
        self.on_event()

    def restore_event(
        self, node: str, kind: EventKind, target: Target, xid: int, age_s: float
    ) -> None:
        """An event journaled ``age_s`` ago by an earlier process: back into the windows.

        Only the windows: it was counted (failures) and woke the rules when it came in.
        """
        self._remember(node, kind, target, xid, self.clock.monotonic() - max(age_s, 0.0))

    def _remember(
        self, node: str, kind: EventKind, target: Target, xid: int, at: float
    ) -> set[tuple[str, str]]:
        """Put the event in its targets' windows and mark them changed; return them."""
        state = self.fleet.view().get(node)
        key = self.target_key(state, target) if state is not None else node_key(node)
        past = PastEvent(at, kind.value, xid)
        keys = {key, node_key(node)}
        if "/nvlink/" in key:
            keys.add(key.rsplit("/nvlink/", 1)[0])
        marked = {(node, k) for k in keys}
        for k in keys:
            self.history.add_event(k, past)
        self.changes.dirty |= marked
        return marked

    def failure_category(self, kind: EventKind, xid: int) -> str | None:
        """The category of an event that interrupts a training job, or None for others.

        Such events count in checkpoint advice and in ``fleetwatch_node_failures_total``:
        ``gpu_lost``, ``pcie`` (the PCI device went away), ``node`` (unreachable), and fatal
        Xids under their catalog class.
        """
        if kind in FAILURE_KINDS:
            return FAILURE_KINDS[kind]
        entry = self.catalog.get(xid) if kind == EventKind.XID else None
        return entry.xid_class if entry is not None and entry.fatal else None

    def wants(self, signal: str) -> bool:
        """Whether a sample of ``signal`` matters: a rule windows over it, or reads it.

        A busy GPU changes temperature, power and utilisation every poll; evaluating its rules
        for values none of them reads cost three quarters of a loaded collector's CPU
        (bench/collector_ingest.py). Targets are still swept every ``full_sweep_s``.
        """
        watched = self.changes.watched
        return self.history.wants(signal) or watched is None or signal in watched

    def note_samples(self, node: str, noted: list[tuple[TargetSlot, str, SampleValue]]) -> None:
        """Samples it :meth:`wants` were applied: keep windowed values, mark targets read."""
        self.changes.note_samples(node, noted, self.history)

    def has_changes(self) -> bool:
        """Whether an urgent tick now would evaluate anything (:meth:`Changes.has_changes`)."""
        return self.changes.has_changes()

    def note_job(self, job_id: str, gpus: list[tuple[str, str]]) -> None:
        """A job finished steps; ``gpus`` (node, uuid) host ranks that began or ended straggling."""
        dirty = self.changes.dirty
        dirty.add((job_key(job_id), job_key(job_id)))
        nodes = self.fleet.view()
        for name, uuid in gpus:
            gpu = nodes[name].gpus.get(uuid) if name in nodes else None
            if gpu is not None:
                dirty.add((name, gpu_key(name, gpu.index)))

    def note_node(self, node: str) -> None:
        """Something about the node as a whole changed (reachability)."""
        self.changes.dirty.add((node, node_key(node)))

    def note_inventory(self, node: str) -> None:
        """The node said Hello (or came back from the journal): evaluate all of it once."""
        self.changes.whole_next.add(node)

    # ---- evaluation -----------------------------------------------------------------------

    def tick(self, *, urgent: bool = False) -> list[Outcome]:
        """Evaluate what needs it; return the transitions with their verdicts (:meth:`steps`)."""
        return [outcome for part in self.steps(urgent=urgent) for outcome in part]

    def steps(self, *, urgent: bool = False, events: bool = False) -> Generator[list[Outcome]]:
        """One tick in parts: the transitions of each node's targets, then of jobs and the fleet.

        The caller may give the event loop a turn between parts (the incident service does,
        every few milliseconds), so that a tick evaluating thousands of nodes does not stop
        every stream for as long; data that changes meanwhile is seen by this tick or the next.

        Every tick evaluates the targets whose data changed, and the paced samples whose pause
        is over. A regular tick also evaluates the open incidents' targets (for ``for`` and
        ``keep_firing_for``), the nodes that said Hello and sent their first Report since, the
        job and fleet rules, and a slice of the fleet's nodes, so every node is swept within
        ``full_sweep_s`` without one tick doing the whole fleet and stalling the loop. A sweep
        evaluates what can change with time alone (see :mod:`collector.incidents.sweep`); the
        first tick evaluates everything. An ``urgent`` tick (an event arrived, or the incident
        service's small tick between regular ones) evaluates only the changed targets (all of a
        node among them that said Hello and sent its first Report since), to act fast, with the
        fleet counts of the last regular tick.

        An ``events`` tick evaluates only the targets that events marked since the last tick
        (an urgent one too): it is what an event that arrives during another tick gets, at that
        tick's next turn. The rest of what changed waits for the next tick; evaluated there
        too, a 4,096-node restart's first Reports made it last seconds, and an Xid that arrived
        meanwhile waited for all of it (bench/collector_ingest.py).
        """
        urgent = urgent or events
        if events:
            if self.tally.counts is None:  # during the first tick's tally: count the fleet
                yield from self.tally.parts()
            # Not an urgent tick's sweep when there were no counts yet: that evaluated every
            # node back since as well, and an Xid in a restart's first tick waited for all.
            sweep = self.sweeper.events_now(self.clock.monotonic(), fleet=self._fleet_map())
        else:
            if not urgent or self.tally.counts is None:
                yield from self.tally.parts()
            sweep = self.sweeper.sweep_now(
                self.clock.monotonic(), urgent=urgent, fleet=self._fleet_map()
            )
        now = sweep.now
        outcomes: list[Outcome] = []
        nodes = self.fleet.view()
        last = ""
        for node, key, _scope, rules, data in self._targets(sweep):
            if node != last:  # a part per node: its targets come together
                yield outcomes
                outcomes, last = [], node
            state = nodes.get(node)
            waiting = state is None or not state.reported
            for rule in rules:
                outcomes += self._evaluate(rule, node, key, data, now, waiting=waiting)
        if not urgent:
            outcomes += self._jobs_and_fleet(sweep)
        yield outcomes

    def _targets(
        self, sweep: Sweep
    ) -> Iterator[tuple[str, str, Scope, tuple[Rule, ...], dict[str, Any]]]:
        """(node, key, scope, rules, data) of every target with rules to evaluate this tick."""
        return self.sweeper.targets(sweep, self.history, self.jobs)

    def _jobs_and_fleet(self, sweep: Sweep) -> list[Outcome]:
        """The job rules on every job and the fleet rules (a regular tick's last part)."""
        outcomes: list[Outcome] = []
        by_scope = self.sweeper.by_scope
        if self.jobs is not None:
            for job in self.jobs.publish():
                key = job_key(job["id"])
                for rule in by_scope[Scope.JOB]:
                    data = {"job": job, "fleet": sweep.fleet}
                    outcomes += self._evaluate(rule, key, key, data, sweep.now)
            # a rank named a culprit (or no longer): its GPU's rules at the next tick
            self.changes.dirty |= {
                (node, gpu_key(node, index)) for node, index in self.jobs.take_culprit_changes()
            }
        for rule in by_scope[Scope.FLEET]:
            data = {"fleet": sweep.fleet}
            outcomes += self._evaluate(rule, FLEET_KEY, FLEET_KEY, data, sweep.now)
        return outcomes

    def _fleet_map(self) -> dict[str, Any]:
        """The ``fleet`` a tick reads: the last regular tick's counts, and the extras."""
        return {**(self.tally.counts or {}), **self.fleet_extras()}

    def _evaluate(  # noqa: PLR0913 - a target's rule, its data, and whether it has any yet
        self,
        rule: Rule,
        node: str,
        key: str,
        data: dict[str, Any],
        now: float,
        *,
        waiting: bool = False,
    ) -> list[Outcome]:
        """Evaluate ``rule`` on one target and let the engine move its incident.

        ``waiting``: the target's node has sent no Report since its Hello or since this
        collector took it back from the journal, so its model holds no readings yet. A rule
        that does not hold there changes nothing: an incident open on it is neither resolved
        nor its ``for`` restarted by the want of data (it would fire again, with new actions,
        a second later when the first Report came in).
        """
        self.evaluations += 1
        context: TargetContext = WindowContext(self, key, now)
        holds, error = self._answer(rule, data, context)
        if error is not None and not error.startswith("NOT_FOUND"):
            count = self.errors[rule.name] = self.errors.get(rule.name, 0) + 1
            if count == 1 or count % ERROR_LOG_EVERY == 0:
                log.warning(
                    "rule_evaluation_failed", rule=rule.name, target=key, error=error, count=count
                )
        if waiting and not holds:
            return []
        occurrences = None
        counted = self._occurrences.get(rule.name)
        if counted is not None and (holds or self.engine.get(rule.name, key) is not None):
            occurrences = self.env.number(counted, data, context)
        transitions = self.engine.observe(
            rule.name,
            node,
            key,
            holds=holds,
            now=now,
            evidence=evidence(rule, data, self.jobs) if holds else "",
            occurrences=occurrences,
        )
        return [Outcome(t, rule, self.verdict(t.incident, rule)) for t in transitions]

    def _answer(
        self, rule: Rule, data: dict[str, Any], context: TargetContext
    ) -> tuple[bool, str | None]:
        """The rule's condition on ``data``: remembered when pure and seen, else from CEL.

        A pure condition's key holds the values of the windows it asks (``context``), so a
        window that moves is a new key, as a field that changes is.
        """
        memo = self.memo
        seen = memo.key(rule.name, data, context)
        if seen is not None and (answer := memo.get(rule.name, seen)) is not None:
            return answer
        words = self.sweeper.reads[rule.name]
        view = cel_view(data, words, cut_signals=self._cut_signals[rule.name])
        answer = self.env.evaluate(self._compiled[rule.name], view, context)
        if seen is not None:
            memo.put(rule.name, seen, answer)
        return answer

    def holds_now(self, incident: Incident) -> bool | None:
        """Whether the incident's rule holds on its target now, evaluated afresh.

        What an action that waited checks before it runs: the condition itself, not the
        incident's phase (``keep_firing_for`` keeps an incident firing after its fault cleared).
        None when the target is gone or the rule is not one of a node's targets.
        """
        rule = self.engine.rules.get(incident.rule)
        if rule is None or rule.scope in (Scope.JOB, Scope.FLEET):
            return None
        now = self.clock.monotonic()
        counts = self.tally.counts if self.tally.counts is not None else self.tally.counts_now()
        sweep = Sweep(
            fleet={**counts, **self.fleet_extras()},
            now=now,
            wanted={(incident.node, incident.target)},
            swept=set(),
            whole=set(),
        )
        for _node, key, scope, _rules, data in self._targets(sweep):
            if key == incident.target and scope == rule.scope:
                holds, _error = self.env.evaluate(
                    self._compiled[rule.name], data, WindowContext(self, key, now)
                )
                return holds
        return None

    def verdict(self, incident: Incident, rule: Rule) -> Verdict:
        """Whether a firing incident is suppressed (by a rule that suppresses) or silenced."""
        return verdict_for(self.engine, incident, rule, self.silencer(incident, rule))
