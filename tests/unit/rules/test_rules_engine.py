from rules.engine import Engine, Phase
from rules.model import ActionSpec, Escalation, Rule, RuleSet, Scope

DRAIN = ActionSpec("drain_node")
RESET = ActionSpec("reset_gpu")


def engine(**overrides: object) -> Engine:
    values: dict[str, object] = {
        "name": "r",
        "scope": Scope.GPU,
        "when": "true",
        "actions": (RESET,),
    }
    values.update(overrides)
    return Engine(RuleSet((Rule(**values),)))  # type: ignore[arg-type]


def phases(engine: Engine, holds: bool, now: float) -> list[Phase]:
    return [t.incident.phase for t in engine.observe("r", "n1", "n1/gpu/0", holds=holds, now=now)]


class TestEngine:
    def test_fires_at_once_without_for(self):
        """With no `for`, a holding condition is pending and firing in the same step."""
        e = engine()
        transitions = e.observe("r", "n1", "n1/gpu/0", holds=True, now=10.0, evidence="Xid 79")
        assert [t.incident.phase for t in transitions] == [Phase.PENDING, Phase.FIRING]
        assert transitions[1].actions == (RESET,)
        assert transitions[1].incident.evidence == "Xid 79"

    def test_for_delays_firing_and_a_blip_is_dropped(self):
        """A condition must hold for `for`; one that clears earlier leaves nothing behind."""
        e = engine(for_s=30.0)
        assert phases(e, True, 0.0) == [Phase.PENDING]
        assert phases(e, True, 29.0) == []
        assert phases(e, False, 29.5) == [Phase.DROPPED]
        assert e.open_incidents() == []
        assert phases(e, True, 40.0) == [Phase.PENDING]
        assert phases(e, True, 70.0) == [Phase.FIRING]

    def test_firing_stays_quiet_while_it_holds(self):
        """Actions are asked for once, when the incident fires, not on every evaluation."""
        e = engine()
        phases(e, True, 0.0)
        assert phases(e, True, 5.0) == []
        assert phases(e, True, 10.0) == []

    def test_keep_firing_for_rides_out_a_flap(self):
        """A condition that clears and comes back within keep_firing_for stays one incident."""
        e = engine(keep_firing_for_s=60.0)
        phases(e, True, 0.0)
        first = e.get("r", "n1/gpu/0")
        assert phases(e, False, 10.0) == []
        assert phases(e, True, 30.0) == []
        assert phases(e, False, 40.0) == []
        assert phases(e, False, 99.0) == []
        assert phases(e, False, 100.0) == [Phase.RESOLVED]
        assert first is not None
        assert e.get("r", "n1/gpu/0") is None

    def test_escalation_replaces_actions_after_repeats(self):
        """Reset first; the third firing within the window drains instead."""
        e = engine(escalation=Escalation(after=3, within_s=3600.0, actions=(DRAIN,)))
        actions = []
        for start in (0.0, 100.0, 200.0):
            transitions = e.observe("r", "n1", "n1/gpu/0", holds=True, now=start)
            actions.append(transitions[-1].actions)
            e.observe("r", "n1", "n1/gpu/0", holds=False, now=start + 1)
        assert actions == [(RESET,), (RESET,), (DRAIN,)]

    def test_escalation_window_forgets_old_firings(self):
        """Firings older than the window do not count towards escalation."""
        e = engine(escalation=Escalation(after=2, within_s=60.0, actions=(DRAIN,)))
        e.observe("r", "n1", "t", holds=True, now=0.0)
        e.observe("r", "n1", "t", holds=False, now=1.0)
        again = e.observe("r", "n1", "t", holds=True, now=500.0)
        assert again[-1].actions == (RESET,)
        assert not again[-1].incident.escalated

    def test_targets_are_independent(self):
        """Each target has its own incident."""
        e = engine()
        e.observe("r", "n1", "n1/gpu/0", holds=True, now=0.0)
        e.observe("r", "n1", "n1/gpu/1", holds=True, now=0.0)
        assert sorted(i.target for i in e.open_incidents()) == ["n1/gpu/0", "n1/gpu/1"]

    def test_restore_keeps_a_firing_incident_quiet(self):
        """An incident taken back from the journal does not fire (and act) a second time."""
        e = engine()
        fired = e.observe("r", "n1", "t", holds=True, now=0.0)[-1].incident
        again = engine()
        again.restore(fired)
        assert again.observe("r", "n1", "t", holds=True, now=5.0) == []
