"""Job correlation: how well fleetwatch attributes a training job's slowdown to the right node.

Run from the repository root: ``.venv/bin/python bench/correlation.py [--seed N] [--quick]``.
The last line of output is one JSON object (see the project's benchmark contract); before it,
one table per case family for people.

What runs: for every case, the collector's real job correlator and rules, in this process, on a
fake clock: a :class:`collector.model.fleet.FleetModel` told about the job's nodes by Hellos
(8 GPUs "NVIDIA H100 80GB HBM3" and 8 IB ports each), the
:class:`collector.incidents.evaluator.Evaluator` with the built-in rules (``rules/default.yaml``)
and a :class:`collector.jobs.book.JobBook` with the default ``JobsConfig``, wired as the
collector wires them. Each simulated second the job finishes one step: every rank's ``JobStep``
goes through ``JobBook.ingest`` (one ``JobReport`` per node), hardware state arrives as samples
(``FleetModel.apply_report``) and events (``FleetModel.apply_event``), then ``Evaluator.tick()``
runs and the job's published map (``JobBook.summaries()``) is read.

The job: N ranks (8 a node; 8, 32, 128 or 512 ranks). A rank's compute time is
0.8 s x (1 + gauss(0, 0.02)), and 1% of rank-steps take 30% longer (a GC pause, say); the step
time every rank reports is the slowest compute plus communication, 0.2 s x (1 + gauss(0, 0.02));
tokens per rank are fixed. 60 steps of baseline, then the case's onset (step 60), then 120 more.

A slowdown of s is lost throughput: the rank computes ``1 / (1 - s)`` times as long (s = 10%:
compute x 1.111, i.e. 11.1% above the job median). The same definition applies to a workload
slowdown, on every rank.

Case families:

* ``slowdown``: 1 (a quarter of the cases: 2) random ranks slowed by s in {5, 7.5, 10, 15, 20,
  30, 50}%; half of the cases also show hardware evidence on the slowed GPU from the onset
  (clock event reason 0x40, hw thermal; 91 degrees C; SM clock 1980 x (1 - s) MHz).
* ``fault_no_impact``: a hardware fault on one random GPU of a random node, from the onset, that
  does not slow its rank: Xid 13 (twice), ECC single-bit errors growing, PCIe replays growing
  (180 a minute), thermal throttling samples (0x40, 92 degrees C, SM clock 1700 MHz), or all four.
* ``workload``: every rank slowed alike by s in {10, ..., 50}%: no node to blame.
* ``fabric``: communication time x 2, 3 or 4 and ``ib_port_xmit_wait_per_second`` 250000 on
  every IB port of 30% of the job's nodes (at least 3, the default fabric_min_nodes); compute
  unchanged: no node to blame.
  Single-node jobs have no fabric cases.

An *attribution* is a node fleetwatch names as the cause: a node in the job's
``straggler_nodes``, or the first of its ``suspects`` while ``drop`` is true and ``drop_cause``
is "hardware". It is correct when the case is a ``slowdown`` case, the node hosts a slowed rank
and it was named at or after the onset; every other attribution (any node in the other
families, a wrong node, a node named only before the onset) is false. Attributions count once
per (case, node).

Figures:

* ``recall_slowdown_ge_10pct``: the share of ``slowdown`` cases with s >= 10% where every slowed
  rank's node appeared in ``straggler_nodes`` at or after the onset.
* ``recall_slowdown_ge_5pct``: the same share over the ``slowdown`` cases with s >= 5%.
* ``precision``: correct attributions / all attributions (null when there were none).
* ``false_attributions``: the count of false ones.
* ``max_detection_delay_steps``: the largest (first detection step - onset step) over detected
  ``slowdown`` cases with s >= 10% (the step by which every slowed node was named as a
  straggler) and over detected ``workload`` and ``fabric`` drops (``drop`` true).

Paging is reported apart, for information: the steps from the onset until ``gpu_straggler``
(which has ``for: 1m``: about 60 steps after the straggler is flagged), ``job_throughput_drop``
and ``job_fabric_degraded`` (``for: 1m``) fire.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

from collector.incidents.evaluator import Evaluator
from collector.jobs.book import JobBook
from collector.jobs.config import JobsConfig
from collector.model.fleet import FleetModel
from collector.model.target_keys import gpu_key
from fleetwatch.logs import configure_logging
from fleetwatch.model import EventKind, SampleValue, Target, sample_to_pb
from fleetwatch.testing import FakeClock, made_up_hello, made_up_uuid
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.engine import Phase
from rules.loader import load_rules
from rules.xid_catalog import load_catalog

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from rules.model import RuleSet
    from rules.xid_catalog import XidCatalog

JOB_ID: Final = "train"
GPU_MODEL: Final = "NVIDIA H100 80GB HBM3"
RANKS_PER_NODE: Final = 8
IB_PORTS: Final = 8
BASELINE_STEPS: Final = 60
ONSET: Final = BASELINE_STEPS  # the first step of the case's change
AFTER_STEPS: Final = 120
STEPS: Final = BASELINE_STEPS + AFTER_STEPS
COMPUTE_S: Final = 0.8
COMM_S: Final = 0.2
JITTER: Final = 0.02
SPIKE_P: Final = 0.01  # share of rank-steps with a pause
SPIKE: Final = 0.30  # ... that long
TOKENS: Final = 8192.0
PARAMS: Final = 7e9
NORMAL_SM_CLOCK: Final = 1980
HW_THERMAL: Final = 0x40
CONGESTED_WAIT: Final = 250_000.0
FABRIC_NODE_SHARE: Final = 0.30
FABRIC_MIN_NODES: Final = 3  # what fleetwatch calls spread (collector.jobs fabric_min_nodes)
TWO_RANKS_P: Final = 0.25
BIG_JOB: Final = 512  # ranks; a few cases only, they take the longest

SLOWDOWNS: Final = (0.05, 0.075, 0.10, 0.15, 0.20, 0.30, 0.50)
WORKLOADS: Final = (0.10, 0.20, 0.30, 0.40, 0.50)
COMM_FACTORS: Final = (2.0, 3.0, 4.0)
FAULTS: Final = ("xid13", "ecc_sbe", "pcie_replay", "thermal", "all")
FAMILIES: Final = ("slowdown", "fault_no_impact", "workload", "fabric")

RECALL_MIN_SLOWDOWN: Final = 0.10
FAIL_SLOW_MIN_SLOWDOWN: Final = 0.05  # recall_slowdown_ge_5pct
RECALL_TARGET: Final = 0.95
DELAY_TARGET_STEPS: Final = 30
EXPECTED_CAUSE: Final = {"workload": "none", "fabric": "fabric"}
PAGING_RULES: Final = ("gpu_straggler", "job_throughput_drop", "job_fabric_degraded")
BLAMING: Final = "suspects:"  # how a job incident's evidence starts naming nodes


@dataclass(frozen=True, slots=True)
class Case:
    """One simulated job and what happens to it at the onset."""

    family: str
    index: int
    ranks: int
    size: float = 0.0  # slowdown share (slowdown and workload)
    hardware: bool = False  # slowdown: thermal evidence on the slowed GPUs
    fault: str = ""  # fault_no_impact: which fault
    comm_factor: float = 1.0  # fabric: communication time x this

    @property
    def nodes(self) -> int:
        """Nodes the job runs on."""
        return self.ranks // RANKS_PER_NODE

    @property
    def label(self) -> str:
        """A short name for people."""
        what = {
            "slowdown": f"s={self.size:.1%} {'hw' if self.hardware else 'no-hw'}",
            "fault_no_impact": self.fault,
            "workload": f"s={self.size:.0%}",
            "fabric": f"comm x{self.comm_factor:g}",
        }[self.family]
        return f"{self.family}#{self.index} {self.ranks} ranks {what}"


@dataclass(slots=True)
class Outcome:
    """What fleetwatch said about one case, by step (steps count from 0; the onset is 60)."""

    case: Case
    slowed: dict[int, str] = field(default_factory=dict)  # slowed rank -> its node
    touched: tuple[str, ...] = ()  # nodes with a fault (fault_no_impact) or congestion (fabric)
    before: set[str] = field(default_factory=set)  # nodes attributed before the onset
    straggler_at: dict[str, int] = field(default_factory=dict)  # first step >= onset named
    suspect_at: dict[str, int] = field(default_factory=dict)  # first step >= onset, 1st suspect
    first_straggler: int | None = None  # first step >= onset with any straggler
    first_drop: int | None = None  # first step >= onset with drop true
    drop_before: bool = False  # a drop during the baseline
    cause_at_detection: str = ""
    causes: Counter[str] = field(default_factory=Counter)  # drop_cause over steps with a drop
    first_fabric: int | None = None
    paged: dict[str, list[int]] = field(default_factory=dict)  # "rule@target" -> firing steps
    drop_page: str = ""  # evidence of the first job_throughput_drop firing at or after onset
    sim_s: float = 0.0

    @property
    def slowed_nodes(self) -> set[str]:
        """The nodes hosting a slowed rank."""
        return set(self.slowed.values())

    def attributed(self) -> set[str]:
        """Every node named as the cause, at any step."""
        return self.before | set(self.straggler_at) | set(self.suspect_at)

    def correct(self) -> set[str]:
        """The attributions that name a slowed node at or after the onset."""
        if self.case.family != "slowdown":
            return set()
        return (set(self.straggler_at) | set(self.suspect_at)) & self.slowed_nodes

    def false(self) -> set[str]:
        """The attributions that are wrong."""
        return self.attributed() - self.correct()

    def detected_at(self) -> int | None:
        """Slowdown: the step by which every slowed node was named a straggler (None: never)."""
        steps = [self.straggler_at.get(node) for node in self.slowed_nodes]
        if not steps or any(s is None for s in steps):
            return None
        return max(s for s in steps if s is not None)

    def delay(self) -> int | None:
        """Steps from the onset to detection: stragglers (slowdown) or the drop (others)."""
        if self.case.family == "slowdown":
            at = self.detected_at()
        elif self.case.family in EXPECTED_CAUSE:
            at = self.first_drop
        else:
            return None
        return None if at is None else at - ONSET

    def cause_ok(self) -> bool:
        """Workload and fabric: every cause given while the drop was on is the expected one."""
        expected = EXPECTED_CAUSE.get(self.case.family)
        return expected is not None and set(self.causes) == {expected}

    def where(self) -> str:
        """The case's random picks, for people: slowed ranks, faulty or congested nodes."""
        if self.slowed:
            return f" (slowed ranks {sorted(self.slowed)} on {sorted(self.slowed_nodes)})"
        if self.case.family == "fabric":
            return f" ({len(self.touched)}/{self.case.nodes} nodes congested)"
        if self.touched:
            return f" (fault on {self.touched[0]})"
        return ""

    def stray_pages(self) -> list[str]:
        """gpu_straggler firings on GPUs whose rank was not slowed (any step)."""
        slowed = slowed_gpus(self)
        return [
            key
            for key in self.paged
            if key.partition("@")[0] == "gpu_straggler" and key.partition("@")[2] not in slowed
        ]

    def baseline_pages(self) -> int:
        """Firings of the job correlation rules before the onset."""
        return sum(
            at < ONSET
            for key, firings in self.paged.items()
            if key.partition("@")[0] in PAGING_RULES
            for at in firings
        )

    def page_delay(self, rule: str, targets: set[str] | None = None) -> int | None:
        """Steps from the onset to the first firing of ``rule`` (on one of ``targets``)."""
        steps = [
            at
            for key, firings in self.paged.items()
            if key.partition("@")[0] == rule
            and (targets is None or key.partition("@")[2] in targets)
            for at in firings
            if at >= ONSET
        ]
        return min(steps) - ONSET if steps else None


class Simulation:
    """One case: a fleet, the evaluator and job book on a fake clock, and the job's steps."""

    def __init__(self, case: Case, seed: int, rules: RuleSet, catalog: XidCatalog) -> None:
        """Build the fleet and the collector's parts, and pick the case's random targets."""
        self.case = case
        self.rng = random.Random(f"{seed}/{case.family}/{case.index}")
        self.clock = FakeClock()
        self.fleet = FleetModel()
        self.nodes = [f"node-{i:03d}" for i in range(case.nodes)]
        for name in self.nodes:
            node = made_up_hello(
                name, gpus=RANKS_PER_NODE, ib_ports=IB_PORTS, model=GPU_MODEL, boot_id="bench"
            )
            self.fleet.on_hello(node, self.clock.monotonic(), self.clock.now())
        self.book = JobBook(config=JobsConfig(), fleet=self.fleet, clock=self.clock)
        self.evaluator = Evaluator(
            rules=rules, fleet=self.fleet, catalog=catalog, clock=self.clock, jobs=self.book
        )
        self.fleet.observer = self.evaluator
        self.outcome = Outcome(case)
        self.compute_factor = dict.fromkeys(range(case.ranks), 1.0)
        self.comm_factor = 1.0
        self.counters: dict[tuple[str, int, str], float] = {}
        self.fault_gpu: tuple[str, int] = ("", 0)
        self._pick()

    def where(self, rank: int) -> tuple[str, int]:
        """(node, GPU index) of a rank."""
        return self.nodes[rank // RANKS_PER_NODE], rank % RANKS_PER_NODE

    def _pick(self) -> None:
        """Choose the slowed ranks, the faulty GPU or the congested nodes."""
        case, rng = self.case, self.rng
        if case.family == "slowdown":
            count = 2 if rng.random() < TWO_RANKS_P else 1
            for rank in rng.sample(range(case.ranks), count):
                self.outcome.slowed[rank] = self.where(rank)[0]
        elif case.family == "fault_no_impact":
            self.fault_gpu = (rng.choice(self.nodes), rng.randrange(RANKS_PER_NODE))
            self.outcome.touched = (self.fault_gpu[0],)
        elif case.family == "fabric":
            count = max(FABRIC_MIN_NODES, math.ceil(FABRIC_NODE_SHARE * case.nodes))
            self.outcome.touched = tuple(sorted(rng.sample(self.nodes, count)))

    # ---- hardware -------------------------------------------------------------------------

    def gpu_samples(self, node: str, index: int, values: dict[str, SampleValue]) -> None:
        """Samples of one GPU, as its agent reports them."""
        target = Target.gpu(made_up_uuid(node, index))
        samples = [sample_to_pb(target, signal, value) for signal, value in values.items()]
        self.fleet.apply_report(node, pb.Report(samples=samples))

    def baseline_hardware(self) -> None:
        """A healthy fleet's first report: clocks, temperatures, PCIe and IB ports."""
        for node in self.nodes:
            samples = []
            for index in range(RANKS_PER_NODE):
                target = Target.gpu(made_up_uuid(node, index))
                values: dict[str, SampleValue] = {
                    "sm_clock_mhz": NORMAL_SM_CLOCK,
                    "temperature_celsius": self.rng.randint(52, 64),
                    "clock_event_reasons": 0,
                    "ecc_sbe_volatile_total": 0,
                    "pcie_replay_count": 0,
                    "pcie_link_gen": 5,
                    "pcie_link_gen_max": 5,
                    "pcie_link_width": 16,
                    "pcie_link_width_max": 16,
                }
                samples += [sample_to_pb(target, s, v) for s, v in values.items()]
            for port in range(IB_PORTS):
                target = Target.ib_port(f"mlx5_{port}", 1)
                values = {
                    "ib_state": "ACTIVE",
                    "ib_phys_state": "LinkUp",
                    "ib_port_xmit_wait_per_second": float(self.rng.randint(0, 5000)),
                }
                samples += [sample_to_pb(target, s, v) for s, v in values.items()]
            self.fleet.apply_report(node, pb.Report(samples=samples))

    def grow(self, node: str, index: int, signal: str, by: float) -> None:
        """A counter of one GPU grows by ``by``."""
        key = (node, index, signal)
        self.counters[key] = self.counters.get(key, 0.0) + by
        self.gpu_samples(node, index, {signal: int(self.counters[key])})

    def onset(self) -> None:
        """The case's change, at the onset step."""
        case = self.case
        if case.family == "slowdown":
            for rank in self.outcome.slowed:
                self.compute_factor[rank] = 1.0 / (1.0 - case.size)
                if case.hardware:
                    node, index = self.where(rank)
                    clock = round(NORMAL_SM_CLOCK * (1.0 - case.size))
                    self.gpu_samples(
                        node,
                        index,
                        {
                            "clock_event_reasons": HW_THERMAL,
                            "temperature_celsius": 91,
                            "sm_clock_mhz": clock,
                        },
                    )
        elif case.family == "fault_no_impact" and case.fault in ("thermal", "all"):
            node, index = self.fault_gpu
            self.gpu_samples(
                node,
                index,
                {
                    "clock_event_reasons": HW_THERMAL,
                    "temperature_celsius": 92,
                    "sm_clock_mhz": 1700,
                },
            )
        elif case.family == "workload":
            self.compute_factor = dict.fromkeys(self.compute_factor, 1.0 / (1.0 - case.size))
        elif case.family == "fabric":
            self.comm_factor = case.comm_factor
            for node in self.outcome.touched:
                samples = [
                    sample_to_pb(
                        Target.ib_port(f"mlx5_{port}", 1),
                        "ib_port_xmit_wait_per_second",
                        CONGESTED_WAIT,
                    )
                    for port in range(IB_PORTS)
                ]
                self.fleet.apply_report(node, pb.Report(samples=samples))

    def fault_step(self, step: int) -> None:
        """A ``fault_no_impact`` case's fault, as it goes on after the onset."""
        fault = self.case.fault
        node, index = self.fault_gpu
        since = step - ONSET
        if fault in ("xid13", "all") and since in (0, 30):
            self.fleet.apply_event(node, EventKind.XID, Target.gpu(made_up_uuid(node, index)), 13)
        if since % 5 == 0:
            if fault in ("ecc_sbe", "all"):
                self.grow(node, index, "ecc_sbe_volatile_total", 25)
            if fault in ("pcie_replay", "all"):
                self.grow(node, index, "pcie_replay_count", 15)

    # ---- the job --------------------------------------------------------------------------

    def reports(self, step: int) -> dict[str, pb.JobReport]:
        """Every rank's report of one step, by node."""
        rng = self.rng
        compute = []
        for rank in range(self.case.ranks):
            seconds = COMPUTE_S * (1.0 + rng.gauss(0.0, JITTER)) * self.compute_factor[rank]
            if rng.random() < SPIKE_P:
                seconds *= 1.0 + SPIKE
            compute.append(seconds)
        step_time = max(compute) + COMM_S * (1.0 + rng.gauss(0.0, JITTER)) * self.comm_factor
        unix_ms = int(self.clock.now() * 1000)
        by_node: dict[str, pb.JobReport] = {}
        for rank, seconds in enumerate(compute):
            node, index = self.where(rank)
            by_node.setdefault(node, pb.JobReport()).steps.append(
                pb.JobStep(
                    job_id=JOB_ID,
                    rank=rank,
                    step=step,
                    time_unix_ms=unix_ms,
                    step_time_s=step_time,
                    tokens=TOKENS,
                    compute_time_s=seconds,
                    gpu_uuid=made_up_uuid(node, index),
                    world_size=self.case.ranks,
                    params=PARAMS,
                ),
            )
        return by_node

    def run(self) -> Outcome:
        """Play the case's steps and note what fleetwatch said when."""
        began = time.perf_counter()
        self.baseline_hardware()
        for step in range(STEPS):
            self.clock.advance(1.0)
            if step == ONSET:
                self.onset()
            if self.case.family == "fault_no_impact" and step >= ONSET:
                self.fault_step(step)
            for node, report in self.reports(step).items():
                self.book.ingest(node, report)
            for o in self.evaluator.tick():
                incident = o.transition.incident
                if incident.phase != Phase.FIRING:
                    continue
                self.outcome.paged.setdefault(f"{o.rule.name}@{incident.target}", []).append(step)
                if o.rule.name == "job_throughput_drop" and step >= ONSET:
                    self.outcome.drop_page = self.outcome.drop_page or incident.evidence
            maps = [m for m in self.book.summaries() if m["id"] == JOB_ID]
            if maps:
                self.note(step, maps[0])
        self.outcome.sim_s = time.perf_counter() - began
        return self.outcome

    def note(self, step: int, job: dict[str, Any]) -> None:
        """Read the job's published map after one step."""
        out = self.outcome
        named = list(job["straggler_nodes"])
        suspect = (
            str(job["suspects"][0])
            if job["drop"] and job["drop_cause"] == "hardware" and job["suspects"]
            else None
        )
        if step < ONSET:
            out.before.update(named)
            if suspect is not None:
                out.before.add(suspect)
            out.drop_before = out.drop_before or bool(job["drop"])
            return
        for node in named:
            out.straggler_at.setdefault(node, step)
        if suspect is not None:
            out.suspect_at.setdefault(suspect, step)
        if named and out.first_straggler is None:
            out.first_straggler = step
        if job["drop"]:
            if out.first_drop is None:
                out.first_drop = step
                out.cause_at_detection = str(job["drop_cause"])
            out.causes[str(job["drop_cause"])] += 1
        if job["fabric"] and out.first_fabric is None:
            out.first_fabric = step


# ---- the cases ------------------------------------------------------------------------------


def _per_size(ranks: int, rep: int, *, quick: bool) -> list[Case]:
    """One round of cases on a job of ``ranks`` (indices are set by :func:`plan`)."""
    out = []
    for i, s in enumerate(SLOWDOWNS):
        out.append(Case("slowdown", 0, ranks, size=s, hardware=(i + rep) % 2 == 0))
        if not quick:
            out.append(Case("slowdown", 0, ranks, size=s, hardware=(i + rep) % 2 == 1))
    out += [Case("fault_no_impact", 0, ranks, fault=f) for f in FAULTS[:: 2 if quick else 1]]
    out += [Case("workload", 0, ranks, size=s) for s in WORKLOADS[:: 2 if quick else 1]]
    if ranks > RANKS_PER_NODE:  # one node: no fabric between nodes
        out += [Case("fabric", 0, ranks, comm_factor=f) for f in COMM_FACTORS]
    return out


def _big_job() -> list[Case]:
    """The few cases on a job of 512 ranks (each takes a few seconds)."""
    return [
        *(
            Case("slowdown", 0, BIG_JOB, size=s, hardware=i % 2 == 0)
            for i, s in enumerate(SLOWDOWNS)
        ),
        *(Case("fault_no_impact", 0, BIG_JOB, fault=f) for f in ("thermal", "all")),
        *(Case("workload", 0, BIG_JOB, size=s) for s in (0.2, 0.4)),
        *(Case("fabric", 0, BIG_JOB, comm_factor=f) for f in (2.0, 4.0)),
    ]


def plan(*, quick: bool) -> list[Case]:
    """Every case, in a fixed order (the seed only moves what happens inside them).

    Full: jobs of 8, 32 and 128 ranks three times over (every slowdown size with and without
    hardware evidence, every fault, every workload slowdown, every fabric factor) and a few of
    512 ranks. Quick: 8 and 32 ranks once, hardware evidence on every other slowdown size, every
    other fault and workload slowdown.
    """
    reps = 1 if quick else 3
    sizes = (8, 32) if quick else (8, 32, 128)
    drafts = [
        c for ranks in sizes for rep in range(reps) for c in _per_size(ranks, rep, quick=quick)
    ]
    if not quick:
        drafts += _big_job()
    counts: Counter[str] = Counter()
    cases = []
    for draft in drafts:
        cases.append(replace(draft, index=counts[draft.family]))
        counts[draft.family] += 1
    return cases


# ---- figures --------------------------------------------------------------------------------


def share(part: int, whole: int) -> float | None:
    """Return part / whole, rounded; None when there is no whole."""
    return round(part / whole, 4) if whole else None


def fmt_share(part: int, whole: int) -> str:
    """'part/whole (pct)' for a table."""
    return f"{part}/{whole} ({part / whole:.0%})" if whole else "-"


def spread(values: Iterable[int | None]) -> str:
    """'median / max' of the known values, '-' when none."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    return f"{statistics.median(known):g} / {max(known)}"


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print one aligned table."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print(f"\n{title}")
    for n, row in enumerate(cells):
        print(
            "  "
            + "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths))


def grouped(
    outcomes: Sequence[Outcome], family: str, key: Callable[[Case], float]
) -> list[tuple[float, list[Outcome]]]:
    """The family's outcomes grouped by ``key`` of their case, keys in order."""
    groups: dict[float, list[Outcome]] = {}
    for o in outcomes:
        if o.case.family == family:
            groups.setdefault(key(o.case), []).append(o)
    return sorted(groups.items())


def slowdown_tables(outcomes: Sequence[Outcome]) -> None:
    """Slowdown: detection by size, with and without hardware evidence, and by job size."""
    rows = []
    for s, group in grouped(outcomes, "slowdown", lambda c: c.size):
        hw = [o for o in group if o.case.hardware]
        plain = [o for o in group if not o.case.hardware]
        drops = [o for o in group if o.first_drop is not None]
        rows.append(
            [
                f"{s:.1%}",
                len(group),
                fmt_share(sum(o.detected_at() is not None for o in group), len(group)),
                fmt_share(sum(o.detected_at() is not None for o in hw), len(hw)),
                fmt_share(sum(o.detected_at() is not None for o in plain), len(plain)),
                spread(o.delay() for o in group),
                fmt_share(len(drops), len(group)),
                fmt_share(sum(bool(set(o.suspect_at) & o.slowed_nodes) for o in drops), len(drops)),
                sum(len(o.false()) for o in group),
            ],
        )
    table(
        "slowdown: s = lost throughput, the slowed rank computes 1/(1-s) times as long "
        "(detected = every slowed node in straggler_nodes; delay in steps from the onset)",
        [
            "s",
            "cases",
            "detected",
            "with hw evidence",
            "without",
            "delay med / max",
            "drop seen",
            "slowed node 1st suspect (of drops)",
            "false attr",
        ],
        rows,
    )
    rows = []
    for ranks, group in grouped(outcomes, "slowdown", lambda c: c.ranks):
        big = [o for o in group if o.case.size >= RECALL_MIN_SLOWDOWN]
        small = [o for o in group if o.case.size < RECALL_MIN_SLOWDOWN]
        rows.append(
            [
                int(ranks),
                len(group),
                fmt_share(sum(o.detected_at() is not None for o in big), len(big)),
                spread(o.delay() for o in big),
                fmt_share(sum(o.detected_at() is not None for o in small), len(small)),
                fmt_share(sum(o.first_drop is not None for o in big), len(big)),
                sum(len(o.false()) for o in group),
                f"{sum(o.sim_s for o in group) / len(group):.2f}",
            ],
        )
    table(
        "slowdown by job size",
        [
            "ranks",
            "cases",
            "detected s>=10%",
            "delay med / max",
            "detected s<10%",
            "drop seen s>=10%",
            "false attr",
            "s/case",
        ],
        rows,
    )


def fault_table(outcomes: Sequence[Outcome]) -> None:
    """Faults with no impact: nobody should be named; which incidents fired anyway."""
    rows = []
    for index, group in grouped(outcomes, "fault_no_impact", lambda c: FAULTS.index(c.fault)):
        fault = FAULTS[int(index)]
        fired = Counter(
            key.partition("@")[0]
            for o in group
            for key, firings in o.paged.items()
            if any(at >= ONSET for at in firings)
        )
        rows.append(
            [
                fault,
                len(group),
                sum(len(o.false()) for o in group),
                sum(o.first_straggler is not None for o in group),
                sum(o.first_drop is not None for o in group),
                ", ".join(f"{r} x{n}" for r, n in sorted(fired.items())) or "none",
            ],
        )
    table(
        "fault_no_impact: a hardware fault on a GPU whose rank keeps pace (no node to blame)",
        ["fault", "cases", "false attr", "straggler seen", "drop seen", "incidents fired"],
        rows,
    )


def drop_table(outcomes: Sequence[Outcome], family: str, title: str) -> None:
    """Workload and fabric: the drop, its cause, and nobody named."""
    key: Callable[[Case], float] = (
        (lambda c: c.size) if family == "workload" else (lambda c: c.comm_factor)
    )
    rows = []
    for value, group in grouped(outcomes, family, key):
        detected = [o for o in group if o.first_drop is not None]
        causes = Counter(c for o in detected for c in o.causes)
        label = f"{value:.0%}" if family == "workload" else f"x{value:g}"
        row: list[object] = [
            label,
            len(group),
            fmt_share(len(detected), len(group)),
            spread(o.delay() for o in group),
            fmt_share(sum(o.cause_ok() for o in detected), len(detected)),
            ", ".join(f"{c or '(empty)'}" for c in sorted(causes)) or "-",
            sum(len(o.false()) for o in group),
        ]
        if family == "fabric":
            row.append(fmt_share(sum(o.first_fabric is not None for o in group), len(group)))
        rows.append(row)
    header = [
        "s" if family == "workload" else "comm",
        "cases",
        "drop detected",
        "delay med / max",
        f"cause {EXPECTED_CAUSE[family]!r}",
        "causes given",
        "false attr",
    ]
    if family == "fabric":
        header.append("job.fabric")
    table(title, header, rows)


def paging_table(outcomes: Sequence[Outcome]) -> None:
    """Steps from the onset until the paging incidents fire (policy, not detection)."""
    rows = []
    for family in FAMILIES:
        group = [o for o in outcomes if o.case.family == family]
        rows.append(
            [
                family,
                len(group),
                spread(o.page_delay("gpu_straggler", slowed_gpus(o)) for o in group)
                if family == "slowdown"
                else "-",
                sum(len(set(o.stray_pages())) for o in group),
                spread(o.page_delay("job_throughput_drop") for o in group),
                sum(bool(o.drop_page) for o in group),
                sum(BLAMING in o.drop_page for o in group),
                spread(o.page_delay("job_fabric_degraded") for o in group),
                sum(o.baseline_pages() for o in group),
            ],
        )
    table(
        "paging (for information): steps from the onset to the first firing, median / max "
        "(gpu_straggler and job_fabric_degraded have for: 1m); job_throughput_drop pages and "
        "how many name suspects in their evidence; firings of these rules before the onset",
        [
            "family",
            "cases",
            "gpu_straggler on slowed GPU",
            "gpu_straggler elsewhere",
            "job_throughput_drop",
            "drop pages",
            "naming suspects",
            "job_fabric_degraded",
            "pages in baseline",
        ],
        rows,
    )


def slowed_gpus(outcome: Outcome) -> set[str]:
    """Target keys of the slowed ranks' GPUs."""
    return {gpu_key(node, rank % RANKS_PER_NODE) for rank, node in outcome.slowed.items()}


def _detection_problem(o: Outcome) -> str | None:
    """A missed or late detection against the targets (None: none, or not a target case)."""
    case = o.case
    if case.family == "slowdown" and case.size >= RECALL_MIN_SLOWDOWN:
        if o.detected_at() is None:
            named = sorted(o.straggler_at)
            return f"slowed {sorted(o.slowed_nodes)} not all named (named {named})"
        late = f"named after {o.delay()} steps"
    elif case.family in EXPECTED_CAUSE:
        if o.first_drop is None:
            return "drop not detected"
        if not o.cause_ok():
            return f"drop_cause {dict(o.causes)} (at detection {o.cause_at_detection!r})"
        late = f"drop after {o.delay()} steps"
    else:
        return None
    return late if (o.delay() or 0) > DELAY_TARGET_STEPS else None


def problems(o: Outcome) -> list[str]:
    """What the correlator got wrong in one case, against the targets."""
    out = []
    if o.false():
        out.append(f"false attribution {sorted(o.false())}")
    if (detection := _detection_problem(o)) is not None:
        out.append(detection)
    if BLAMING in o.drop_page and o.case.family != "slowdown":
        out.append(f"drop page blames: {o.drop_page.partition(BLAMING)[2].strip()[:120]}")
    if o.drop_before:
        out.append("false drop during the baseline")
    return out


def misses(outcomes: Sequence[Outcome]) -> list[str]:
    """Every case the correlator got wrong against the targets, one line each."""
    return [
        f"{o.case.label}{o.where()}: {'; '.join(found)}" for o in outcomes if (found := problems(o))
    ]


def figures(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The headline figures of the JSON line (its first keys, in the contract's order)."""
    recall_cases = [
        o for o in outcomes if o.case.family == "slowdown" and o.case.size >= RECALL_MIN_SLOWDOWN
    ]
    small_cases = [
        o for o in outcomes if o.case.family == "slowdown" and o.case.size >= FAIL_SLOW_MIN_SLOWDOWN
    ]
    correct = sum(len(o.correct()) for o in outcomes)
    false = sum(len(o.false()) for o in outcomes)
    delays = [
        d
        for o in outcomes
        if (o.case.family == "slowdown" and o.case.size >= RECALL_MIN_SLOWDOWN)
        or o.case.family in EXPECTED_CAUSE
        if (d := o.delay()) is not None
    ]
    return {
        "cases": len(outcomes),
        "recall_slowdown_ge_10pct": share(
            sum(o.detected_at() is not None for o in recall_cases), len(recall_cases)
        ),
        "recall_slowdown_ge_5pct": share(
            sum(o.detected_at() is not None for o in small_cases), len(small_cases)
        ),
        "precision": share(correct, correct + false),
        "false_attributions": false,
        "max_detection_delay_steps": max(delays) if delays else None,
    }


def details(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Per-family figures for the JSON line, after the headline ones."""
    out: dict[str, Any] = {}
    slow = [o for o in outcomes if o.case.family == "slowdown"]
    out["slowdown_detection_by_size"] = {
        f"{s:g}": share(
            sum(o.detected_at() is not None for o in slow if o.case.size == s),
            sum(o.case.size == s for o in slow),
        )
        for s in SLOWDOWNS
        if any(o.case.size == s for o in slow)
    }
    big = [o for o in slow if o.case.size >= RECALL_MIN_SLOWDOWN]
    delays = [d for o in big if (d := o.delay()) is not None]
    out["slowdown_delay_median_steps"] = statistics.median(delays) if delays else None
    out["slowdown_delay_max_steps"] = max(delays) if delays else None
    for family, expected in EXPECTED_CAUSE.items():
        group = [o for o in outcomes if o.case.family == family]
        detected = [o for o in group if o.first_drop is not None]
        fam_delays = [d for o in detected if (d := o.delay()) is not None]
        out[f"{family}_drop_detection"] = share(len(detected), len(group))
        out[f"{family}_drop_cause_{expected}"] = share(
            sum(o.cause_ok() for o in detected), len(detected)
        )
        out[f"{family}_drop_delay_max_steps"] = max(fam_delays) if fam_delays else None
    out["false_attributions_by_family"] = {
        family: sum(len(o.false()) for o in outcomes if o.case.family == family)
        for family in FAMILIES
    }
    out["baseline_cases_with_drop"] = sum(o.drop_before for o in outcomes)
    out["baseline_cases_with_attribution"] = sum(bool(o.before) for o in outcomes)
    out["baseline_pages"] = sum(o.baseline_pages() for o in outcomes)
    for family in EXPECTED_CAUSE:
        out[f"{family}_drop_pages_naming_suspects"] = sum(
            BLAMING in o.drop_page for o in outcomes if o.case.family == family
        )
    pages = [d for o in big if (d := o.page_delay("gpu_straggler", slowed_gpus(o))) is not None]
    out["gpu_straggler_page_median_steps"] = statistics.median(pages) if pages else None
    return out


def targets_met(head: dict[str, Any], outcomes: Sequence[Outcome]) -> dict[str, bool]:
    """Each target of the brief: met or not."""
    no_blame = sum(len(o.false()) for o in outcomes if o.case.family in EXPECTED_CAUSE)
    recall = head["recall_slowdown_ge_10pct"]
    delay = head["max_detection_delay_steps"]
    return {
        "recall_ge_0.95": recall is not None and recall >= RECALL_TARGET,
        "no_false_attribution_workload_fabric": no_blame == 0,
        "detection_within_30_steps": delay is not None and delay <= DELAY_TARGET_STEPS,
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Run every case, print the tables, then the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--quick", action="store_true", help="fewer cases, for a smoke run")
    args = parser.parse_args(argv)
    configure_logging("warning", "console")  # the collector's info logs would drown the tables

    began = time.monotonic()
    cpu_began = time.process_time()
    rules, catalog = load_rules([], builtin=True), load_catalog()
    cases = plan(quick=args.quick)
    print(
        f"correlation: {len(cases)} cases, seed {args.seed}; {BASELINE_STEPS} steps of baseline, "
        f"onset at step {ONSET}, {AFTER_STEPS} steps after",
        flush=True,
    )
    outcomes = []
    for n, case in enumerate(cases, 1):
        outcomes.append(Simulation(case, args.seed, rules, catalog).run())
        if n % 25 == 0 or n == len(cases):
            print(f"  {n}/{len(cases)} cases, {time.monotonic() - began:.0f} s", file=sys.stderr)

    slowdown_tables(outcomes)
    fault_table(outcomes)
    drop_table(outcomes, "workload", "workload: every rank slowed alike by s (no node to blame)")
    drop_table(
        outcomes,
        "fabric",
        "fabric: comm time x factor, IB xmit wait 250000/s on 30% of the nodes (no node to blame)",
    )
    paging_table(outcomes)
    wrong = misses(outcomes)
    print(f"\ncases the correlator got wrong ({len(wrong)}):")
    for line in wrong:
        print(f"  {line}")

    result = figures(outcomes)
    result["targets_met"] = targets_met(result, outcomes)
    result.update(details(outcomes))
    result["wrong_cases"] = wrong
    result["seed"] = args.seed
    result["quick"] = args.quick
    result["steps_per_case"] = STEPS
    result["onset_step"] = ONSET
    result["cpu_count"] = os.cpu_count()
    result["python"] = sys.version.split()[0]
    result["cpu_s"] = round(time.process_time() - cpu_began, 1)
    result["wall_s"] = round(time.monotonic() - began, 1)
    print(
        f"\ncorrelation: recall(s>=10%) {result['recall_slowdown_ge_10pct']}, recall(s>=5%) "
        f"{result['recall_slowdown_ge_5pct']}, precision "
        f"{result['precision']}, {result['false_attributions']} false attributions, max delay "
        f"{result['max_detection_delay_steps']} steps; {result['wall_s']} s"
    )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
