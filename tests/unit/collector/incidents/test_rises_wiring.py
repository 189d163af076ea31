"""``rises(signal, window)`` is wired wherever ``increase()`` is: checked at load time, its
signal's samples kept for its window, and answered from the rules' history."""

import pytest

from collector.incidents.cel_data import StillContext
from collector.incidents.evaluator import Evaluator
from collector.incidents.rule_reads import reads_windows_only, sample_windows
from collector.model.fleet import FleetModel
from fleetwatch.model import Target, sample_to_pb
from fleetwatch.testing import FakeClock, made_up_hello
from rules.exceptions import RulesError
from rules.loader import parse_rules
from rules.xid_catalog import load_catalog

RULE = """\
version: 1
rules:
  - name: r
    scope: gpu
    when: '{when}'
    severity: critical
"""


def rules(when: str):
    return parse_rules(RULE.format(when=when), "t.yaml")


class TestChecked:
    @pytest.mark.parametrize(
        ("when", "problem"),
        [
            ('rises("ecc_dbe_aggregate_total", "24h") >= 2.0', "(int, double)"),
            ('rises("ecc_dbe_aggregate_total", "2x") >= 2', "'2x' is not a duration"),
            ('rises("ecc_dbe_aggregate_totl", "24h") >= 2', "unknown signal"),
            ('rises("ecc_dbe_aggregate_total", "24h")', "gives a number"),
        ],
    )
    def test_a_wrong_call_is_refused_at_load_time(self, when, problem):
        """It gives an int, takes a duration and a signal the scope knows, as increase() does."""
        with pytest.raises(RulesError, match=problem):
            rules(when)


class TestReads:
    def test_its_signal_is_kept_for_the_longest_window_asked(self):
        """The history keeps the samples a rises() window reads, beside increase()'s."""
        when = (
            'rises("ecc_dbe_aggregate_total", "24h") >= 2 || rate("pcie_replay_count", "5m") > 1.0'
        )
        kept = sample_windows(rules(when))
        assert kept == {"ecc_dbe_aggregate_total": 86400.0, "pcie_replay_count": 300.0}

    def test_a_condition_of_rises_alone_reads_only_windows(self):
        """Such a rule does not hold on a target whose windows are still (StillContext: 0)."""
        (rule,) = rules('rises("ecc_dbe_aggregate_total", "24h") >= 2').rules
        assert reads_windows_only(rule)
        assert StillContext().rises("ecc_dbe_aggregate_total", 86400.0) == 0


class TestEvaluated:
    def test_two_rises_fire_and_one_big_step_does_not(self):
        """On the evaluator's own history: GPU 0 steps 0 -> 2 once, GPU 1 steps 0 -> 1 -> 2."""
        clock = FakeClock()
        fleet = FleetModel()
        ev = Evaluator(
            rules=rules('rises("ecc_dbe_aggregate_total", "24h") >= 2'),
            fleet=fleet,
            catalog=load_catalog(),
            clock=clock,
        )
        fleet.observer = ev
        fleet.on_hello(made_up_hello("n0", gpus=2), 0.0, 0.0)
        gpus = fleet.view()["n0"].gpus
        by_index = {g.index: uuid for uuid, g in gpus.items()}
        for values in ((0.0, 0.0), (2.0, 1.0), (2.0, 2.0)):
            fleet.apply_samples(
                "n0",
                [
                    sample_to_pb(Target.gpu(by_index[i]), "ecc_dbe_aggregate_total", v)
                    for i, v in enumerate(values)
                ],
            )
            clock.advance(1.0)
            ev.tick()
        assert [i.target for i in ev.engine.open_incidents()] == ["n0/gpu/1"]
