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
from collector.incidents.rule_reads import reads_named_signals, rule_words
from collector.model.fleet import FleetModel
from collector.testing import CapturingEvaluator, random_node, signal_words
from fleetwatch.testing import FakeClock
from rules.loader import load_rules, parse_rules
from rules.xid_catalog import load_catalog

if TYPE_CHECKING:
    from collector.incidents.evaluator import Evaluator

VALUES = (0, 1, 2, 3, 5, 40, 80, 90, 95, 400, 10**6, 0.5, 99.5)


@pytest.mark.parametrize("seed", range(6))
def test_every_builtin_rule_decides_the_same_on_the_cut(seed: int):
    rng = random.Random(seed)  # noqa: S311 - made-up values, not secrets
    rules = load_rules(builtin=True)
    clock = FakeClock()
    fleet = FleetModel()
    ev = CapturingEvaluator(rules=rules, fleet=fleet, catalog=load_catalog(), clock=clock)
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
