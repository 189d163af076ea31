import math

from agent.outbox.changes import LiveSamples
from fleetwatch.model import Target

GPU = Target.gpu("GPU-00000000-0000")
LINK = Target.nvlink("GPU-00000000-0000", 3)


class TestLiveSamples:
    def test_a_new_stream_gets_the_full_snapshot(self):
        """take_all hands out every value, however long ago it changed."""
        live = LiveSamples()
        snap = {(GPU, "pcie_replay_count"): 0, (LINK, "nvlink_up"): 1}
        live.update(snap)
        live.take_changes()
        assert sorted(live.take_all(), key=str) == sorted(snap.items(), key=str)

    def test_unchanged_values_are_not_sent_again(self):
        """Counters that do not move cost nothing on the wire."""
        live = LiveSamples()
        snap = {(GPU, "pcie_replay_count"): 5, (LINK, "nvlink_up"): 1}
        live.update(snap)
        live.take_all()
        assert live.update(dict(snap)) == 0
        assert live.take_changes() == []

    def test_only_changed_values_are_sent(self):
        """A value that moved is sent alone, with its newest value."""
        live = LiveSamples()
        live.update({(GPU, "pcie_replay_count"): 5, (LINK, "nvlink_up"): 1})
        live.take_all()
        live.update({(GPU, "pcie_replay_count"): 5, (LINK, "nvlink_up"): 0})
        live.update({(LINK, "nvlink_up"): 1})  # flapped back before the sender looked
        assert live.take_changes() == [((LINK, "nvlink_up"), 1)]

    def test_new_keys_are_changes_and_wake_the_sender(self):
        """A signal seen for the first time is a change, and sets the event."""
        live = LiveSamples()
        live.update({(GPU, "pcie_replay_count"): 5})
        live.take_all()
        live.changed.clear()
        live.update({(GPU, "pcie_replay_count"): 5})
        assert not live.changed.is_set()
        live.update({(GPU, "gpu_present"): 1})
        assert live.changed.is_set()
        assert live.take_changes() == [((GPU, "gpu_present"), 1)]


def test_values_the_collector_would_refuse_are_kept_back_and_counted():
    """NaN, inf and overlong text never reach a report (the collector would refuse it, and
    every report after a reconnect carries every value): the last good value stays."""
    live = LiveSamples()
    key = (Target.node(), "temperature_celsius")
    text_key = (Target.node(), "ib_state")
    live.update({key: 40.5, text_key: "ACTIVE"})
    live.take_all()
    assert live.update({key: math.nan, text_key: "x" * 300}) == 0
    assert live.update({key: math.inf}) == 0
    assert live.refused == 3
    assert dict(live.take_all()) == {key: 40.5, text_key: "ACTIVE"}
    assert live.update({key: 41.0}) == 1


class TestPacedGauges:
    """A busy GPU's temperature, power, utilisation and clock travel at most every
    gauge_interval; states and counters at once."""

    def clocked(self, interval: float = 5.0) -> tuple[LiveSamples, list[float]]:
        now = [100.0]
        return LiveSamples(interval, lambda: now[0]), now

    def test_a_gauge_waits_for_its_pace_and_then_travels_with_its_newest_value(self):
        live, now = self.clocked()
        live.update({(GPU, "temperature_celsius"): 60, (GPU, "pcie_replay_count"): 0})
        live.take_all()
        for step, temp in enumerate((61, 62, 63, 64), start=1):
            now[0] = 100.0 + step
            live.update({(GPU, "temperature_celsius"): temp})
            assert live.take_changes() == []  # held: it travelled with the stream's start
            assert live.next_due() == 105.0
        now[0] = 105.0
        live.update({(GPU, "temperature_celsius"): 65})
        assert live.take_changes() == [((GPU, "temperature_celsius"), 65)]
        assert live.next_due() is None

    def test_a_held_gauge_travels_when_due_without_a_new_change(self):
        """The last move before a quiet spell is not lost: next_due tells the sender when."""
        live, now = self.clocked()
        live.update({(GPU, "power_watts"): 400.0})
        live.take_all()
        now[0] = 101.0
        live.update({(GPU, "power_watts"): 650.0})
        assert live.take_changes() == []
        due = live.next_due()
        assert due == 105.0
        now[0] = due
        assert live.take_changes() == [((GPU, "power_watts"), 650.0)]

    def test_states_and_counters_are_never_held(self):
        live, now = self.clocked()
        live.update({(GPU, "temperature_celsius"): 60, (LINK, "nvlink_up"): 1})
        live.take_all()
        now[0] = 100.5
        live.update(
            {
                (GPU, "temperature_celsius"): 61,
                (LINK, "nvlink_up"): 0,
                (GPU, "clocks_hw_thermal_slowdown"): 1,
                (GPU, "ecc_dbe_volatile_total"): 1,
            }
        )
        got = dict(live.take_changes())
        assert got == {
            (LINK, "nvlink_up"): 0,
            (GPU, "clocks_hw_thermal_slowdown"): 1,
            (GPU, "ecc_dbe_volatile_total"): 1,
        }

    def test_each_series_keeps_its_own_pace(self):
        """A GPU whose temperature just travelled does not hold another GPU's back."""
        other = Target.gpu("GPU-11111111-1111")
        live, now = self.clocked()
        live.update({(GPU, "temperature_celsius"): 60})
        live.take_all()
        now[0] = 103.0
        live.update({(other, "temperature_celsius"): 70})  # never sent: goes at once
        assert live.take_changes() == [((other, "temperature_celsius"), 70)]

    def test_a_zero_interval_sends_every_change(self):
        live, now = self.clocked(0.0)
        live.update({(GPU, "temperature_celsius"): 60})
        live.take_all()
        now[0] = 100.1
        live.update({(GPU, "temperature_celsius"): 61})
        assert live.take_changes() == [((GPU, "temperature_celsius"), 61)]
        assert live.next_due() is None
