from pathlib import Path

import pytest

from agent.exceptions import GpuLostError, NvmlError, SourceError
from agent.sim.hardware import SimNode
from agent.sim.nvml_lib import SimNvmlLibrary
from agent.sources.nvml import NvmlSource
from agent.sources.sysfs import SysfsReader, strip_enum
from agent.sources.udev import PyudevSource, UdevEvent
from fleetwatch.testing import FakeClock


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode("node-a", tmp_path / "sys", FakeClock(), gpus=2, nvlinks=4, ib_ports=2)


class TestNvmlSource:
    def test_identity_uses_nvml_formats_normalised(self, node: SimNode):
        """UUID, model and bus id come from NVML; the bus id is normalised to dddd:bb:dd.f."""
        src = NvmlSource(SimNvmlLibrary(node.gpus))
        assert src.start() == ("570.133.20", "12.570.133.20")
        gpu = src.identify(1)
        assert gpu.uuid == node.gpus[1].uuid
        assert gpu.pci_bus_id == f"0000:{node.gpus[1].bus:02x}:00.0"
        assert gpu.model == "NVIDIA H100 80GB HBM3"

    def test_nvlink_count_is_probed_not_assumed(self, node: SimNode):
        """The link count comes from the device, not from NVML_NVLINK_MAX_LINKS."""
        src = NvmlSource(SimNvmlLibrary(node.gpus))
        src.start()
        assert src.identify(0).nvlink_count == 4

    def test_reading_reflects_link_state_and_replays(self, node: SimNode):
        """A down link reads False; the replay counter reads what the hardware counted."""
        src = NvmlSource(SimNvmlLibrary(node.gpus))
        src.start()
        gpu = src.identify(0)
        node.nvlink_down(0, 2)
        node.pcie_replays(0, 17)
        reading = src.read(gpu)
        assert reading.nvlink_up == (True, True, False, True)
        assert reading.pcie_replay_count == 17

    def test_lost_gpu_raises_gpu_lost_on_every_call(self, node: SimNode):
        """After Xid 79 every read of that GPU raises GpuLostError; the other GPU still reads."""
        src = NvmlSource(SimNvmlLibrary(node.gpus))
        src.start()
        lost, ok = src.identify(0), src.identify(1)
        node.xid(0, 79)
        for _ in range(2):
            with pytest.raises(GpuLostError):
                src.read(lost)
        assert src.read(ok).nvlink_up == (True,) * 4

    def test_driver_not_loaded_is_a_clear_nvml_error(self, node: SimNode):
        """NVML init without a driver fails with NVML's code and words."""
        src = NvmlSource(SimNvmlLibrary(node.gpus, driver_loaded=False))
        with pytest.raises(NvmlError, match="nvmlInit: Driver Not Loaded") as info:
            src.start()
        assert info.value.code == 9

    def test_calls_before_init_fail_like_nvml(self, node: SimNode):
        """The simulated library refuses calls before nvmlInit, as the real one does."""
        src = NvmlSource(SimNvmlLibrary(node.gpus))
        with pytest.raises(NvmlError, match="Uninitialized"):
            src.device_count()


class TestSysfsReader:
    def test_lists_ports_with_rate_and_link_layer(self, node: SimNode):
        """Every HCA port under class/infiniband is found, in order."""
        ports = SysfsReader(node.sysfs.root).ib_ports()
        assert [(p.device, p.port) for p in ports] == [("mlx5_0", 1), ("mlx5_1", 1)]
        assert ports[0].rate == "400 Gb/sec (4X NDR)"
        assert ports[0].link_layer == "InfiniBand"

    def test_status_follows_the_port(self, node: SimNode):
        """State text is stripped of its number; link_downed counts transitions to down."""
        reader = SysfsReader(node.sysfs.root)
        status = reader.ib_port_status("mlx5_1", 1)
        assert (status.state, status.phys_state, status.link_downed) == ("ACTIVE", "LinkUp", 0)
        node.ib_port_down(1)
        status = reader.ib_port_status("mlx5_1", 1)
        assert (status.state, status.phys_state, status.link_downed) == ("DOWN", "Polling", 1)

    def test_no_infiniband_tree_means_no_ports(self, tmp_path: Path):
        """A node without IB has no ports, not an error."""
        assert SysfsReader(tmp_path).ib_ports() == []

    def test_a_garbage_counter_is_unknown_and_a_missing_port_a_source_error(self, node: SimNode):
        """A non-numeric link_downed is unknown (-1) and named, the state is still read; a port
        that does not exist names the path."""
        reader = SysfsReader(node.sysfs.root)
        counter = node.sysfs.root / "class/infiniband/mlx5_0/ports/1/counters/link_downed"
        counter.write_text("banana\n")
        status = reader.ib_port_status("mlx5_0", 1)
        assert (status.state, status.link_downed) == ("ACTIVE", -1)
        assert status.unreadable == ("counters/link_downed",)
        with pytest.raises(SourceError, match="cannot read"):
            reader.ib_port_status("mlx5_9", 1)

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("4: ACTIVE", "ACTIVE"),
            ("5: LinkUp\n", "LinkUp"),
            ("ACTIVE", "ACTIVE"),
            ("x: y", "x: y"),
        ],
    )
    def test_strip_enum(self, text, expected):
        """Only a numeric prefix is stripped."""
        assert strip_enum(text) == expected


class TestPyudevSource:
    def test_real_kernel_monitor_opens_and_polls_without_blocking(self):
        """The real udev source subscribes to kernel uevents and returns at once when idle."""
        source = PyudevSource()
        try:
            events = source.poll()
            assert isinstance(events, list)
            assert all(isinstance(e, UdevEvent) for e in events)
        finally:
            source.close()
