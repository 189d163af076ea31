"""What a rule set would do on the fleet as it is now: ``fleetwatch rules eval``.

:func:`dry_run` evaluates every rule of a rule set (the running one, or a new file) on every
target of the live fleet, once, with the live windows, jobs and silences, and changes nothing:
no incident opens, no action is journaled, no limit moves. For each target a rule holds on it
says whether the incident is open already (``firing`` or ``pending``), would fire now, or would
wait its ``for``; and for each of the rule's actions what the dispatcher's safety limits would
answer now (``would run``, ``skipped`` and why: silenced, suppressed, cooldown, already
drained; ``deferred``: the drain cap or the breaker; ``dry run``). Drains are counted as they
would start, so the tenth drain of a new rule meets the cap the first nine filled.

It runs on the event loop (the evaluator's state is the loop's); the API hands it there. A rule
that reads a window the running rules do not keep (a new signal's ``rate()``) reads it empty:
the answer says which, since only a reload makes the collector keep it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from collector.incidents.cel_data import WindowContext
from collector.incidents.evaluator import Evaluator
from collector.incidents.rule_reads import sample_windows
from collector.incidents.sweep import Sweep
from collector.incidents.verdict import evidence, verdict_for
from collector.model.target_keys import FLEET_KEY, job_key
from collector.store.incidents import IncidentRow
from rules.engine import Incident, Phase
from rules.model import Scope

if TYPE_CHECKING:
    from collections.abc import Callable

    from rules.model import ActionSpec, Rule, RuleSet

    # (incident, rule, action, drains assumed started) -> (state, why), changing nothing
    ActionCheck = Callable[[IncidentRow, Rule, ActionSpec, int], tuple[str, str]]

__all__ = ["DryRun", "WouldAction", "WouldFire", "dry_run"]

# What SafetyChecks.refusal's states read as in a dry run.
_SHOWN = {"planned": "would run", "dry_run": "dry run", "shadow": "shadow"}


@dataclass(frozen=True, slots=True)
class WouldAction:
    """One action of a holding rule, and what the safety limits would say now."""

    action: str
    outcome: str
    why: str = ""


@dataclass(frozen=True, slots=True)
class WouldFire:
    """A rule that holds on a target now."""

    rule: str
    node: str
    target: str
    severity: str
    state: str
    evidence: str
    actions: tuple[WouldAction, ...] = ()


@dataclass(slots=True)
class DryRun:
    """The answer: every holding (rule, target), and what could not be evaluated."""

    rules: int
    targets: int = 0
    holds: list[WouldFire] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    unkept_windows: list[str] = field(default_factory=list)
    took_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The API's JSON."""
        return asdict(self)


def _shadow(live: Evaluator, rules: RuleSet) -> Evaluator:
    """An evaluator of ``rules`` reading the live fleet, windows and jobs (no engine state)."""
    shadow = Evaluator(
        rules=rules,
        fleet=live.fleet,
        catalog=live.catalog,
        clock=live.clock,
        env=live.env,
        fleet_extras=live.fleet_extras,
        node_faults=live.node_faults,
    )
    shadow.history = live.history  # the live windows: never written through the shadow
    shadow.jobs = live.jobs  # not attach_jobs: that would hand the book the shadow's history
    return shadow


def _state(live: Evaluator, rule: Rule, key: str) -> str:
    """Open already (firing, pending), or what a first holding would do."""
    open_ = live.engine.get(rule.name, key) if rule.name in live.engine.rules else None
    if open_ is not None and open_.phase in (Phase.PENDING, Phase.FIRING):
        return open_.phase.value
    if rule.for_s > 0:
        return f"would be pending, firing after {rule.for_s:g} s if it still holds"
    return "would fire"


class _Run:
    """One dry run's state: the evaluators, how to ask, and the drains counted so far."""

    def __init__(
        self,
        live: Evaluator,
        rules: RuleSet,
        check: ActionCheck | None,
        expand: Callable[[tuple[ActionSpec, ...]], tuple[ActionSpec, ...]],
    ) -> None:
        self.live = live
        self.shadow = _shadow(live, rules)
        self.check = check
        self.expand = expand
        self.drains: list[str] = []
        self.now = live.clock.monotonic()
        self.now_unix = live.clock.now()
        self.answer = DryRun(rules=len(rules.rules))

    def one(self, rule: Rule, node: str, key: str, data: dict[str, Any]) -> None:
        """Evaluate ``rule`` on one target; keep it when it holds."""
        holds, error = self.shadow.env.evaluate(
            self.shadow._compiled[rule.name],  # noqa: SLF001 - the shadow's own compiled rules
            data,
            WindowContext(self.shadow, key, self.now),
        )
        if error is not None and not error.startswith("NOT_FOUND"):
            self.answer.errors.setdefault(rule.name, f"{key}: {error}"[:300])
            return
        if not holds:
            return
        self.answer.holds.append(
            WouldFire(
                rule=rule.name,
                node=node,
                target=key,
                severity=rule.severity.value,
                state=_state(self.live, rule, key),
                evidence=evidence(rule, data, self.live.jobs),
                actions=self._actions(rule, node, key),
            )
        )

    def _actions(self, rule: Rule, node: str, key: str) -> tuple[WouldAction, ...]:
        live = self.live
        incident = Incident(
            id=f"{rule.name}:{key}:dry-run",
            rule=rule.name,
            node=node,
            target=key,
            phase=Phase.FIRING,
            started_at=self.now_unix,
            fired_at=self.now_unix,
        )
        verdict = verdict_for(live.engine, incident, rule, live.silencer(incident, rule))
        ms = int(self.now_unix * 1000)
        row = IncidentRow(
            id=incident.id,
            rule=rule.name,
            node=node,
            target=key,
            severity=rule.severity.value,
            phase="firing",
            started_ms=ms,
            updated_ms=ms,
            fired_ms=ms,
            suppressed_by=verdict.suppressed_by,
            silenced_by=verdict.silenced_by,
        )
        out = []
        for spec in self.expand(rule.actions):
            if self.check is None:
                out.append(WouldAction(spec.name, "unknown", "no actions are configured"))
                continue
            state, why = self.check(row, rule, spec, len(self.drains))
            if spec.name == "drain_node" and state == "planned" and node not in self.drains:
                self.drains.append(node)
            out.append(WouldAction(spec.name, _SHOWN.get(state, state), why))
        return tuple(out)


def dry_run(
    live: Evaluator,
    rules: RuleSet,
    check: ActionCheck | None,
    expand: Callable[[tuple[ActionSpec, ...]], tuple[ActionSpec, ...]],
) -> DryRun:
    """Evaluate ``rules`` on every target now (see the module's docstring); change nothing.

    ``check`` answers what the safety limits would do with one action (None: no dispatcher);
    ``expand`` turns a rule's actions into the steps the dispatcher runs
    (``reset_gpu: {drain_first: true}`` is a drain, then a reset).
    """
    started = time.perf_counter()
    run = _Run(live, rules, check, expand)
    answer = run.answer
    kept = sample_windows(live.rules)
    answer.unkept_windows = sorted(
        f"{signal} ({window:g} s)"
        for signal, window in sample_windows(rules).items()
        if kept.get(signal, 0) < window
    )
    sweep = Sweep(
        fleet={**(live.tally.counts or live.tally.counts_now()), **live.fleet_extras()},
        now=run.now,
        wanted=set(),
        swept=set(),
        whole=set(live.fleet.view()),
    )
    seen: set[str] = set()
    for node, key, _scope, wanted, data in run.shadow.sweeper.targets(
        sweep, live.history, live.jobs
    ):
        seen.add(key)
        for rule in wanted:
            run.one(rule, node, key, data)
    jobs = live.jobs.summaries() if live.jobs is not None else []
    for rule in rules.rules:
        if rule.scope == Scope.JOB:
            places = [(job_key(j["id"]), {"job": j, "fleet": sweep.fleet}) for j in jobs]
        elif rule.scope == Scope.FLEET:
            places = [(FLEET_KEY, {"fleet": sweep.fleet})]
        else:
            continue
        for key, data in places:
            seen.add(key)
            run.one(rule, key, key, data)
    answer.targets = len(seen)
    answer.took_s = round(time.perf_counter() - started, 4)
    return answer
