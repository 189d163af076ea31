import math

from agent.changes import LiveSamples
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
