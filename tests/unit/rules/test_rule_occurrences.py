"""Escalation counts occurrences: a fault that recurs while its incident still fires."""

import pytest

from rules.engine import Engine, Phase
from rules.exceptions import RulesError
from rules.loader import parse_rules
from rules.model import ActionSpec, Escalation, Rule, RuleSet, Scope

DRAIN = ActionSpec("drain_node")
RESET = ActionSpec("reset_gpu")
KEY = "n1/gpu/0"


def engine(*, occurrences: str = "gpu.signals.x", after: int = 2) -> Engine:
    rule = Rule(
        name="r",
        scope=Scope.GPU,
        when="true",
        keep_firing_for_s=3600.0,
        actions=(RESET,),
        escalation=Escalation(after, 7 * 86400.0, (DRAIN,), occurrences),
    )
    return Engine(RuleSet((rule,)))


def observe(e: Engine, now: float, value: float | None, *, holds: bool = True) -> list[str]:
    """What the evaluation gave: phases, with 'recurred' and the actions asked for."""
    out = []
    for t in e.observe("r", "n1", KEY, holds=holds, now=now, occurrences=value):
        word = "recurred" if t.recurred else t.incident.phase.value
        out.append(f"{word}:{','.join(a.name for a in t.actions)}")
    return out


class TestOccurrences:
    def test_growth_while_firing_escalates_the_open_incident(self):
        """The value at the firing is the base; a growth while firing is the second occurrence
        and escalates the same incident, with the escalation's actions."""
        e = engine()
        assert observe(e, 0.0, 2.0) == ["pending:", "firing:reset_gpu"]
        first = e.get("r", KEY)
        assert observe(e, 10.0, 2.0) == []
        assert observe(e, 20.0, 5.0) == ["recurred:drain_node"]
        now = e.get("r", KEY)
        assert first is not None
        assert now is not None
        assert (now.id, now.phase, now.escalated, now.firings) == (first.id, Phase.FIRING, True, 2)
        assert e.recurrences["r"] == 1
        assert observe(e, 30.0, 6.0) == ["recurred:"]  # escalated once; counted still
        assert e.get("r", KEY).firings == 3  # type: ignore[union-attr]

    def test_a_recurrence_below_after_only_counts(self):
        """With after: 3, the first recurrence updates the count and asks for nothing."""
        e = engine(after=3)
        observe(e, 0.0, 1.0)
        assert observe(e, 5.0, 2.0) == ["recurred:"]
        assert observe(e, 6.0, 3.0) == ["recurred:drain_node"]

    def test_a_drop_counts_nothing_and_becomes_the_base(self):
        """A counter reset (or events leaving a window) is no occurrence; growth after it is."""
        e = engine(after=3)
        observe(e, 0.0, 4.0)
        assert observe(e, 5.0, 0.0) == []
        assert observe(e, 6.0, 1.0) == ["recurred:"]

    def test_no_value_counts_nothing(self):
        """An expression that gives no number (a signal not reported) leaves the count alone."""
        e = engine()
        observe(e, 0.0, None)
        assert observe(e, 5.0, 3.0) == []  # the first number is the base
        assert observe(e, 6.0, None) == []
        assert observe(e, 7.0, 4.0) == ["recurred:drain_node"]

    def test_a_recurrence_while_clearing_counts(self):
        """keep_firing_for holds the incident while the condition is false; a recurrence then
        counts too (that is when the old engine lost it)."""
        e = engine()
        observe(e, 0.0, 1.0)
        assert observe(e, 5.0, 1.0, holds=False) == []
        assert observe(e, 6.0, 2.0, holds=False) == ["recurred:drain_node"]

    def test_a_new_incident_starts_a_new_base(self):
        """After the incident resolves, the next firing takes the value then as its base and
        counts as the next occurrence within the window."""
        e = engine(after=3)
        observe(e, 0.0, 1.0)
        assert [p.split(":")[0] for p in observe(e, 10.0, 1.0, holds=False)] == []
        assert observe(e, 4000.0, 1.0, holds=False) == ["resolved:"]
        assert observe(e, 5000.0, 3.0) == ["pending:", "firing:reset_gpu"]
        assert observe(e, 5001.0, 4.0) == ["recurred:drain_node"]


RULE = """\
version: 1
rules:
  - name: dbe
    scope: gpu
    when: 'increase("ecc_dbe_aggregate_total", "24h") > 0.0'
    escalate:
      after: 2
      within: 7d
      occurrences: {occurrences}
      actions: [drain_node]
"""


class TestLoading:
    def test_a_number_loads(self):
        rules = parse_rules(RULE.format(occurrences="'gpu.signals.ecc_dbe_aggregate_total'"), "f")
        (rule,) = rules.rules
        assert rule.escalation is not None
        assert rule.escalation.occurrences == "gpu.signals.ecc_dbe_aggregate_total"

    @pytest.mark.parametrize(
        ("text", "problem"),
        [
            ("'gpu.name'", "unknown field gpu.name"),
            ("'gpu.uuid'", "escalate.occurrences must give a number"),
            ("'gpu.signals.ecc_dbe_agregate_total'", "unknown signal 'ecc_dbe_agregate_total'"),
            ('\'events("gpu_lsot", "1h")\'', "unknown event kind 'gpu_lsot'"),
            ("3", "escalate.occurrences must be a CEL number, not 3"),
            ("'gpu.index +'", "bad escalate.occurrences"),
        ],
    )
    def test_a_bad_one_is_refused_by_name(self, text: str, problem: str):
        with pytest.raises(RulesError) as caught:
            parse_rules(RULE.format(occurrences=text), "f")
        assert problem in str(caught.value)
