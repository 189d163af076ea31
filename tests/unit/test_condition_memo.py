"""A remembered answer is the answer CEL would give: same named values, same answer.

The evaluator keeps the answers of conditions that read nothing but the fields they name
(:mod:`collector.incidents.condition_memo`), keyed by those fields' values and types. Two
evaluations with the same key must get the same answer from CEL, whatever else their maps hold;
conditions that may read more (windows, macros, indexes, `in`, whole maps) are never kept.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from collector.incidents.condition_memo import MEMO_LIMIT, ConditionMemo, memo_plan
from collector.incidents.evaluator import Evaluator, _Context
from collector.model.fleet import FleetModel
from fleetwatch.model import Target, sample_to_pb
from fleetwatch.testing import FakeClock, made_up_hello
from rules.loader import load_rules, parse_rules
from rules.xid_catalog import load_catalog
from tests.unit.test_cel_view import Capturing, signal_words

VALUES = (0, 1, 2, 3, 5, 40, 80, 89, 90, 95, 400, 10**6, 0.5, 1.0, 89.0, 99.5)


@pytest.mark.parametrize(
    "condition",
    [
        'events("sxid", "1h") > 0',
        'xids("10m").exists(x, x.action == "RESET_GPU")',
        'rate("nvlink_crc_errors", "5m") > 100.0',
        "size(gpu.signals) > 3",
        "gpu.signals.exists(k, k == 'x')",
        'gpu.signals["temperature_" + "celsius"] > 90',
        "gpu[node.name] == 1",
        "'temperature_celsius' in gpu.signals",
        "rank == {}",
        "gpu.signals == node.signals",
        "node != gpu",
        "cel.bind(s, gpu.signals, s.temperature_celsius > 90)",
    ],
)
def test_a_condition_that_may_read_more_than_it_names_is_never_kept(condition):
    assert memo_plan(condition) is None
    assert not ConditionMemo({"r": condition}).pure("r")


def test_a_condition_of_named_fields_is_kept_with_what_it_reads():
    condition = (
        "has(node.signals.bmc_fans_failed) && node.signals.bmc_fans_failed > 0"
        " && gpu.present && gpu.signals.temperature_celsius >= 80"
    )
    plan = memo_plan(condition)
    assert plan is not None
    by_variable = {variable: (fields, signals) for variable, fields, signals in plan}
    assert set(by_variable) == {"node", "gpu"}
    assert by_variable["gpu"][0] == ("present",)
    assert by_variable["gpu"][1] == ("bmc_fans_failed", "temperature_celsius")


def test_the_key_tells_types_and_absence_apart():
    memo = ConditionMemo({"hot": "gpu.signals.temperature_celsius == 1"})
    keys = [
        memo.key("hot", {"gpu": {"signals": {"temperature_celsius": value}}})
        for value in (1, 1.0, True)
    ]
    keys.append(memo.key("hot", {"gpu": {"signals": {}}}))
    keys.append(memo.key("hot", {"gpu": {}}))
    keys.append(memo.key("hot", {}))
    assert None not in keys
    assert len(set(keys)) == len(keys)
    # the fields it does not name are not in the key
    assert memo.key("hot", {"gpu": {"index": 3, "signals": {"temperature_celsius": 1}}}) == keys[0]
    # a value that cannot be part of a key: no memo, CEL answers
    assert memo.key("hot", {"gpu": {"signals": {"temperature_celsius": [1]}}}) is None


def test_answers_start_over_at_the_limit():
    memo = ConditionMemo({"hot": "gpu.signals.temperature_celsius > 90"})
    for t in range(MEMO_LIMIT + 1):
        key = memo.key("hot", {"gpu": {"signals": {"temperature_celsius": t}}})
        assert key is not None
        memo.put("hot", key, (t > 90, None))
    first = memo.key("hot", {"gpu": {"signals": {"temperature_celsius": 0}}})
    assert first is not None
    assert memo.get("hot", first) is None
    assert len(memo._answers["hot"]) == 1


@pytest.mark.parametrize("seed", range(4))
def test_every_builtin_rule_answers_alike_for_alike_keys(seed: int):
    """Random values (ints, floats, absences) of every signal the rules name, on many
    targets: evaluations whose keys agree get the same answer from CEL itself."""
    rng = random.Random(seed)  # noqa: S311 - made-up values, not secrets
    rules = load_rules(builtin=True)
    clock = FakeClock()
    fleet = FleetModel()
    ev = Capturing(rules=rules, fleet=fleet, catalog=load_catalog(), clock=clock)
    fleet.observer = ev
    words = signal_words(list(rules.rules))
    for n in range(6):
        name = f"n{n}"
        fleet.on_hello(made_up_hello(name, gpus=2, nvlinks=2, ib_ports=2), 0.0, 0.0)
        node = fleet.view()[name]
        targets = [Target.node()]
        targets += [Target.gpu(u) for u in node.gpus]
        targets += [Target.ib_port(p.device, p.port) for p in node.ports.values()]
        samples = [
            sample_to_pb(target, word, rng.choice(VALUES))
            for target in targets
            for word in words
            if rng.random() < 0.5  # the others absent
        ]
        fleet.apply_samples(name, samples)
    ev.tick()  # the first tick evaluates every node whole
    memo = ConditionMemo({r.name: r.when for r in rules.rules})
    answers: dict[tuple[str, Any], tuple[bool, bool]] = {}
    compared = 0
    for rule, key, data in ev.seen:
        seen = memo.key(rule.name, data)
        if seen is None:
            continue
        holds, error = ev.env.evaluate(
            ev._compiled[rule.name], data, _Context(ev, key, clock.monotonic())
        )
        answer = (holds, error is None)
        earlier = answers.setdefault((rule.name, seen), answer)
        compared += earlier is not answer
        assert earlier == answer, (rule.name, key, seen)
    assert compared > 50  # many evaluations shared a key with an earlier one


def test_the_evaluator_answers_from_memory_and_still_sees_the_change():
    text = """\
version: 1
rules:
  - name: hot
    scope: gpu
    when: 'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius >= 90'
    severity: warning
"""
    clock = FakeClock()
    fleet = FleetModel()
    ev = Evaluator(
        rules=parse_rules(text, "t.yaml"), fleet=fleet, catalog=load_catalog(), clock=clock
    )
    fleet.observer = ev
    fleet.on_hello(made_up_hello("n0", gpus=4), 0.0, 0.0)
    uuids = list(fleet.view()["n0"].gpus)

    def temperatures(value: float) -> None:
        fleet.apply_samples(
            "n0", [sample_to_pb(Target.gpu(u), "temperature_celsius", value) for u in uuids]
        )
        clock.advance(1.0)
        ev.tick()

    temperatures(60)
    temperatures(61)
    temperatures(60)
    assert ev.memo.hits >= len(uuids)  # the same values on other GPUs, and again later
    assert not list(ev.engine.open_incidents())
    temperatures(95)
    fired = {i.target for i in ev.engine.open_incidents()}
    assert len(fired) == len(uuids)
