"""Rule unit tests: timelines of events and samples with the incidents and actions expected.

The idea of ``promtool test rules``, run through the collector's own evaluator:

    rule_files: [builtin]            # "builtin" and/or paths relative to this file
    tests:
      - name: an Xid 79 drains the node
        nodes: {node-01: {gpus: 8, nvlinks: 18, ib_ports: 8}}
        steps:
          - {at: 0s, event: {node: node-01, kind: gpu_lost, gpu: 3, xid: 79}}
          - {at: 2s, sample: {node: node-01, gpu: 3, signal: gpu_present, value: 0}}
          - {at: 1m, sample: {node: node-01, port: mlx5_0/1, signal: ib_state, value: DOWN}}
          - {at: 2m, fleet: {drains_waiting: 1}}   # what the dispatcher reports (drain cap)
          - {at: 0s, job: {id: train, nodes: [node-01], ranks_per_node: 8, compute: 0.8}}
          - {at: 90s, job: {id: train, rank: 3, compute: 1.1}}   # from now on rank 3 is slower
          - {at: 3m, action: {node: node-01, name: reset_gpu}}    # an action ended (succeeded)
          - {at: 4m, lifecycle: {node: node-01, from: in_service, to: suspect}}
        expect:
          - at: 5s
            firing: [gpu_lost@node-01/gpu/3]
            actions: [drain_node@node-01/gpu/3, notify@node-01/gpu/3]

A ``job`` step starts a training job (every rank reports one step a second: ``step_time``,
default 1 s, ``compute`` per rank, ``tokens`` per rank, ``params``) or changes a running one: a
``rank``'s compute time, every rank's ``compute`` or ``step_time``, a ``checkpoint`` of a given
cost written now, or ``stop: true``. ``node_failures: {node: N}`` counts N past failures of a
node (they shorten the checkpoint interval fleetwatch advises).

An ``action`` step says an action ended on a node now (``outcome``, default ``succeeded``), and
a ``lifecycle`` step that the node moved now (``from``, default ``in_service``; ``to``, default
``suspect``; ``by``, default ``rule:test``, ``person:NAME`` for a person's move; ``reason``), as
the dispatcher and the lifecycle tell the collector: they feed the counts a lemon rule reads
(``node.remediations_7d``, ``node.incidents_7d``, ``node.seen_by_person``).

Time runs in whole seconds of a fake clock, evaluating every second. ``actions`` lists what ran
since the previous expectation (suppressed or silenced incidents run none); ``firing`` lists
every incident firing at that moment, as ``rule@target``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import yaml

from collector.incidents.evaluator import NO_DRAINS, Evaluator
from collector.jobs.book import JobBook
from collector.jobs.config import JobsConfig
from collector.model.fleet import FleetModel
from collector.model.recent_faults import RecentFaults
from collector.store.lifecycle import TransitionRow
from fleetwatch.model import EventKind, SampleValue, Target, TargetKind, sample_to_pb
from fleetwatch.testing import FakeClock, made_up_hello, made_up_uuid
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.durations import parse_duration
from rules.engine import Phase
from rules.exceptions import RulesError
from rules.loader import load_rules
from rules.model import Scope
from rules.signals import known
from rules.xid_catalog import load_catalog

if TYPE_CHECKING:
    from pathlib import Path

    from rules.model import RuleSet
    from rules.xid_catalog import XidCatalog


_SCOPES: Final = {
    TargetKind.NODE: Scope.NODE,
    TargetKind.GPU: Scope.GPU,
    TargetKind.NVLINK: Scope.NVLINK,
    TargetKind.IB_PORT: Scope.IB_PORT,
}


BUILTIN_RULES: Final = "builtin"  # in rule_files: the built-in rules (rules/default.yaml)


class RuleTestError(RulesError):
    """A rule test file is malformed; the message names the test and the step."""


@dataclass(slots=True)
class TestResult:
    """One test's outcome: empty ``failures`` means it passed."""

    name: str
    failures: list[str] = field(default_factory=list)


def _target(node: str, raw: dict[str, Any]) -> Target:
    if "port" in raw:
        device, _, port = str(raw["port"]).partition("/")
        return Target.ib_port(device, int(port or 1))
    if "gpu" in raw:
        uuid = made_up_uuid(node, int(raw["gpu"]))
        return Target.nvlink(uuid, int(raw["link"])) if "link" in raw else Target.gpu(uuid)
    return Target.node()


@dataclass(slots=True)
class _Job:
    """A training job the test plays: one step a second from every rank."""

    job_id: str
    ranks: dict[int, tuple[str, str]]  # rank -> (node, GPU uuid)
    step_time: float = 1.0
    compute: dict[int, float] = field(default_factory=dict)
    tokens: float = 1000.0
    params: float = 7e9
    step: int = 0
    running: bool = True  # steps go on
    checkpoint_s: float = 0.0
    described: bool = True  # its agents describe its rank processes (they are alive unless said)
    states: dict[int, str] = field(default_factory=dict)  # rank -> its process's state
    farewells: dict[int, str] = field(default_factory=dict)  # rank -> what it said as it ended

    def processes(self) -> dict[str, list[pb.RankProcess]]:
        """What each node's agent says of this job's rank processes, every poll."""
        by_node: dict[str, list[pb.RankProcess]] = {}
        if self.described:
            for rank, (node, _) in self.ranks.items():
                state = self.states.get(rank, "sleeping")
                process = pb.RankProcess(
                    job_id=self.job_id,
                    rank=rank,
                    state=state,
                    pid=100 + rank,
                    farewell=self.farewells.get(rank, ""),
                )
                by_node.setdefault(node, []).append(process)
        return by_node

    def reports(self, now_unix: float) -> dict[str, pb.JobReport]:
        by_node: dict[str, pb.JobReport] = {}
        checkpoint = self.checkpoint_s
        self.checkpoint_s = 0.0
        for rank, (node, uuid) in self.ranks.items():
            compute = self.compute[rank]
            step = pb.JobStep(
                job_id=self.job_id,
                rank=rank,
                step=self.step,
                time_unix_ms=int(now_unix * 1000),
                step_time_s=max(self.step_time, *self.compute.values()),
                tokens=self.tokens,
                compute_time_s=compute,
                gpu_uuid=uuid,
                world_size=len(self.ranks),
                params=self.params,
            )
            if checkpoint:
                step.checkpoint_start_unix_ms = int((now_unix - checkpoint) * 1000)
                step.checkpoint_end_unix_ms = int(now_unix * 1000)
            by_node.setdefault(node, pb.JobReport()).steps.append(step)
        self.step += 1
        return by_node


def _turn(job: _Job, raw: dict[str, Any]) -> None:
    """A job step's turns: its steps stop, its processes stop being described, exit or change."""
    if raw.get("stop"):  # steps and process descriptions end (an agent too old to watch)
        job.running = job.described = False
    if raw.get("hang"):  # steps end; every rank process stays
        job.running = False
    for rank in _ranks(raw.get("exit"), job):  # these ranks' processes end without a word
        job.states[rank] = "exited"
    for rank in _ranks(raw.get("finish"), job):  # these exit, saying ok
        job.states[rank] = "exited"
        job.farewells[rank] = "ok"
    if "process" in raw:  # {rank: N, state: stopped}
        job.states[int(raw["process"]["rank"])] = str(raw["process"]["state"])


def _ranks(raw: Any, job: _Job) -> list[int]:  # noqa: ANN401 - as the test file wrote it
    """A job step's ranks: ``all``, a number, or a list of numbers (None: none)."""
    if raw is None:
        return []
    if raw == "all":
        return list(job.ranks)
    return [int(r) for r in (raw if isinstance(raw, list) else [raw])]


class _Run:
    """One test: a fleet, an evaluator on a fake clock, and what happened."""

    def __init__(
        self,
        rule_paths: list[Path],
        nodes: dict[str, dict[str, int]],
        *,
        builtin: bool,
        loaded: tuple[RuleSet, XidCatalog] | None = None,
    ) -> None:
        self.clock = FakeClock()
        self.start = self.clock.monotonic()
        self.fleet = FleetModel()
        for name, raw_shape in nodes.items():
            shape = raw_shape or {}
            hello = made_up_hello(
                name,
                gpus=int(shape.get("gpus", 8)),
                nvlinks=int(shape.get("nvlinks", 18)),
                ib_ports=int(shape.get("ib_ports", 8)),
                boot_id="rule-test",
            )
            self.fleet.on_hello(hello, self.clock.monotonic(), self.clock.now())
            self.fleet.apply_report(name, pb.Report())  # an agent's first Report follows
        self.extras = dict(NO_DRAINS)
        self.faults = RecentFaults(self.clock)
        rules, catalog = loaded or (load_rules(rule_paths, builtin=builtin), load_catalog())
        self.book = JobBook(
            config=JobsConfig(), fleet=self.fleet, clock=self.clock, xid_class=catalog.class_of
        )
        self.evaluator = Evaluator(
            rules=rules,
            fleet=self.fleet,
            catalog=catalog,
            clock=self.clock,
            jobs=self.book,
            fleet_extras=lambda: self.extras,
            node_faults=self.faults.fields,
        )
        self.faults.changed.append(self.evaluator.note_node)
        self.fleet.observer = self.evaluator
        self.nodes = nodes
        self.jobs: dict[str, _Job] = {}
        self.actions: list[str] = []

    def advance_to(self, at: float) -> None:
        while self.clock.monotonic() - self.start < at:
            self.clock.advance(1.0)
            for job in self.jobs.values():
                reports = job.reports(self.clock.now()) if job.running else {}
                for node, processes in job.processes().items():
                    reports.setdefault(node, pb.JobReport()).processes.extend(processes)
                for node, report in reports.items():
                    self.book.ingest(node, report)
            self._tick()

    def _tick(self) -> None:
        for outcome in self.evaluator.tick():
            incident = outcome.transition.incident
            if incident.phase != Phase.FIRING:
                continue
            if outcome.verdict.suppressed_by or outcome.verdict.silenced_by:
                continue
            self.actions += [f"{a.name}@{incident.target}" for a in outcome.transition.actions]

    def apply(self, step: dict[str, Any]) -> None:
        if "event" in step:
            raw = step["event"]
            node = str(raw["node"])
            kind = EventKind(str(raw["kind"]))
            if kind == EventKind.NODE_UNREACHABLE:
                self.fleet.mark_unreachable(node)
            self.fleet.apply_event(node, kind, _target(node, raw), int(raw.get("xid", 0)))
        elif "sample" in step:
            self._sample(step["sample"])
        elif "fleet" in step:
            self.extras.update({str(k): v for k, v in dict(step["fleet"]).items()})
        elif "job" in step:
            self._job(dict(step["job"]))
        elif "node_failures" in step:  # failures seen before the test (checkpoint advice)
            for node, count in dict(step["node_failures"]).items():
                for _ in range(int(count)):
                    self.book.note_failure(str(node))
        elif "action" in step or "lifecycle" in step:
            self._fault(step)
        else:
            msg = (
                "a step needs an event, a sample, fleet variables, a job, an action or a "
                f"lifecycle move: {step}"
            )
            raise RuleTestError(msg)
        self._tick()

    def _sample(self, raw: dict[str, Any]) -> None:
        node = str(raw["node"])
        value: SampleValue = raw["value"]
        target = _target(node, raw)
        signal = str(raw["signal"])
        if not known(_SCOPES[target.kind], signal):
            msg = f"unknown signal {signal!r} for a {target.kind} (a typo would test nothing)"
            raise RuleTestError(msg)
        sample = sample_to_pb(target, signal, value)
        self.fleet.apply_report(node, pb.Report(samples=[sample]))

    def _fault(self, step: dict[str, Any]) -> None:
        """An action ended, or the node moved: what the lemon counts are made of.

        As the dispatcher counts the action, as the lifecycle makes the move.
        """
        if "action" in step:
            raw = step["action"]
            outcome = str(raw.get("outcome", "succeeded"))
            self.faults.action(str(raw["name"]), outcome, str(raw["node"]))
            return
        raw = step["lifecycle"]
        row = TransitionRow(
            node=str(raw["node"]),
            state=str(raw.get("to", "suspect")),
            previous=str(raw.get("from", "in_service")),
            at_ms=round(self.clock.now() * 1000),
            actor=str(raw.get("by", "rule:test")),
            reason=str(raw.get("reason", "")),
        )
        self.faults.moved(row)

    def _job(self, raw: dict[str, Any]) -> None:
        job_id = str(raw["id"])
        job = self.jobs.get(job_id)
        if job is None:
            per_node = int(raw.get("ranks_per_node", 8))
            ranks: dict[int, tuple[str, str]] = {}
            for node in raw.get("nodes", list(self.nodes)):
                gpus = int((self.nodes[str(node)] or {}).get("gpus", 8))
                for index in range(min(per_node, gpus)):
                    ranks[len(ranks)] = (str(node), made_up_uuid(str(node), index))
            job = self.jobs[job_id] = _Job(job_id, ranks)
            job.compute = dict.fromkeys(ranks, float(raw.get("compute", 0.8)))
            job.tokens = float(raw.get("tokens", job.tokens))
            job.params = float(raw.get("params", job.params))
        elif "compute" in raw and "rank" not in raw:
            job.compute = dict.fromkeys(job.ranks, float(raw["compute"]))
        if "rank" in raw:
            job.compute[int(raw["rank"])] = float(raw["compute"])
        if "step_time" in raw:
            job.step_time = parse_duration(raw["step_time"])
        if "checkpoint" in raw:
            job.checkpoint_s = parse_duration(raw["checkpoint"])
        _turn(job, raw)

    def firing(self) -> list[str]:
        return sorted(
            f"{i.rule}@{i.target}"
            for i in self.evaluator.engine.open_incidents()
            if i.phase == Phase.FIRING
        )


def run_test(
    test: dict[str, Any],
    rule_paths: list[Path],
    *,
    builtin: bool = False,
    loaded: tuple[RuleSet, XidCatalog] | None = None,
) -> TestResult:
    """Play one test against the rule files (and the built-in rules when ``builtin``).

    Its failures say what was expected and what came. No paths at all means the built-in rules.
    ``loaded``: those rules and the Xid catalog, already loaded (a file's tests share them: the
    rules are frozen, and each test has an evaluator of its own).
    """
    result = TestResult(str(test.get("name", "unnamed")))
    run = _Run(rule_paths, dict(test.get("nodes") or {}), builtin=builtin, loaded=loaded)
    steps = test.get("steps", [])
    timeline = [(parse_duration(s.get("at", 0)), 0, i, s) for i, s in enumerate(steps)]
    timeline += [(parse_duration(e["at"]), 1, i, e) for i, e in enumerate(test.get("expect", []))]
    for at, is_expectation, _, item in sorted(timeline, key=lambda t: (t[0], t[1], t[2])):
        run.advance_to(at)
        if not is_expectation:
            run.apply(item)
            continue
        where = f"at {item['at']}"
        if "firing" in item:
            want = sorted(map(str, item["firing"] or []))
            if run.firing() != want:
                result.failures.append(f"{where}: firing {run.firing()}, expected {want}")
        if "actions" in item:
            want = sorted(map(str, item["actions"] or []))
            if sorted(run.actions) != want:
                result.failures.append(f"{where}: actions {sorted(run.actions)}, expected {want}")
            run.actions.clear()
    return result


def run_file(path: Path) -> list[TestResult]:
    """Run every test of a rule test file."""
    try:
        data = yaml.safe_load(path.read_text("utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        msg = f"{path}: cannot read the rule tests: {exc}"
        raise RuleTestError(msg) from exc
    if not isinstance(data, dict) or not isinstance(data.get("tests"), list):
        msg = f"{path}: expected 'rule_files' and a list of 'tests'"
        raise RuleTestError(msg)
    rule_files = data.get("rule_files", [BUILTIN_RULES])
    if not isinstance(rule_files, list) or not rule_files:
        msg = f"{path}: rule_files must list rule files ({BUILTIN_RULES!r} for the built-in rules)"
        raise RuleTestError(msg)
    builtin = BUILTIN_RULES in rule_files
    rule_paths = [path.parent / str(f) for f in rule_files if f != BUILTIN_RULES]
    results = []
    loaded: tuple[RuleSet, XidCatalog] | None = None
    for test in data["tests"]:
        try:
            # Loaded once for the file; a file that does not load fails each test alike.
            loaded = loaded or (load_rules(rule_paths, builtin=builtin), load_catalog())
            results.append(run_test(test, rule_paths, builtin=builtin, loaded=loaded))
        except (KeyError, ValueError, TypeError, RuleTestError) as exc:
            name = test.get("name", "unnamed") if isinstance(test, dict) else "unnamed"
            results.append(TestResult(str(name), [f"malformed test: {type(exc).__name__}: {exc}"]))
    return results
