from collections import Counter

import pytest

from agent.poll.findings import PollResult
from agent.poll.kernel_log import KernelLogPoller
from agent.probes.xid_merge import MAX_UNPAIRED, XidMerger, XidRepeats
from agent.sim.kmsg import SimKmsg
from agent.sources.nvml import GpuIdentity
from fleetwatch.model import EventKind, Target
from fleetwatch.testing import FakeClock
from fleetwatch.wire.repeats import occurrences, parse_repeats
from fleetwatch.wire.validate import Inventory, validate_event
from rules.xid_catalog import load_catalog

CATALOG = load_catalog()
GPU0 = GpuIdentity(0, "GPU-00000000-aaaa-bbbb-cccc-1234567890ab", "0000:18:00.0", "H100", 18)
GPU1 = GpuIdentity(1, "GPU-11111111-aaaa-bbbb-cccc-1234567890ab", "0000:2a:00.0", "H100", 18)
BY_BUS = {GPU0.pci_bus_id: GPU0, GPU1.pci_bus_id: GPU1}
INVENTORY = Inventory(nvlinks_by_gpu={GPU0.uuid: 18, GPU1.uuid: 18})
NOW_MS = 1_767_225_600_000


def line(gpu: GpuIdentity, xid: int, n: int = 0) -> str:
    return f"NVRM: Xid (PCI:{gpu.pci_bus_id[:-2]}): {xid}, pid=42, name=python, SM {n}"


def lost(gpu, result, now_ms, *, xid=0, detail=""):
    raise AssertionError("no GPU is lost here")


class Storm:
    def __init__(self, merger: XidMerger) -> None:
        self.clock = FakeClock()
        self.kmsg = SimKmsg(self.clock, capacity=100_000)
        self.merger = merger
        self.poller = KernelLogPoller(self.kmsg, CATALOG, merger, self.clock)

    def poll(self) -> PollResult:
        result = PollResult()
        self.poller.poll(BY_BUS, lost, result, NOW_MS, Counter())
        return result


class TestXidStorm:
    def test_a_storm_is_its_burst_then_one_event_per_window_with_a_count(self):
        """5000 lines of Xid 13 on GPU 0 in one poll: 100 events, then after the window one
        event standing for the other 4900; agent_events_coalesced counts them."""
        storm = Storm(XidMerger(coalesce_s=1.0, burst=100))
        for n in range(5000):
            storm.kmsg.write(line(GPU0, 13, n))
        first = storm.poll()
        assert len(first.events) == 100
        assert first.samples[Target.node(), "agent_events_coalesced"] == 4900
        storm.clock.advance(1.0)
        second = storm.poll()
        (summary,) = second.events
        assert summary.kind == EventKind.XID
        assert summary.target == Target.gpu(GPU0.uuid)
        assert (summary.xid, summary.xid_class) == (13, CATALOG.class_of(13))
        assert summary.detail.startswith("[repeated 4900 times over 1.0 s] NVRM: Xid")
        assert summary.detail.endswith("SM 4999")  # the last line's own words
        validate_event(summary.to_pb(101), INVENTORY)

    def test_a_lasting_storm_gives_one_event_per_window_and_ends_with_a_quiet_window(self):
        """While the storm goes on each window sends one counted event and nothing else; a
        window with no line ends it, and the next line is an event of its own again."""
        storm = Storm(XidMerger(coalesce_s=1.0, burst=3))
        counts = []
        for _ in range(4):
            for n in range(1000):
                storm.kmsg.write(line(GPU0, 13, n))
            events = storm.poll().events
            storm.clock.advance(1.0)
            events += storm.poll().events
            counts.append([occurrences(e.detail) for e in events])
        assert counts == [[1, 1, 1, 997], [1000], [1000], [1000]]
        storm.clock.advance(1.0)
        assert storm.poll().events == []  # a quiet window: over
        storm.kmsg.write(line(GPU0, 13))
        (again,) = storm.poll().events
        assert parse_repeats(again.detail) is None
        assert storm.merger.coalesced == 997 + 3000

    def test_different_xids_and_gpus_are_never_merged(self):
        """Storms of Xid 13 and 31 on GPU 0 and of Xid 13 on GPU 1 are three storms."""
        storm = Storm(XidMerger(coalesce_s=1.0, burst=2))
        for n in range(50):
            storm.kmsg.write(line(GPU0, 13, n))
            storm.kmsg.write(line(GPU0, 31, n))
            storm.kmsg.write(line(GPU1, 13, n))
        first = storm.poll().events
        assert Counter((e.target.gpu_uuid, e.xid) for e in first) == {
            (GPU0.uuid, 13): 2,
            (GPU0.uuid, 31): 2,
            (GPU1.uuid, 13): 2,
        }
        storm.clock.advance(1.0)
        summaries = storm.poll().events
        assert {(e.target.gpu_uuid, e.xid, occurrences(e.detail)) for e in summaries} == {
            (GPU0.uuid, 13, 48),
            (GPU0.uuid, 31, 48),
            (GPU1.uuid, 13, 48),
        }

    def test_a_device_nvml_does_not_know_storms_under_its_pci_target(self):
        """Xid lines of an unknown bus id are coalesced too, and reported on the PCI function."""
        storm = Storm(XidMerger(coalesce_s=1.0, burst=1))
        for n in range(10):
            storm.kmsg.write(f"NVRM: Xid (PCI:0000:99:00): 13, pid=1, SM {n}")
        assert [e.target for e in storm.poll().events] == [Target.pci("0000:99:00.0")]
        storm.clock.advance(1.0)
        (summary,) = storm.poll().events
        assert (summary.target, occurrences(summary.detail)) == (Target.pci("0000:99:00.0"), 9)


class TestXidMerger:
    def test_the_other_sources_copies_pair_and_count_nowhere(self):
        """In a storm seen by both sources each NVML copy pairs with a kernel line: the
        coalesced count is the number of faults, not twice it."""
        merger = XidMerger(coalesce_s=1.0, burst=10)
        kmsg = [merger.offer("kmsg", "GPU-a", 13, 0.0, "line") for _ in range(100)]
        nvml = [merger.offer("nvml", "GPU-a", 13, 0.01) for _ in range(100)]
        assert sum(kmsg) == 10
        assert not any(nvml)
        assert merger.coalesced == 90
        assert merger.flush(1.0) == [XidRepeats("GPU-a", 13, 90, 1.0, "line")]

    def test_below_the_burst_every_occurrence_is_an_event(self):
        """A handful of real Xids in a second are each an event; nothing is coalesced."""
        merger = XidMerger(coalesce_s=1.0, burst=100)
        assert all(merger.offer("kmsg", "GPU-a", 13, i * 0.01) for i in range(100))
        assert merger.coalesced == 0
        assert merger.flush(5.0) == []

    def test_unpaired_occurrences_are_bounded(self):
        """A storm one source alone sees keeps at most MAX_UNPAIRED occurrences for pairing."""
        merger = XidMerger(coalesce_s=1.0, burst=1)
        for _ in range(MAX_UNPAIRED * 3):
            merger.offer("kmsg", "GPU-a", 13, 0.0)
        assert len(merger._unpaired["GPU-a", 13]["kmsg"]) == MAX_UNPAIRED
        merger.flush(60.0)
        assert merger._unpaired == {}

    @pytest.mark.parametrize(
        "kwargs", [{"window_s": 0.0}, {"coalesce_s": -1.0}, {"burst": 0}], ids=str
    )
    def test_settings_that_cannot_work_are_refused(self, kwargs):
        """A zero window or burst would merge everything or nothing: refused at construction."""
        with pytest.raises(ValueError, match="must be"):
            XidMerger(**kwargs)
