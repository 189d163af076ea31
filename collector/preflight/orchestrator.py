"""The orchestrator: runs a plan's rounds over the agents' streams, judges, journals, acts.

:class:`PreflightService` is the collector's pre-flight desk (built by ``collector/main.py``;
the HTTP API and ``fleetwatch preflight`` reach it through :meth:`PreflightService.submit`):

1. the node expression is expanded against the nodes the collector knows
   (:func:`fleetwatch.preflight.hostlist.expand`) and planned (:mod:`collector.preflight.plan`);
2. the run is journaled as started, then each round's tasks go down the nodes' streams at once;
   a node that is not connected, whose stream closes, or that does not answer within the
   round's time gives could_not_run for the checks it was asked, naming the node, never a pass;
   a group (collective, ladder rung) with a member that is not connected is not started;
3. the results are judged (:mod:`collector.preflight.judge`), localised
   (:mod:`collector.preflight.localise`) and journaled with the run's verdict;
4. each node that failed is held out through the ordinary drain action (the dispatcher's cap,
   breaker and cooldown apply; the drain reason names the check).

A run cut short (the collector stopping) is journaled as could_not_run; one left running by a
collector that died is closed so by the next start (:meth:`PreflightService.start`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import structlog

from collector.ingest.session import StreamNotReadyError
from collector.preflight.answers import Misfit, screen_answer
from collector.preflight.judge import (
    Judged,
    NodeKind,
    add_ladder_efficiency,
    judge_run,
    node_verdicts,
)
from collector.preflight.localise import Suspect, localise
from collector.preflight.plan import (
    NodeFacts,
    Plan,
    PlanTimes,
    Round,
    collective_round,
    plan_run,
)
from collector.store.preflight import CUT_SHORT, ResultRow, RunRow
from fleetwatch.clock import unix_ms
from fleetwatch.preflight.hostlist import expand
from fleetwatch.preflight.vocabulary import (
    EXIT_COULD_NOT_RUN,
    EXIT_FAIL,
    EXIT_PASS,
    Check,
    Level,
    Measurement,
    Verdict,
    parse_rate_gbps,
    worst,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from collector.ingest.session import SessionRegistry
    from collector.model.fleet import FleetModel
    from collector.preflight.holds import PreflightHolds
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
    from rules.gates import GateBook

log = structlog.get_logger("collector.preflight")

# A node's answer may come this long after its round's own time (the agent's grace, transit).
ANSWER_MARGIN_S: Final = 15.0
# Results a node must give for the checks it was asked; those per component (GPUs, ports) may
# be none on a node that has none.
_REQUIRED: Final = frozenset(
    {
        Check.GPU_COUNT,
        Check.DRIVER_VERSION,
        Check.P2P_BW,
        Check.H2D_BW,
        Check.D2H_BW,
        Check.ALLREDUCE_NODE,
        Check.ALLREDUCE_MULTI,
        Check.IB_WRITE_BW,
    },
)
_UNITS: Final = {Check.IB_WRITE_BW: "Gb/s", Check.LADDER_THROUGHPUT: "samples/s"}


def new_run_id(clock: Clock) -> str:
    """``pf-20261125T234500-1a2b``: sortable by start, unique enough."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(clock.now()))
    return f"pf-{stamp}-{secrets.token_hex(2)}"


def exit_status(verdict: Verdict | str) -> int:
    """The exit status a Slurm prolog or health check reads: 0 pass (or warn), 1, 2."""
    v = Verdict(verdict)
    if v in (Verdict.PASS, Verdict.WARN):
        return EXIT_PASS
    return EXIT_FAIL if v is Verdict.FAIL else EXIT_COULD_NOT_RUN


class PlanError(ValueError):
    """The run cannot be planned: a node list naming unknown nodes, or no nodes at all."""


@dataclass(slots=True)
class LiveRun:
    """A run in progress, as the API shows it."""

    plan: Plan
    started_ms: int
    round_index: int = 0
    results: dict[str, list[Measurement]] = field(default_factory=dict)
    task: asyncio.Task[RunRow] | None = None
    bisect_rounds: int = 0
    narrowed: tuple[str, ...] | None = None  # bisection's last failing half; () gave up
    # node -> the results it sent that its plan did not ask for (refused; the node is suspect)
    misfits: dict[str, list[tuple[Measurement, str]]] = field(default_factory=dict)
    rounds_done: int = 0  # planned rounds finished (bisection rounds come after them)
    failing: dict[str, str] = field(default_factory=dict)  # node -> its worst verdict so far

    def round_done(self, judged: Sequence[Judged]) -> None:
        """A planned round finished: count it, and keep each failing node's worst verdict."""
        self.rounds_done += 1
        for j in judged:
            if j.verdict in (Verdict.FAIL, Verdict.COULD_NOT_RUN):
                before = self.failing.get(j.node)
                was = [Verdict(before)] if before else []
                self.failing[j.node] = worst([*was, j.verdict]).value

    def to_json(self) -> dict[str, Any]:
        """Progress for ``GET /api/v1/preflight``."""
        rounds = self.plan.rounds
        current = rounds[min(self.round_index, len(rounds) - 1)].name if rounds else ""
        return {
            "id": self.plan.run_id,
            "level": self.plan.level.value,
            "nodes": list(self.plan.nodes),
            "started_ms": self.started_ms,
            "finished_ms": None,
            "verdict": "running",
            "round": f"{self.round_index + 1}/{len(rounds)}: {current}",
            "rounds_done": self.rounds_done,
            "failing": dict(sorted(self.failing.items())),
        }


def could_not_run(check: Check, why: str) -> Measurement:
    """``check`` did not run; ``why`` names the node."""
    return Measurement(check, "node", None, _UNITS.get(check, ""), error=why)


class PreflightService:
    """Plans, runs, judges and journals pre-flight runs; holds failing nodes out."""

    def __init__(  # noqa: PLR0913 - the collector's shared parts, injected
        self,
        *,
        fleet: FleetModel,
        sessions: SessionRegistry,
        journal: Journal,
        clock: Clock,
        book: GateBook,
        collector: str = "",
        holds: PreflightHolds | None = None,
        times: PlanTimes | None = None,
    ) -> None:
        """Nothing runs until :meth:`submit`."""
        self._fleet = fleet
        self._sessions = sessions
        self._journal = journal
        self._clock = clock
        self.book = book
        self._collector = collector
        self.holds = holds
        self.times = times or PlanTimes()
        self.answer_margin_s = ANSWER_MARGIN_S
        self.live: dict[str, LiveRun] = {}
        self.latest: RunRow | None = None  # the newest finished run (metrics)
        self.latest_results: list[ResultRow] = []
        self.runs_total: dict[str, int] = {}  # by verdict
        self.results_refused: Counter[str] = Counter()  # results not fitting their plan, by why
        # node -> (verdict, finished ms) of the newest finished run that qualified it
        self.node_latest: dict[str, tuple[str, int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- life -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Close the runs an earlier process of this collector left running."""
        self._loop = asyncio.get_running_loop()
        now = unix_ms(self._clock)
        closed = await self._journal.do(
            lambda s: s.preflight.close_unfinished(self._collector, now)
        )
        if closed:
            log.warning("preflight_runs_cut_short", runs=closed, why=CUT_SHORT)

    async def stop(self) -> None:
        """Cut the running runs short: each is journaled as could_not_run."""
        for live in list(self.live.values()):
            if live.task is not None and not live.task.done():
                live.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await live.task

    # ---- planning ---------------------------------------------------------------------------

    def facts(self, names: Sequence[str]) -> list[NodeFacts]:
        """What the planner needs of each node, from its Hello and its stream."""
        view = self._fleet.snapshot()
        out = []
        for name in names:
            state = view.get(name)
            session = self._sessions.session(name)
            gpus = list(state.gpus.values()) if state is not None else []
            ports = sorted(state.ports) if state is not None else []
            rates = [
                parse_rate_gbps(state.ports[key].rate) or 0.0 for key in ports
            ] if state is not None else []  # fmt: skip
            out.append(
                NodeFacts(
                    name=name,
                    address=(session.peer_host if session is not None else "") or name,
                    gpus=len(gpus),
                    gpu_model=gpus[0].model if gpus else "",
                    rails=tuple(ports),
                    ib_rate_gbps=max(rates, default=0.0),
                ),
            )
        return out

    def plan(self, level: Level | str, nodes: str = "all", run_id: str | None = None) -> Plan:
        """Plan a run of ``level`` on the nodes ``nodes`` names; PlanError when it cannot."""
        known = sorted(self._fleet.node_names())
        try:
            names = expand(nodes, known)
        except ValueError as exc:
            raise PlanError(str(exc)) from exc
        if not names:
            msg = f"{nodes!r} names no node the collector knows ({len(known)} known)"
            raise PlanError(msg)
        return plan_run(
            run_id or new_run_id(self._clock), Level(level), self.facts(names), self.times
        )

    def kinds(self, facts: Sequence[NodeFacts]) -> dict[str, NodeKind]:
        """The GPU model and NIC generation each node is judged as."""
        return {
            f.name: NodeKind(f.gpu_model, self.book.nic_for_rate(f.ib_rate_gbps) or "")
            for f in facts
        }

    # ---- running ----------------------------------------------------------------------------

    async def submit(self, level: Level | str, nodes: str = "all") -> Plan:
        """Plan a run and start it in the background; the plan says its id."""
        plan = self.plan(level, nodes)
        live = LiveRun(plan, unix_ms(self._clock))
        self.live[plan.run_id] = live
        live.task = asyncio.create_task(self.execute(plan, live), name=f"preflight-{plan.run_id}")
        return plan

    async def run(self, level: Level | str, nodes: str = "all") -> RunRow:
        """Plan and run to the end (for tests, the demo and the bench)."""
        plan = await self.submit(level, nodes)
        task = self.live[plan.run_id].task
        if task is None:  # pragma: no cover - set by submit
            msg = "the run did not start"
            raise RuntimeError(msg)
        return await task

    async def execute(self, plan: Plan, live: LiveRun | None = None) -> RunRow:
        """Run ``plan``'s rounds, judge, journal and act; the finished run's row."""
        live = live or LiveRun(plan, unix_ms(self._clock))
        self.live[plan.run_id] = live
        facts = self.facts(plan.nodes)
        row = RunRow(
            plan.run_id, plan.level.value, plan.nodes, live.started_ms, collector=self._collector
        )
        await self._journal.do(lambda s: s.preflight.start_run(row))
        log.info(
            "preflight_started", run=plan.run_id, level=plan.level.value, nodes=len(plan.nodes)
        )
        try:
            by_name = {f.name: f for f in facts}
            kinds = self.kinds(facts)
            for index, rnd in enumerate(plan.rounds):
                live.round_index = index
                got = await self._round(rnd, live, by_name)
                for node, ms in got.items():
                    live.results.setdefault(node, []).extend(ms)
                live.round_done(judge_run(got, kinds, self.book))
            if plan.level is Level.FULL:
                await self._bisect(plan, live, facts)
        except asyncio.CancelledError:
            await self._finish_cut_short(plan, live)
            raise
        finally:
            self.live.pop(plan.run_id, None)
        return await self._finish(plan, live, facts)

    async def _bisect(self, plan: Plan, live: LiveRun, facts: Sequence[NodeFacts]) -> None:
        """Halve an unexplained failing multi-node all-reduce until the slow half is 2-3 nodes.

        Only when the planned rounds left it unexplained (no node, GPU or rail failed on its
        own): each round runs the two halves' all-reduces at once and keeps the half that fails
        its gate; it stops when both or neither fail (the fabric as a whole, or the pair of
        halves together, is at fault). log2(N) - 1 rounds at most.
        """
        results = {n: list(ms) for n, ms in live.results.items()}
        add_ladder_efficiency(results)
        kinds = self.kinds(facts)
        judged = judge_run(results, kinds, self.book)
        if not any(s.kind == "unexplained" for s in localise(judged, plan.nodes)):
            return
        by_name = {f.name: f for f in facts}
        candidates = [by_name[n] for n in sorted(plan.nodes) if n in by_name]
        if len(candidates) < 4:  # noqa: PLR2004 - "unexplained" names them all already
            return
        step = 0
        while len(candidates) >= 4:  # noqa: PLR2004 - two halves of two at least
            step += 1
            half = len(candidates) // 2
            halves = [candidates[:half], candidates[half:]]
            rnd = collective_round(
                run_id=plan.run_id,
                level=plan.level,
                name=f"bisect {step}",
                groups=halves,
                port=self.times.rendezvous_port + 64 + 2 * step,
                times=self.times,
            )
            live.bisect_rounds += 1
            got = await self._round(rnd, live, by_name)
            for node, ms in got.items():
                live.results.setdefault(node, []).extend(ms)
            failing = []
            for members in halves:
                first = members[0]
                verdicts = [
                    self.book.judge(m, kinds[first.name].gpu_model, kinds[first.name].nic).verdict
                    for m in got.get(first.name, [])
                    if m.check == Check.ALLREDUCE_MULTI
                ]
                if Verdict.FAIL in verdicts:
                    failing.append(members)
            if len(failing) != 1:
                break  # the fault is not in one half: what was narrowed so far stands
            candidates = failing[0]
        whole = len(candidates) == len(plan.nodes)
        live.narrowed = () if whole else tuple(f.name for f in candidates)

    async def _round(
        self, rnd: Round, live: LiveRun, facts: Mapping[str, NodeFacts]
    ) -> dict[str, list[Measurement]]:
        groups_ok: dict[str, str] = {}  # node -> why its group cannot start
        for node, task in rnd.tasks.items():
            for group in task.groups:
                missing = [n for n in group.nodes if self._sessions.session(n) is None]
                if missing and len(group.nodes) > 1:
                    groups_ok[node] = (
                        f"{group.check} on {len(group.nodes)} nodes not started: "
                        f"{', '.join(missing[:8])} not connected"
                    )
        names = list(rnd.tasks)
        answers = await asyncio.gather(
            *(self._ask(n, rnd.tasks[n], rnd.timeout_s, groups_ok.get(n)) for n in names)
        )
        out: dict[str, list[Measurement]] = {}
        for node, answer in zip(names, answers, strict=True):
            out[node] = self._fit(node, rnd.tasks[node], facts.get(node), answer, live)
        # A multi-node collective's or ladder rung's figure is the group's: kept once, from its
        # first node (a member that could not run keeps its error).
        for node, task in rnd.tasks.items():
            for group in task.groups:
                if len(group.nodes) > 1 and group.node_rank > 0:
                    check = Check(group.check)
                    out[node] = [m for m in out[node] if m.check != check or m.error]
        return out

    async def _ask(
        self,
        node: str,
        task: pb.PreflightTask,
        timeout_s: float,
        blocked: str | None,
    ) -> list[Measurement]:
        checks = [Check(c) for c in task.checks]
        if blocked is not None:
            return [could_not_run(c, blocked) for c in checks]
        session = self._sessions.session(node)
        if session is None:
            return [could_not_run(c, f"node {node} is not connected") for c in checks]
        try:
            screened = await session.preflight(task, timeout_s + self.answer_margin_s)
        except TimeoutError:
            why = f"node {node} did not answer within {timeout_s + self.answer_margin_s:g} s"
            return [could_not_run(c, why) for c in checks]
        except (ConnectionError, StreamNotReadyError) as exc:
            why = f"node {node}'s stream closed before it answered ({exc})"
            return [could_not_run(c, why) for c in checks]
        if screened.refused:
            why = f"node {node} refused: {screened.refused}"
            return [could_not_run(c, why) for c in checks]
        return list(screened.measurements)

    def _fit(
        self,
        node: str,
        task: pb.PreflightTask,
        facts: NodeFacts | None,
        answer: list[Measurement],
        live: LiveRun,
    ) -> list[Measurement]:
        """What of ``node``'s answer its plan asked for; the rest is refused and kept aside."""
        facts = facts or NodeFacts(node, node, 0)
        screened = screen_answer(node, task, facts, answer)
        if screened.refused:
            self.results_refused.update(screened.reasons())
            live.misfits.setdefault(node, []).extend(screened.refused)
            first, why = screened.refused[0]
            log.warning(
                "preflight_results_refused",
                run=task.run_id,
                node=node,
                refused=len(screened.refused),
                check=first.check.value,
                component=first.component[:80],
                why=why,
            )
        got = screened.kept
        seen = {m.check for m in got}
        for check in (Check(c) for c in task.checks):
            if check in _REQUIRED and check not in seen:
                got.append(could_not_run(check, f"node {node} gave no {check} result"))
        return got

    async def _finish_cut_short(self, plan: Plan, live: LiveRun) -> None:
        row = RunRow(
            plan.run_id,
            plan.level.value,
            plan.nodes,
            live.started_ms,
            finished_ms=unix_ms(self._clock),
            verdict=Verdict.COULD_NOT_RUN.value,
            collector=self._collector,
            detail=CUT_SHORT,
            node_verdicts=dict.fromkeys(plan.nodes, Verdict.COULD_NOT_RUN.value),
        )
        results = _rows(plan.run_id, judge_cut_short(live.results))
        with contextlib.suppress(Exception):
            await asyncio.shield(self._journal.do(lambda s: s.preflight.finish_run(row, results)))
        self._count(row)
        log.warning("preflight_cut_short", run=plan.run_id)

    async def _finish(self, plan: Plan, live: LiveRun, facts: Sequence[NodeFacts]) -> RunRow:
        results = live.results
        add_ladder_efficiency(results)
        judged = judge_run(results, self.kinds(facts), self.book)
        suspects = localise(judged, plan.nodes) + _bisected(live) + _misfits(live)
        per_node = node_verdicts(judged, plan.nodes)
        for s in suspects:
            if s.node in per_node:
                per_node[s.node] = worst([per_node[s.node], s.verdict])
        verdict = worst([j.verdict for j in judged] + list(per_node.values()))
        detail = summary(judged, suspects, per_node)
        row = RunRow(
            plan.run_id,
            plan.level.value,
            plan.nodes,
            live.started_ms,
            finished_ms=unix_ms(self._clock),
            verdict=verdict.value,
            collector=self._collector,
            detail=detail,
            node_verdicts={n: v.value for n, v in per_node.items()},
            suspects=[s.to_json() for s in suspects],
        )
        rows = _rows(plan.run_id, judged)
        await self._journal.do(lambda s: s.preflight.finish_run(row, rows))
        self.latest, self.latest_results = row, rows
        self._count(row)
        log.info("preflight_finished", run=plan.run_id, verdict=verdict.value, detail=detail)
        if self.holds is not None:
            for node, verdict in per_node.items():
                if verdict in (Verdict.PASS, Verdict.WARN):
                    self.holds.passed(node)
            await self._hold_failed(row, judged, suspects)
        return row

    def _count(self, row: RunRow) -> None:
        self.runs_total[row.verdict] = self.runs_total.get(row.verdict, 0) + 1
        for node, verdict in (row.node_verdicts or {}).items():
            self.node_latest[node] = (verdict, row.finished_ms)

    async def _hold_failed(
        self, row: RunRow, judged: Sequence[Judged], suspects: Sequence[Suspect]
    ) -> None:
        holds = self.holds
        if holds is None:
            return
        for node, verdict in sorted((row.node_verdicts or {}).items()):
            if verdict != Verdict.FAIL.value:
                continue
            check = first_failed_check(node, judged, suspects)
            await holds.hold(node, check, row.id, row.started_ms)


def _misfits(live: LiveRun) -> list[Suspect]:
    """Each node whose answer did not fit its plan: suspect itself, and failed (held out)."""
    out = []
    for node, refused in sorted(live.misfits.items()):
        misfit = Misfit(node, tuple(refused))
        check = refused[0][0].check.value
        out.append(Suspect("node", node, "node", check, Verdict.FAIL, misfit.reason[:1000]))
    return out


def _bisected(live: LiveRun) -> list[Suspect]:
    """What the bisection rounds narrowed an unexplained all-reduce to (no node is held)."""
    if live.narrowed is None:
        return []
    rounds = live.bisect_rounds
    if not live.narrowed:
        why = (
            f"{rounds} bisection rounds could not narrow the slow all-reduce: both halves or "
            "neither failed (the fabric as a whole, or the halves only together)"
        )
        return [Suspect("bisection", "", "nodes", Check.ALLREDUCE_MULTI.value, Verdict.FAIL, why)]
    why = (
        f"after {rounds} bisection rounds the all-reduce is slow only on "
        f"{', '.join(live.narrowed)} (each half of the nodes tested at once)"
    )
    return [
        Suspect(
            "bisection",
            "",
            f"nodes:{len(live.narrowed)}",
            Check.ALLREDUCE_MULTI.value,
            Verdict.FAIL,
            why,
            nodes=live.narrowed,
        )
    ]


def first_failed_check(node: str, judged: Sequence[Judged], suspects: Sequence[Suspect]) -> str:
    """The check a node's drain reason names: its first own failure, else its suspect's."""
    for j in judged:
        if j.node == node and not j.shared and j.verdict is Verdict.FAIL:
            return j.m.check.value
    for s in suspects:
        if s.node == node and s.verdict is Verdict.FAIL:
            return s.check
    return "preflight"


def judge_cut_short(results: Mapping[str, Sequence[Measurement]]) -> list[Judged]:
    """What a cut-short run had gathered, every one could_not_run (it was never judged whole)."""
    return [
        Judged(node, m, Verdict.COULD_NOT_RUN, "", CUT_SHORT)
        for node, ms in results.items()
        for m in ms
    ]


def _rows(run_id: str, judged: Sequence[Judged]) -> list[ResultRow]:
    return [
        ResultRow(
            run_id=run_id,
            node=j.node,
            check=j.m.check.value,
            component=j.m.component,
            value=j.m.value,
            unit=j.m.unit,
            text=j.m.text,
            error=j.m.error,
            evidence=j.m.evidence,
            verdict=j.verdict.value,
            gate=j.gate,
            reason=j.reason,
        )
        for j in judged
    ]


def summary(
    judged: Sequence[Judged], suspects: Sequence[Suspect], per_node: Mapping[str, Verdict]
) -> str:
    """One line: how many nodes passed, failed, could not run; what was blamed."""
    counts: dict[str, int] = {}
    for v in per_node.values():
        counts[v.value] = counts.get(v.value, 0) + 1
    parts = [f"{n} {v}" for v, n in sorted(counts.items())]
    blamed = [f"{s.kind} {s.component}" + (f" on {s.node}" if s.node else "") for s in suspects]
    line = f"{len(per_node)} node{'' if len(per_node) == 1 else 's'}: " + ", ".join(parts)
    if blamed:
        line += "; blamed: " + "; ".join(blamed[:8])
    cnr = sum(1 for j in judged if j.verdict is Verdict.COULD_NOT_RUN)
    if cnr:
        line += f"; {cnr} results could not run"
    return line[:2000]
