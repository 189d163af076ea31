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

from collector.incidents.cel_data import WindowContext
from collector.incidents.condition_memo import MEMO_LIMIT, ConditionMemo, memo_plan
from collector.incidents.evaluator import Evaluator
from collector.model.fleet import FleetModel
from collector.testing import CapturingEvaluator, random_node, signal_words
from fleetwatch.model import EventKind, Target, sample_to_pb
from fleetwatch.testing import FakeClock, made_up_hello
from rules.loader import load_rules, parse_rules
from rules.xid_catalog import load_catalog

EVENTS = (
    (EventKind.XID, 119),
    (EventKind.XID, 13),
    (EventKind.XID, 79),
    (EventKind.GPU_LOST, 0),
    (EventKind.SXID, 0),
    (EventKind.MACHINE_CHECK, 0),
    (EventKind.IB_DEVICE_REMOVED, 0),
)
VALUES = (0, 1, 2, 3, 5, 40, 80, 89, 90, 95, 400, 10**6, 0.5, 1.0, 89.0, 99.5)


@pytest.mark.parametrize(
    "condition",
    [
        'events(node.name, "1h") > 0',  # a window asked by a computed argument
        'share_of_ports("ib_port_xmit_wait_per_second", 100000.0) >= 0.25',
        'xids("10m").exists(x, gpu.signals.exists(k, k == x.class))',
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


class Windows:
    """A target's windows, as the evaluator's context gives them to CEL."""

    def __init__(
        self, events: int = 0, xids: list[dict[str, Any]] | None = None, rises: int = 0
    ) -> None:
        self._events = events
        self._xids = xids or []
        self._rises = rises
        self.asked: list[tuple[str, str, float]] = []

    def events(self, kind: str, window_s: float) -> int:
        self.asked.append(("events", kind, window_s))
        return self._events

    def xids(self, window_s: float) -> list[dict[str, Any]]:
        self.asked.append(("xids", "", window_s))
        return self._xids

    def increase(self, signal: str, window_s: float) -> float:
        self.asked.append(("increase", signal, window_s))
        return 0.0

    def rises(self, signal: str, window_s: float) -> int:
        self.asked.append(("rises", signal, window_s))
        return self._rises

    def share_of_ports(self, signal: str, above: float) -> float:
        raise AssertionError((signal, above, "never in a key"))


def test_windows_asked_by_literal_arguments_are_part_of_the_key():
    memo = ConditionMemo(
        {
            "sxid": 'events("sxid", "1h") > 0',
            "reset": 'xids("10m").exists(x, x.action == "RESET_GPU")',
            "crc": 'rate("nvlink_crc_errors", "5m") > 100.0',
        }
    )
    assert all(memo.pure(rule) for rule in ("sxid", "reset", "crc"))
    quiet, busy = Windows(), Windows(events=2)
    assert memo.key("sxid", {}, quiet) != memo.key("sxid", {}, busy)
    assert memo.key("sxid", {}, Windows()) == memo.key("sxid", {}, quiet)
    assert quiet.asked == [("events", "sxid", 3600.0)] * 2
    reset = [{"xid": 119, "class": "gsp", "action": "RESET_GPU", "fatal": False}]
    assert memo.key("reset", {}, Windows()) != memo.key("reset", {}, Windows(xids=reset))
    crc = Windows()
    assert memo.key("crc", {}, crc) is not None
    assert crc.asked == [("increase", "nvlink_crc_errors", 300.0)]
    assert memo.key("sxid", {}) is None  # no context: no key


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
    """Random values (ints, floats, absences) of every signal the rules name, counters that
    step and random events, on many targets: evaluations whose keys agree get the same answer
    from CEL itself."""
    rng = random.Random(seed)  # noqa: S311 - made-up values, not secrets
    rules = load_rules(builtin=True)
    clock = FakeClock()
    fleet = FleetModel()
    ev = CapturingEvaluator(rules=rules, fleet=fleet, catalog=load_catalog(), clock=clock)
    fleet.observer = ev
    words = signal_words(list(rules.rules))
    for n in range(6):
        name = f"n{n}"
        targets = random_node(fleet, name, rng, words, VALUES, present=0.5, clock=clock)
        for _ in range(rng.randrange(4)):  # and some nodes have events in their windows
            kind, xid = rng.choice(EVENTS)
            ev.note_event(name, kind, rng.choice(targets[:3]), xid)
    ev.tick()  # the first tick evaluates every node whole
    memo = ConditionMemo({r.name: r.when for r in rules.rules})
    answers: dict[tuple[str, Any], tuple[bool, bool]] = {}
    compared = 0
    for rule, key, data in ev.seen:
        context = WindowContext(ev, key, clock.monotonic())
        seen = memo.key(rule.name, data, context)
        if seen is None:
            continue
        holds, error = ev.env.evaluate(ev._compiled[rule.name], data, context)
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


def test_rises_is_a_window_of_its_own_in_the_key():
    """rises() is asked as itself, not as increase() (which rate() is): the same growth in
    one step or in two is a different count, so a different key."""
    memo = ConditionMemo({"dbe": 'rises("ecc_dbe_aggregate_total", "24h") >= 2'})
    assert memo.pure("dbe")
    once, twice = Windows(rises=1), Windows(rises=2)
    assert memo.key("dbe", {}, once) != memo.key("dbe", {}, twice)
    assert once.asked == [("rises", "ecc_dbe_aggregate_total", 86400.0)]
    assert not ConditionMemo({"r": 'rises(gpu.uuid, "24h") >= 2'}).pure("r")  # computed


def test_a_counter_that_rose_twice_is_not_answered_as_one_that_stepped_once():
    """Two GPUs whose DBE counters grew by 2, one in a single step and one in two: the
    evaluator remembers the first's answer (no) and must not hand it to the second (yes)."""
    text = """\
version: 1
rules:
  - name: dbe_twice
    scope: gpu
    when: 'rises("ecc_dbe_aggregate_total", "24h") >= 2'
    severity: critical
"""
    clock = FakeClock()
    fleet = FleetModel()
    ev = Evaluator(
        rules=parse_rules(text, "t.yaml"), fleet=fleet, catalog=load_catalog(), clock=clock
    )
    fleet.observer = ev
    fleet.on_hello(made_up_hello("n0", gpus=2), 0.0, 0.0)
    one_step, two_steps = list(fleet.view()["n0"].gpus)

    def counters(values: dict[str, float]) -> None:
        fleet.apply_samples(
            "n0",
            [
                sample_to_pb(Target.gpu(u), "ecc_dbe_aggregate_total", value)
                for u, value in values.items()
            ],
        )
        clock.advance(1.0)
        ev.tick()

    counters({one_step: 0.0, two_steps: 0.0})
    counters({one_step: 2.0, two_steps: 1.0})
    counters({one_step: 2.0, two_steps: 2.0})
    assert ev.memo.hits + ev.memo.misses > 0  # the rule's answers were remembered
    fired = {i.target for i in ev.engine.open_incidents()}
    assert fired == {f"n0/gpu/{fleet.view()['n0'].gpus[two_steps].index}"}
