from pathlib import Path

import pytest

from agent.probes.gpu_signals import GPU_SIGNALS, NVLINK_SIGNALS
from agent.sampler import Sampler
from agent.sim.hardware import SimNode
from agent.sim.nvml_lib import SimNvmlLibrary
from agent.sources.nvml import NvmlSource
from agent.sources.sysfs import SysfsReader
from fleetwatch.model import EventKind, Target
from fleetwatch.testing import FakeClock
from rules.xid_catalog import load_catalog


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode("node-a", tmp_path / "sys", FakeClock(), gpus=4, nvlinks=6, ib_ports=4)


@pytest.fixture
def sampler(node: SimNode) -> Sampler:
    s = Sampler(
        nvml=NvmlSource(SimNvmlLibrary(node)),
        sysfs=SysfsReader(node.sysfs.root),
        kmsg=node.kmsg,
        udev=node.udev,
        catalog=load_catalog(),
        clock=node.clock,
    )
    s.discover()
    return s


def kinds(sampler: Sampler) -> list[tuple[EventKind, Target, int]]:
    return [(e.kind, e.target, e.xid) for e in sampler.poll().events]


class TestSampler:
    def test_healthy_node_has_samples_and_no_events(self, sampler: Sampler, node: SimNode):
        """First poll: every signal sampled, nothing to report."""
        result = sampler.poll()
        assert result.events == []
        uuid = node.gpus[0].uuid
        assert result.samples[Target.gpu(uuid), "gpu_present"] == 1
        assert result.samples[Target.gpu(uuid), "pcie_replay_count"] == 0
        assert result.samples[Target.nvlink(uuid, 5), "nvlink_up"] == 1
        assert result.samples[Target.ib_port("mlx5_3", 1), "ib_state"] == "ACTIVE"
        per_gpu = 3 + len(GPU_SIGNALS) + 6 * len(NVLINK_SIGNALS)
        assert len(result.samples) == 4 * per_gpu + 4 * 3

    def test_xid_79_is_one_gpu_lost_event(self, sampler: Sampler, node: SimNode):
        """The kernel line and NVML's GPU-lost error are one event, not two."""
        sampler.poll()
        node.xid(2, 79)
        events = sampler.poll().events
        assert [(e.kind, e.xid, e.xid_class) for e in events] == [(EventKind.GPU_LOST, 79, "bus")]
        assert events[0].target == Target.gpu(node.gpus[2].uuid)
        assert "fallen off the bus" in events[0].detail
        assert kinds(sampler) == []
        assert sampler.poll().samples[Target.gpu(node.gpus[2].uuid), "gpu_present"] == 0

    def test_gpu_lost_seen_by_nvml_first_is_reported_once(self, sampler: Sampler, node: SimNode):
        """NVML's GPU-lost without a kernel line still yields exactly one event."""
        sampler.poll()
        node.gpus[1].lost = True
        assert kinds(sampler) == [(EventKind.GPU_LOST, Target.gpu(node.gpus[1].uuid), 0)]
        node.xid(1, 79)
        assert kinds(sampler) == []

    def test_other_xids_are_classified_events(self, sampler: Sampler, node: SimNode):
        """Each Xid line is one event carrying the catalog class."""
        sampler.poll()
        node.xid(0, 13)
        node.xid(0, 48)
        events = sampler.poll().events
        assert [(e.kind, e.xid, e.xid_class) for e in events] == [
            (EventKind.XID, 13, "application"),
            (EventKind.XID, 48, "memory"),
        ]

    def test_xid_for_unknown_bus_targets_the_pci_function(self, sampler: Sampler, node: SimNode):
        """An Xid naming a bus id NVML never listed is kept, aimed at the PCI function."""
        sampler.poll()
        node.kmsg.write("NVRM: Xid (PCI:0000:ee:00): 62, pid=1, name=x, halt")
        assert kinds(sampler) == [(EventKind.XID, Target.pci("0000:ee:00.0"), 62)]

    def test_nvlink_down_and_up_are_edges(self, sampler: Sampler, node: SimNode):
        """A link going down is one event; staying down is none; coming back is one."""
        sampler.poll()
        node.nvlink_down(3, 4)
        link = Target.nvlink(node.gpus[3].uuid, 4)
        assert kinds(sampler) == [(EventKind.NVLINK_DOWN, link, 0)]
        assert kinds(sampler) == []
        node.nvlink_up(3, 4)
        assert kinds(sampler) == [(EventKind.NVLINK_UP, link, 0)]

    def test_link_down_at_start_is_reported(self, sampler: Sampler, node: SimNode):
        """A link already down on the first poll is a fault worth an event."""
        node.nvlink_down(0, 0)
        assert kinds(sampler) == [(EventKind.NVLINK_DOWN, Target.nvlink(node.gpus[0].uuid, 0), 0)]

    def test_ib_flap_gives_down_up_down(self, sampler: Sampler, node: SimNode):
        """Each transition of a flapping port is an event; link_downed is in the evidence."""
        sampler.poll()
        port = Target.ib_port("mlx5_2", 1)
        node.ib_port_down(2)
        events = sampler.poll().events
        assert [(e.kind, e.target) for e in events] == [(EventKind.IB_PORT_DOWN, port)]
        assert "link_downed 1" in events[0].detail
        node.ib_port_up(2)
        assert kinds(sampler) == [(EventKind.IB_PORT_UP, port, 0)]
        node.ib_port_down(2)
        assert kinds(sampler) == [(EventKind.IB_PORT_DOWN, port, 0)]
        assert sampler.poll().samples[port, "ib_link_downed"] == 2

    def test_pci_remove_uevent_is_an_event(self, sampler: Sampler, node: SimNode):
        """udev's remove for a GPU's function becomes pci_removed on that GPU."""
        sampler.poll()
        node.pci_remove(1)
        events = kinds(sampler)
        assert events[0] == (EventKind.PCI_REMOVED, Target.gpu(node.gpus[1].uuid), 0)
        assert events[1][0] == EventKind.GPU_LOST

    def test_failed_read_is_counted_and_other_sources_go_on(self, sampler: Sampler, node: SimNode):
        """A broken sysfs file costs that port's samples only, and is counted."""
        sampler.poll()
        (node.sysfs.root / "class/infiniband/mlx5_0/ports/1/state").unlink()
        result = sampler.poll()
        assert sampler.source_errors["sysfs"] == 1
        assert (Target.ib_port("mlx5_0", 1), "ib_state") not in result.samples
        assert result.samples[Target.ib_port("mlx5_1", 1), "ib_state"] == "ACTIVE"
