"""Fakes for testing the collector's parts: made-up fleets, job worlds and journal rows.

Each stands in for what the agents would send, so a test can drive the real fleet model, job book
and evaluator without a stream (as :mod:`fleetwatch.testing` does for the clock and the Hello).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from collector.incidents.evaluator import Evaluator
from collector.incidents.rule_reads import rule_words
from collector.jobs.book import JobBook
from collector.jobs.config import JobsConfig
from collector.model.fleet import FleetModel
from collector.store.events import EventRow
from fleetwatch.model import SampleValue, Target, sample_to_pb
from fleetwatch.testing import FakeClock, made_up_hello, made_up_uuid
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.loader import load_rules
from rules.xid_catalog import load_catalog

if TYPE_CHECKING:
    import random
    from collections.abc import Callable

    from collector.incidents.verdict import Outcome
    from rules.model import Rule


H100 = "NVIDIA H100 80GB HBM3"
NODES = ("node-a", "node-b", "node-c", "node-d")
PARAMS = 7e9


@dataclass
class JobWorld:
    """A fleet of H100 nodes, an evaluator lending its history, and the job book under test."""

    clock: FakeClock
    fleet: FleetModel
    book: JobBook
    evaluator: Evaluator
    nodes: tuple[str, ...]
    gpus: int

    def place(self, rank: int) -> tuple[str, str]:
        """The node and GPU of ``rank``: ``gpus`` ranks a node, in order."""
        node = self.nodes[rank // self.gpus]
        return node, made_up_uuid(node, rank % self.gpus)

    def gpu_signal(self, node: str, index: int, signal: str, value: SampleValue) -> None:
        """A Report of one GPU sample from ``node``."""
        sample = sample_to_pb(Target.gpu(made_up_uuid(node, index)), signal, value)
        self.fleet.apply_report(node, pb.Report(samples=[sample]))

    def throttle(self, node: str, index: int) -> None:
        """The GPU reports a thermal slowdown, hot."""
        self.gpu_signal(node, index, "clock_event_reasons", 0x40)
        self.gpu_signal(node, index, "temperature_celsius", 91)

    def congest(self, node: str) -> None:
        """The node's IB port reports waiting to send (congestion)."""
        sample = sample_to_pb(Target.ib_port("mlx5_0", 1), "ib_port_xmit_wait_per_second", 500000)
        self.fleet.apply_report(node, pb.Report(samples=[sample]))

    def report(self, rank: int, step: int, *, job: str = "j", **fields: Any) -> None:  # noqa: ANN401 - JobStep fields
        """Rank ``rank`` reports ``step`` (one second, 1,000 tokens, unless ``fields`` say)."""
        node, gpu = self.place(rank)
        values: dict[str, Any] = {
            "job_id": job,
            "rank": rank,
            "step": step,
            "time_unix_ms": int(self.clock.now() * 1000),
            "step_time_s": 1.0,
            "tokens": 1000.0,
            "gpu_uuid": gpu,
            "world_size": self.ranks,
            "params": PARAMS,
        }
        values.update(fields)
        self.book.ingest(node, pb.JobReport(steps=[pb.JobStep(**values)]))

    @property
    def ranks(self) -> int:
        """The world size."""
        return len(self.nodes) * self.gpus

    def run(
        self,
        steps: range,
        *,
        job: str = "j",
        step_time: Callable[[int], float] = lambda _s: 1.0,
        compute: Callable[[int, int], float] = lambda _s, _r: 0.8,
        tokens: float = 1000.0,
        **fields: Any,  # noqa: ANN401 - JobStep fields
    ) -> None:
        """Every rank reports each step; the clock moves on by the step's time after it."""
        for step in steps:
            for rank in range(self.ranks):
                self.report(
                    rank,
                    step,
                    job=job,
                    step_time_s=step_time(step),
                    compute_time_s=compute(step, rank),
                    tokens=tokens,
                    **fields,
                )
            self.clock.advance(step_time(step))

    def job(self, job: str = "j") -> dict[str, Any]:
        """What the job book publishes of ``job``."""
        (found,) = [m for m in self.book.publish() if m["id"] == job]
        return found


def job_world(
    nodes: tuple[str, ...] = NODES, gpus: int = 2, config: JobsConfig | None = None
) -> JobWorld:
    """A job world of ``nodes`` with ``gpus`` GPUs each, on the built-in rules."""
    clock = FakeClock()
    fleet = FleetModel()
    for name in nodes:
        hello = made_up_hello(name, gpus=gpus, ib_ports=1, model=H100)
        fleet.on_hello(hello, clock.monotonic(), clock.now())
    catalog = load_catalog()
    book = JobBook(
        config=config or JobsConfig(), fleet=fleet, clock=clock, xid_class=catalog.class_of
    )
    evaluator = Evaluator(rules=load_rules(), fleet=fleet, catalog=catalog, clock=clock, jobs=book)
    fleet.observer = evaluator
    return JobWorld(clock, fleet, book, evaluator, nodes, gpus)


# Step-time profiles: a rank slower from step 40, every rank slower from step 60.
SLOW_RANK = 5  # on node-c, GPU 1
SLOW_FROM: Final = 40
SLOWER_FROM: Final = 60


def slow_rank(step: int, rank: int) -> float:
    """Compute seconds: ``SLOW_RANK`` takes 1.0 from step 40, the others 0.8."""
    return 1.0 if rank == SLOW_RANK and step >= SLOW_FROM else 0.8


def slower_from_60(step: int) -> float:
    """Step seconds: 1.0, then 1.3 from step 60."""
    return 1.0 if step < SLOWER_FROM else 1.3


def uniform_compute(step: int, _rank: int) -> float:
    """Compute seconds of every rank, slower from step 60 like the steps."""
    return 0.8 * slower_from_60(step)


def event_row(seq: int | None, node: str = "n1", boot: str = "b1", kind: str = "xid") -> EventRow:
    """A journal row of an Xid 79 event on GPU-1 (``seq`` None: raised by the collector)."""
    return EventRow(
        node=node,
        boot_id=boot,
        seq=seq,
        time_ms=1000 + (seq or 0),
        received_ms=2000,
        kind=kind,
        target_kind="gpu",
        gpu_uuid="GPU-1",
        xid=79,
    )


class CapturingEvaluator(Evaluator):
    """Keeps every (rule, data) it evaluates, for the test to evaluate again."""

    def __init__(self, **kwargs: Any) -> None:  # noqa: ANN401 - the Evaluator's arguments
        """An evaluator as ``Evaluator(**kwargs)``, remembering what it evaluates."""
        super().__init__(**kwargs)
        self.seen: list[tuple[Rule, str, dict[str, Any]]] = []

    def _evaluate(  # noqa: PLR0913 - the Evaluator's own signature
        self,
        rule: Rule,
        node: str,
        key: str,
        data: dict[str, Any],
        now: float,
        *,
        waiting: bool = False,
    ) -> list[Outcome]:
        self.seen.append((rule, key, data))
        return super()._evaluate(rule, node, key, data, now, waiting=waiting)


def signal_words(rules: list[Rule]) -> list[str]:
    """The signal names ``rules`` read (lower-case words with an underscore)."""
    return sorted({w for r in rules for w in rule_words(r) if "_" in w and w.islower()})


def random_node(  # noqa: PLR0913 - the shape of a made-up node
    fleet: FleetModel,
    name: str,
    rng: random.Random,
    words: list[str],
    values: tuple[float, ...],
    *,
    present: float,
    nvlinks: bool = False,
    clock: FakeClock | None = None,
) -> list[Target]:
    """A node said Hello and sent two Reports of random values of ``words`` on its targets.

    Twice: counters step, so windows move and every rule is asked (``clock``, when given,
    moves a second after each). Each value is there with probability ``present``. Returns
    the node's targets: the node, its GPUs (their NVLinks when ``nvlinks``) and its IB ports.
    """
    fleet.on_hello(made_up_hello(name, gpus=2, nvlinks=2, ib_ports=2), 0.0, 0.0)
    node = fleet.view()[name]
    targets = [Target.node()]
    targets += [Target.gpu(u) for u in node.gpus]
    if nvlinks:
        targets += [Target.nvlink(u, link) for u in node.gpus for link in range(2)]
    targets += [Target.ib_port(p.device, p.port) for p in node.ports.values()]
    for _ in range(2):
        samples = [
            sample_to_pb(target, word, rng.choice(values))
            for target in targets
            for word in words
            if rng.random() < present  # the others absent
        ]
        fleet.apply_samples(name, samples)
        if clock is not None:
            clock.advance(1.0)
    return targets
