from agent.changes import ChangeDetector
from fleetwatch.model import Target

GPU = Target.gpu("GPU-00000000-0000")
LINK = Target.nvlink("GPU-00000000-0000", 3)


class TestChangeDetector:
    def test_first_diff_is_the_full_snapshot(self):
        """A new stream starts by sending every current value."""
        snap = {(GPU, "pcie_replay_count"): 0, (LINK, "nvlink_up"): 1}
        assert sorted(ChangeDetector().diff(snap), key=str) == sorted(snap.items(), key=str)

    def test_unchanged_values_are_not_sent_again(self):
        """Counters that do not move cost nothing on the wire."""
        det = ChangeDetector()
        snap = {(GPU, "pcie_replay_count"): 5, (LINK, "nvlink_up"): 1}
        det.diff(snap)
        assert det.diff(dict(snap)) == []

    def test_only_changed_values_are_sent(self):
        """A value that moved is sent alone."""
        det = ChangeDetector()
        det.diff({(GPU, "pcie_replay_count"): 5, (LINK, "nvlink_up"): 1})
        assert det.diff({(GPU, "pcie_replay_count"): 5, (LINK, "nvlink_up"): 0}) == [
            ((LINK, "nvlink_up"), 0),
        ]

    def test_new_keys_are_sent(self):
        """A signal seen for the first time is a change."""
        det = ChangeDetector()
        det.diff({(GPU, "pcie_replay_count"): 5})
        assert det.diff({(GPU, "pcie_replay_count"): 5, (GPU, "gpu_present"): 1}) == [
            ((GPU, "gpu_present"), 1),
        ]
