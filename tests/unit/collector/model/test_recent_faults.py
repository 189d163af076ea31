"""The lemon counts the rules read, kept in memory: remediations, episodes, a person's moves."""

import math

from collector.model.lifecycle import STILL_FIRING
from collector.model.recent_faults import (
    NO_FAULTS,
    RecentFaults,
    counts_note,
    counts_words,
    reads_counts,
)
from collector.store.lifecycle import TransitionRow
from fleetwatch.testing import FakeClock

DAY = 86400.0


def book() -> tuple[RecentFaults, FakeClock, list[str]]:
    clock = FakeClock()
    recent = RecentFaults(clock)
    told: list[str] = []
    recent.changed.append(told.append)
    return recent, clock, told


def move(
    clock: FakeClock, previous: str, state: str, actor: str = "rule:r", reason: str = ""
) -> TransitionRow:
    at = round(clock.now() * 1000)
    return TransitionRow("n1", state, previous, at, actor, reason=reason)


class TestFields:
    def test_a_quiet_node_shares_the_empty_counts(self):
        recent, _, _ = book()
        assert recent.fields("n1") is NO_FAULTS
        assert dict(NO_FAULTS) == {
            "remediations_7d": 0,
            "incidents_7d": 0,
            "seen_by_person": False,
        }

    def test_remediations_that_succeeded_count_and_tell(self):
        """Drains, resets, reboots, RMA tickets and escalations that succeeded; not the rest."""
        recent, _, told = book()
        recent.action("drain_node", "succeeded", "n1")
        recent.action("escalated_reset_gpu", "succeeded", "n1")
        recent.action("drain_node", "skipped", "n1")
        recent.action("drain_node", "shadow", "n1")
        recent.action("notify", "succeeded", "n1")
        recent.action("release_node", "succeeded", "n1")
        assert recent.fields("n1")["remediations_7d"] == 2
        assert told == ["n1", "n1"]

    def test_they_age_out_after_seven_days(self):
        recent, clock, _ = book()
        recent.action("reboot_node", "succeeded", "n1")
        clock.advance(3 * DAY)
        recent.action("rma_ticket", "succeeded", "n1")
        clock.advance(4 * DAY + 1)
        assert recent.fields("n1")["remediations_7d"] == 1
        clock.advance(3 * DAY)
        assert recent.fields("n1")["remediations_7d"] == 0
        recent.prune()
        assert recent.counts() == {}

    def test_episodes_and_not_a_release_s_return_to_suspect(self):
        recent, clock, told = book()
        recent.moved(move(clock, "in_service", "suspect"))
        recent.moved(move(clock, "suspect", "drained", "action:drain_node"))  # not an episode
        recent.moved(move(clock, "drained", "in_service", "person:ana"))
        recent.moved(move(clock, "in_service", "suspect", reason=STILL_FIRING))
        recent.moved(move(clock, "suspect", "in_service"))
        recent.moved(move(clock, "in_service", "drained", "action:drain_node"))
        assert recent.fields("n1")["incidents_7d"] == 2
        assert recent.counts() == {"n1": (0, 2)}
        assert told == ["n1", "n1", "n1"]  # the episodes and the person's move

    def test_seen_by_person_until_something_new_happens(self):
        """A person's move after the newest remediation and episode; the next one ends it."""
        recent, clock, _ = book()
        recent.action("drain_node", "succeeded", "n1")
        assert recent.fields("n1")["seen_by_person"] is False
        clock.advance(60)
        recent.moved(move(clock, "drained", "in_service", "person:ana"))
        assert recent.fields("n1")["seen_by_person"] is True
        clock.advance(60)
        recent.moved(move(clock, "in_service", "suspect"))
        assert recent.fields("n1")["seen_by_person"] is False
        clock.advance(60)
        recent.moved(move(clock, "suspect", "in_repair", "person:bo"))
        assert recent.fields("n1")["seen_by_person"] is True
        clock.advance(60)
        recent.action("reset_gpu", "succeeded", "n1")
        assert recent.fields("n1") == {
            "remediations_7d": 2,
            "incidents_7d": 1,
            "seen_by_person": False,
        }


class TestLoad:
    def test_the_journal_taken_back_observes_nothing(self):
        """At start: the counts come back, the histograms stay empty (Prometheus saw those)."""
        recent, clock, told = book()
        now = round(clock.now() * 1000)
        old = now - round(8 * DAY * 1000)
        rows = [
            TransitionRow("n1", "drained", "in_service", old, "action:drain_node"),
            TransitionRow("n1", "in_service", "drained", old + 1000, "person:ana"),
            TransitionRow("n1", "suspect", "in_service", now - 5000, "rule:r"),
            TransitionRow("n1", "drained", "suspect", now - 4000, "action:drain_node"),
        ]
        actions = [("n1", "drain_node", now - 4000), ("n1", "drain_node", old), ("n2", "x", now)]
        recent.load(rows, actions, left={"n3": now - 1000})
        assert recent.fields("n1") == {
            "remediations_7d": 1,
            "incidents_7d": 1,  # the 8-day-old one is out of the window
            "seen_by_person": False,
        }
        assert (recent.repairs.count, recent.between.count, told) == (0, 0, [])
        # n3 was out when the window began: its return is a repair of known length
        back = TransitionRow("n3", "in_service", "rma", now + 9000, "person:ana")
        recent.moved(back)
        assert recent.repairs.count == 1
        assert recent.repairs.total == 10.0

    def test_live_moves_observe_the_histograms(self):
        """A repair that ends is timed from its leaving; an episode from the one before."""
        recent, clock, _ = book()
        recent.moved(move(clock, "in_service", "suspect"))
        clock.advance(100)
        recent.moved(move(clock, "suspect", "drained", "action:drain_node"))
        clock.advance(3600)
        recent.moved(move(clock, "drained", "in_service", "person:ana"))
        clock.advance(7200)
        recent.moved(move(clock, "in_service", "suspect"))
        assert (recent.repairs.count, recent.repairs.total) == (1, 3600.0)
        assert (recent.between.count, recent.between.total) == (1, 10900.0)
        assert dict(recent.between.cumulative())[math.inf] == 1


class TestWords:
    def test_the_counts_in_words_are_the_only_note_a_reason_takes(self):
        fields = {"remediations_7d": 5, "incidents_7d": 1, "seen_by_person": False}
        words = counts_words(fields)
        assert words == "5 remediations and 1 incident episode in 7 days"
        assert counts_note(words) == words
        assert counts_note("GPU 3 GPU-0a1b") == ""
        assert counts_note(words + "; rm -rf /") == ""

    def test_a_lemon_rule_reads_the_counts(self):
        assert reads_counts("node.remediations_7d >= 5")
        assert reads_counts("node . incidents_7d > 1 && true")
        assert not reads_counts("node.gpus_lost > 0")
        assert not reads_counts("has(node.signals.remediations_7d_x)")
