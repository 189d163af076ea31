"""The reliability figures from hand-made lifecycle histories with known answers."""

import math

import pytest

from collector.model.lifecycle import STILL_FIRING
from collector.model.reliability import (
    BUCKETS_S,
    Buckets,
    fleet_figures,
    is_episode,
    node_figures,
    recent_counts,
    remediation_kind,
)
from collector.store.lifecycle import TransitionRow

H = 3600 * 1000  # an hour, in ms
D = 24 * H
START = 1_800_000_000_000  # the window's start (Unix ms)
NOW = START + 30 * D
WINDOW_S = 30 * 86400.0


def move(node: str, previous: str, state: str, at: int, reason: str = "") -> TransitionRow:
    return TransitionRow(node, state, previous, at, "x", reason=reason)


def history_a() -> list[TransitionRow]:
    """Three episodes (days 1, 5, 8) and two repairs (24 h and 12 h): 36 h out of service."""
    return [
        move("a", "in_service", "suspect", START + 1 * D),  # episode 1
        move("a", "suspect", "drained", START + 1 * D + 1 * H),  # leaves service
        move("a", "drained", "in_repair", START + 1 * D + 3 * H),
        move("a", "in_repair", "in_service", START + 2 * D + 1 * H),  # repaired: 24 h
        move("a", "in_service", "suspect", START + 5 * D),  # episode 2: 4 days on
        move("a", "suspect", "in_service", START + 5 * D + H // 2),  # no repair: never out
        move("a", "in_service", "drained", START + 8 * D),  # episode 3 (3 days on), out
        move("a", "drained", "in_service", START + 8 * D + 12 * H),  # repaired: 12 h
    ]


class TestNodeFigures:
    def test_known_history(self):
        """Episodes 4 and 3 days apart, repairs of 24 h and 12 h, 36 h of 720 out."""
        got = node_figures("a", history_a(), now_ms=NOW, window_s=WINDOW_S, gpus=8)
        assert got.episodes == 3
        assert got.between_s == (4 * 86400.0, 3 * 86400.0)
        assert got.repairs_s == (86400.0, 43200.0)
        assert got.open_s is None
        assert got.out_s == 36 * 3600.0
        assert got.lost_ratio == pytest.approx(36 / 720)
        shown = got.to_json()
        assert shown["mean_time_between_incidents_s"] == 3.5 * 86400
        assert shown["mean_time_to_repair_s"] == 18 * 3600
        assert shown["state"] == "in_service"

    def test_a_node_never_out(self):
        """No move: no episode, no repair, nothing lost, and no means at all."""
        got = node_figures("b", [], now_ms=NOW, window_s=WINDOW_S, gpus=8)
        assert (got.episodes, got.between_s, got.repairs_s, got.out_s) == (0, (), (), 0.0)
        assert got.lost_ratio == 0.0
        assert got.to_json()["mean_time_to_repair_s"] is None
        assert got.to_json()["mean_time_between_incidents_s"] is None

    def test_an_open_repair_is_its_age_and_no_completed_one(self):
        """Drained a day before now and still out: open for a day, a day out, no repair done."""
        rows = [move("d", "in_service", "drained", NOW - D)]
        got = node_figures("d", rows, now_ms=NOW, window_s=WINDOW_S, gpus=8)
        assert (got.repairs_s, got.open_s, got.out_s) == ((), 86400.0, 86400.0)
        assert got.state == "drained"

    def test_out_since_before_the_window(self):
        """Sent for RMA five days before the window (in RMA two days before it), back on day
        10: a 15-day repair, 10 days of the window lost."""
        before = move("c", "in_repair", "rma", START - 2 * D)
        rows = [move("c", "rma", "in_service", START + 10 * D)]
        got = node_figures(
            "c", rows, now_ms=NOW, window_s=WINDOW_S, gpus=4, before=before, left_ms=START - 5 * D
        )
        assert got.repairs_s == (15 * 86400.0,)
        assert got.out_s == 10 * 86400.0
        assert got.lost_ratio == pytest.approx(1 / 3)

    def test_out_for_the_whole_window(self):
        """Drained before the window and never back: all of it lost, open since it left."""
        before = move("e", "suspect", "drained", START - D)
        got = node_figures("e", [], now_ms=NOW, window_s=WINDOW_S, gpus=8, before=before)
        assert got.lost_ratio == 1.0
        assert got.open_s == 31 * 86400.0  # from its leaving (the row before the window)

    def test_moves_before_the_window_or_after_now_are_left_out(self):
        """A move handed over from before the start, or later than now, counts for nothing."""
        rows = [
            move("f", "in_service", "drained", START - D),
            move("f", "drained", "in_service", START - D + H),
            move("f", "in_service", "suspect", NOW + H),
        ]
        got = node_figures("f", rows, now_ms=NOW, window_s=WINDOW_S, gpus=8)
        assert (got.episodes, got.repairs_s, got.out_s) == (0, (), 0.0)

    def test_a_release_back_to_suspect_is_no_new_episode(self):
        """Drained, released while its fault still fires (suspect at once): one episode."""
        rows = [
            move("g", "in_service", "suspect", START + D),
            move("g", "suspect", "drained", START + D + 1),
            move("g", "drained", "in_service", START + 2 * D),
            move("g", "in_service", "suspect", START + 2 * D, reason=STILL_FIRING),
            move("g", "suspect", "in_service", START + 2 * D + H),
        ]
        got = node_figures("g", rows, now_ms=NOW, window_s=WINDOW_S, gpus=8)
        assert got.episodes == 1
        assert got.repairs_s == ((D - 1) / 1000,)

    def test_in_repair_or_rma_straight_from_service_is_a_repair(self):
        """A person takes an in-service node for repair: out of service, a repair, no episode."""
        rows = [
            move("h", "in_service", "in_repair", START + D),
            move("h", "in_repair", "requalifying", START + D + 2 * H),
            move("h", "requalifying", "in_service", START + D + 3 * H),
            move("h", "suspect", "rma", START + 3 * D),
        ]
        got = node_figures("h", rows, now_ms=NOW, window_s=WINDOW_S, gpus=8)
        assert got.episodes == 0
        assert got.repairs_s == (3 * 3600.0,)
        assert got.open_s == 27 * 86400.0
        assert got.out_s == 3 * 3600.0 + 27 * 86400.0


class TestFleetFigures:
    def test_the_fleet_sums_gpus_times_time_out(self):
        """GPU-time lost is the sum over the sum, every node of the fleet counted, moved or
        not: 8x36 h + 4x240 h + 8x24 h of 28 GPUs x 720 h."""
        rows = [
            *history_a(),
            move("c", "rma", "in_service", START + 10 * D),
            move("d", "in_service", "drained", NOW - D),
        ]
        before = {"c": move("c", "in_repair", "rma", START - 2 * D)}
        got = fleet_figures(
            rows,
            now_ms=NOW,
            window_s=WINDOW_S,
            gpus={"a": 8, "b": 8, "c": 4, "d": 8},
            before=before,
            left={"c": START - 5 * D},
        )
        assert [n.node for n in got.nodes] == ["a", "b", "c", "d"]
        assert got.gpu_time_lost_ratio == pytest.approx((8 * 36 + 4 * 240 + 8 * 24) / (28 * 720))
        assert sorted(got.repairs_s) == [43200.0, 86400.0, 15 * 86400.0]
        assert got.mean_time_to_repair_s == pytest.approx((0.5 + 1 + 15) * 86400 / 3)
        assert got.mean_time_between_incidents_s == 3.5 * 86400
        assert got.open_repairs == [("d", 86400.0)]
        shown = got.to_json()
        assert (shown["nodes"], shown["gpus"], shown["incident_episodes"]) == (4, 28, 4)
        assert shown["open_repairs"] == [{"node": "d", "age_s": 86400.0}]

    def test_an_empty_fleet(self):
        got = fleet_figures([], now_ms=NOW, window_s=WINDOW_S, gpus={})
        assert got.gpu_time_lost_ratio == 0.0
        assert got.mean_time_to_repair_s is None

    def test_a_journal_node_the_fleet_does_not_know_weighs_nothing(self):
        """It has figures, with no GPUs: it cannot move the fleet's share."""
        rows = [move("gone", "in_service", "drained", START)]
        got = fleet_figures(rows, now_ms=NOW, window_s=WINDOW_S, gpus={"a": 8})
        assert [(n.node, n.gpus) for n in got.nodes] == [("a", 8), ("gone", 0)]
        assert got.gpu_time_lost_ratio == 0.0


class TestRemediations:
    @pytest.mark.parametrize(
        ("action", "kind"),
        [
            ("drain_node", "drains"),
            ("escalated_drain_node", "drains"),
            ("reset_gpu", "resets"),
            ("escalated_reset_gpu", "resets"),
            ("reboot_node", "reboots"),
            ("rma_ticket", "rma_tickets"),
            ("notify", None),
            ("resume_node", None),
            ("release_node", None),
            ("requeue_job", None),
            ("undrain_node_x", None),
        ],
    )
    def test_by_name(self, action, kind):
        """Remediations are matched by the end of their name, so an escalation counts."""
        assert remediation_kind(action) == kind

    def test_counts_in_the_last_seven_days(self):
        """Remediations by kind and episodes, only those of the last 7 days."""
        actions = [
            ("a", "drain_node", NOW - 8 * D),  # too old
            ("a", "drain_node", NOW - D),
            ("a", "escalated_reset_gpu", NOW - H),
            ("a", "notify", NOW - H),
            ("b", "reboot_node", NOW),
        ]
        rows = [
            move("a", "in_service", "suspect", NOW - 2 * D),
            move("a", "suspect", "drained", NOW - 2 * D),  # not an episode
            move("c", "in_service", "suspect", NOW - 9 * D),  # too old
        ]
        got = recent_counts(actions, rows, now_ms=NOW)
        assert sorted(got) == ["a", "b"]
        assert got["a"].to_json() == {
            "remediations": 2,
            "drains": 1,
            "resets": 1,
            "reboots": 0,
            "rma_tickets": 0,
            "incident_episodes": 1,
        }
        assert got["b"].remediations == {"reboots": 1}

    def test_episodes(self):
        assert is_episode(move("a", "in_service", "drained", 0))
        assert not is_episode(move("a", "suspect", "drained", 0))
        assert not is_episode(move("a", "in_service", "in_repair", 0))
        assert not is_episode(move("a", "in_service", "suspect", 0, reason=STILL_FIRING))


class TestBuckets:
    def test_cumulative_with_le_inclusive(self):
        """A value on a bound counts in that bucket; +Inf holds everything; bad values none."""
        buckets = Buckets()
        for value in (900.0, 901.0, 10.0, 3e6, -1.0, math.nan):
            buckets.observe(value)
        got = dict(buckets.cumulative())
        assert got[900.0] == 2
        assert got[1800.0] == 3
        assert got[BUCKETS_S[-1]] == 3
        assert got[math.inf] == 4
        assert (buckets.count, buckets.total) == (4, 900.0 + 901.0 + 10.0 + 3e6)
