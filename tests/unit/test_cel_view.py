"""A condition sees only what it names, and decides exactly as it would on the whole data.

The evaluator hands CEL a cut of a target's data (the variables a condition names, each signals
map cut to the names it says): CEL converts everything it is given, and the whole maps were half
of an evaluation. Every built-in rule, on targets with random values (and random absences) of
every signal the rules name, must give the same answer on the cut as on the whole.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import pytest

from collector.incidents.cel_data import WindowContext, cel_view
from collector.incidents.evaluator import Evaluator
from collector.incidents.rule_reads import reads_named_signals, rule_words
from collector.model.fleet import FleetModel
from fleetwatch.model import Target, sample_to_pb
from fleetwatch.testing import FakeClock, made_up_hello
from rules.loader import load_rules, parse_rules
from rules.xid_catalog import load_catalog

if TYPE_CHECKING:
    from collector.incidents.verdict import Outcome
    from rules.model import Rule

VALUES = (0, 1, 2, 3, 5, 40, 80, 90, 95, 400, 10**6, 0.5, 99.5)


class Capturing(Evaluator):
    """Keeps every (rule, data) it evaluates, for the test to evaluate again."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[Rule, str, dict[str, Any]]] = []

    def _evaluate(
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
    return sorted({w for r in rules for w in rule_words(r) if "_" in w and w.islower()})


def random_node(
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


@pytest.mark.parametrize("seed", range(6))
def test_every_builtin_rule_decides_the_same_on_the_cut(seed: int):
    rng = random.Random(seed)  # noqa: S311 - made-up values, not secrets
    rules = load_rules(builtin=True)
    clock = FakeClock()
    fleet = FleetModel()
    ev = Capturing(rules=rules, fleet=fleet, catalog=load_catalog(), clock=clock)
    fleet.observer = ev
    words = signal_words(list(rules.rules))
    for n in range(3):
        random_node(fleet, f"n{n}", rng, words, VALUES, present=0.6, nvlinks=True)
    ev.tick()  # the first tick evaluates every node whole
    assert len(ev.seen) > 150
    env = ev.env
    for rule, key, data in ev.seen:
        expression = ev._compiled[rule.name]
        context = ev_context(ev, key, clock)
        whole = env.evaluate(expression, data, context)
        cut = env.evaluate(
            expression,
            cel_view(data, rule_words(rule), cut_signals=reads_named_signals(rule)),
            context,
        )
        assert cut[0] == whole[0], (rule.name, key)
        assert (cut[1] is None) == (whole[1] is None), (rule.name, key, whole, cut)


def ev_context(ev: Evaluator, key: str, clock: FakeClock) -> Any:
    return WindowContext(ev, key, clock.monotonic())


def test_a_rule_that_walks_or_indexes_a_signals_map_gets_it_whole():
    text = """\
version: 1
rules:
  - name: walks
    scope: gpu
    when: 'size(gpu.signals) > 3'
    severity: warning
  - name: named
    scope: gpu
    when: 'has(gpu.signals.temperature_celsius)'
    severity: warning
"""
    walks, named = parse_rules(text, "t.yaml").rules
    assert not reads_named_signals(walks)
    assert reads_named_signals(named)
    data = {"gpu": {"index": 0, "signals": {"temperature_celsius": 50, "power_watts": 300}}}
    data["node"] = {"signals": {}}
    assert cel_view(data, rule_words(named), cut_signals=True) == {
        "gpu": {"index": 0, "signals": {"temperature_celsius": 50}}
    }
