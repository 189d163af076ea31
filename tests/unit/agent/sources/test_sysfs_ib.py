from pathlib import Path

import pytest

import agent.sources.sysfs as sysfs_module
from agent.exceptions import SourceError
from agent.probes.counters import IB_COUNTER_WIDTH_BITS
from agent.sim.hardware import SimNode
from agent.sim.sysfs_tree import MLX5_HW_COUNTERS, SimSysfsTree
from agent.sources.sysfs import SysfsReader
from fleetwatch.testing import FakeClock

FIXTURE = Path(__file__).parents[3] / "fixtures" / "sysfs" / "h100-cx7"
NDR = "400 Gb/sec (4X NDR)"
# What ib_port_counters reports: file names, with the data counters renamed to bytes.
EXPECTED_COUNTERS = (set(IB_COUNTER_WIDTH_BITS) - {"port_xmit_data", "port_rcv_data"}) | {
    "port_xmit_bytes",
    "port_rcv_bytes",
}


def fixture_file(device: str, name: str) -> int:
    return int((FIXTURE / "class/infiniband" / device / "ports/1" / name).read_text())


def sim_port(tmp_path: Path, **counters: int) -> tuple[SimSysfsTree, SysfsReader]:
    tree = SimSysfsTree(tmp_path)
    tree.write_ib_port(
        "mlx5_0",
        1,
        state="4: ACTIVE",
        phys_state="5: LinkUp",
        rate=NDR,
        link_layer="InfiniBand",
        counters=counters,
    )
    return tree, SysfsReader(tmp_path)


class TestIbCountersOnFixture:
    def test_finds_all_eight_ndr_ports_through_class_symlinks(self):
        """class/infiniband/mlx5_* are symlinks into the PCI tree, as on a real node."""
        ports = SysfsReader(FIXTURE).ib_ports()
        assert [p.device for p in ports] == [f"mlx5_{i}" for i in range(8)]
        assert {(p.port, p.rate, p.link_layer) for p in ports} == {(1, NDR, "InfiniBand")}

    @pytest.mark.parametrize("device", [f"mlx5_{i}" for i in range(8)])
    def test_reads_every_iba_counter_and_hw_counter(self, device):
        """Every counters/ file and every mlx5 hw counter is read, without errors."""
        result = SysfsReader(FIXTURE).ib_port_counters(device, 1)
        assert set(result.counters) == EXPECTED_COUNTERS
        assert set(result.hw_counters) == set(MLX5_HW_COUNTERS)
        assert (result.read_errors, result.unreadable) == (0, ())

    @pytest.mark.parametrize("device", [f"mlx5_{i}" for i in range(8)])
    def test_data_counters_are_four_times_the_file(self, device):
        """port_*_data count 4-octet words; the reader reports bytes and drops the raw names."""
        counters = SysfsReader(FIXTURE).ib_port_counters(device, 1).counters
        assert counters["port_xmit_bytes"] == 4 * fixture_file(device, "counters/port_xmit_data")
        assert counters["port_rcv_bytes"] == 4 * fixture_file(device, "counters/port_rcv_data")
        assert "port_xmit_data" not in counters
        assert counters["port_xmit_packets"] > 10**12

    def test_hw_counters_carry_driver_values_and_skip_lifespan(self):
        """mlx5 hw counters come through as read; lifespan is a setting, not a counter."""
        result = SysfsReader(FIXTURE).ib_port_counters("mlx5_6", 1)
        assert result.hw_counters["out_of_buffer"] == 1532
        assert "lifespan" not in result.hw_counters
        assert (
            SysfsReader(FIXTURE).ib_port_counters("mlx5_5", 1).hw_counters["local_ack_timeout_err"]
            == 3
        )

    def test_status_and_error_counters_of_the_flapping_port(self):
        """The fixture's marginal port shows its flap in both readers."""
        reader = SysfsReader(FIXTURE)
        assert reader.ib_port_status("mlx5_5", 1).link_downed == 1
        counters = reader.ib_port_counters("mlx5_5", 1).counters
        assert (
            counters["symbol_error"],
            counters["port_rcv_errors"],
            counters["link_error_recovery"],
        ) == (37, 4, 1)


class TestIbCountersOddContent:
    @pytest.mark.parametrize("content", ["banana\n", "", "-1\n", "12 34\n"])
    def test_bad_counter_file_is_skipped_and_counted(self, tmp_path: Path, content):
        """Garbage, empty or negative content costs that counter only, and is counted."""
        _, reader = sim_port(tmp_path)
        counter = tmp_path / "class/infiniband/mlx5_0/ports/1/counters/symbol_error"
        counter.write_text(content)
        result = reader.ib_port_counters("mlx5_0", 1)
        assert result.unreadable == ("symbol_error",)
        assert result.read_errors == 1
        assert "symbol_error" not in result.counters
        assert result.counters["link_downed"] == 0

    def test_missing_base_counter_counts_but_missing_extended_one_does_not(self, tmp_path: Path):
        """HCAs without extended counters lack unicast_*; every HCA has port_xmit_wait."""
        _, reader = sim_port(tmp_path)
        counters = tmp_path / "class/infiniband/mlx5_0/ports/1/counters"
        (counters / "port_xmit_wait").unlink()
        (counters / "unicast_xmit_packets").unlink()
        result = reader.ib_port_counters("mlx5_0", 1)
        assert result.unreadable == ("port_xmit_wait",)
        assert "unicast_xmit_packets" not in result.counters

    def test_bad_hw_counter_is_named_with_its_directory(self, tmp_path: Path):
        """An unreadable hw counter is reported as hw_counters/<name>."""
        _, reader = sim_port(tmp_path)
        (tmp_path / "class/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer").write_text("x")
        assert reader.ib_port_counters("mlx5_0", 1).unreadable == ("hw_counters/out_of_buffer",)

    def test_no_hw_counters_directory_is_not_an_error(self, tmp_path: Path):
        """Drivers without hw_counters/ give an empty dict and no read errors."""
        _, reader = sim_port(tmp_path)
        hw = tmp_path / "class/infiniband/mlx5_0/ports/1/hw_counters"
        for path in hw.iterdir():
            path.unlink()
        hw.rmdir()
        result = reader.ib_port_counters("mlx5_0", 1)
        assert (dict(result.hw_counters), result.read_errors) == ({}, 0)

    def test_missing_port_is_a_source_error(self, tmp_path: Path):
        """A port that is not there at all fails the read, naming the path."""
        _, reader = sim_port(tmp_path)
        with pytest.raises(SourceError, match=r"mlx5_0/ports/2"):
            reader.ib_port_counters("mlx5_0", 2)


class TestSimTreeIbCounters:
    def test_sim_tree_has_the_same_shape_as_the_fixture(self, tmp_path: Path):
        """The simulator writes the same counter and hw counter files a CX7 port has."""
        _, reader = sim_port(tmp_path)
        sim = reader.ib_port_counters("mlx5_0", 1)
        real = SysfsReader(FIXTURE).ib_port_counters("mlx5_0", 1)
        assert set(sim.counters) == set(real.counters)
        assert set(sim.hw_counters) == set(real.hw_counters)
        assert sim.read_errors == 0

    def test_rewriting_link_downed_keeps_the_other_counters(self, tmp_path: Path):
        """A write that names only link_downed leaves traffic and errors as they were."""
        tree, reader = sim_port(tmp_path)
        tree.add_ib_traffic("mlx5_0", 1, xmit_bytes=8192, rcv_bytes=4096)
        tree.add_ib_counters("mlx5_0", 1, {"symbol_error": 3}, {"out_of_buffer": 9})
        tree.write_ib_port(
            "mlx5_0",
            1,
            state="1: DOWN",
            phys_state="2: Polling",
            rate=NDR,
            link_layer="InfiniBand",
            counters={"link_downed": 1},
        )
        result = reader.ib_port_counters("mlx5_0", 1)
        assert (
            result.counters["port_xmit_bytes"],
            result.counters["port_rcv_bytes"],
            result.counters["port_xmit_packets"],
        ) == (8192, 4096, 2)
        assert (
            result.counters["symbol_error"],
            result.counters["link_downed"],
            result.hw_counters["out_of_buffer"],
        ) == (3, 1, 9)

    def test_narrow_counters_saturate_and_q_counters_wrap(self, tmp_path: Path):
        """The simulated HCA pins link_downed at 255 and wraps 32-bit Q counters."""
        tree, reader = sim_port(tmp_path, link_downed=250)
        tree.add_ib_counters("mlx5_0", 1, {"link_downed": 10, "symbol_error": 70_000})
        tree.add_ib_counters("mlx5_0", 1, hw_counters={"rx_write_requests": 2**32 + 7})
        result = reader.ib_port_counters("mlx5_0", 1)
        assert (result.counters["link_downed"], result.counters["symbol_error"]) == (255, 65535)
        assert result.hw_counters["rx_write_requests"] == 7

    def test_reset_zeroes_every_counter(self, tmp_path: Path):
        """An HCA reset clears counters and hw counters; lifespan stays."""
        tree, reader = sim_port(tmp_path, symbol_error=5)
        tree.add_ib_traffic("mlx5_0", 1, xmit_bytes=4096, rcv_bytes=4096)
        tree.reset_ib_counters("mlx5_0", 1)
        result = reader.ib_port_counters("mlx5_0", 1)
        assert set(result.counters.values()) | set(result.hw_counters.values()) == {0}
        lifespan = tmp_path / "class/infiniband/mlx5_0/ports/1/hw_counters/lifespan"
        assert lifespan.read_text().strip() == "10"

    def test_sim_node_port_down_keeps_the_full_counter_set(self, tmp_path: Path):
        """SimNode's link_downed-only writes leave every other counter file in place."""
        node = SimNode("n", tmp_path / "sys", FakeClock(), gpus=1, ib_ports=1)
        node.ib_port_down(0)
        result = SysfsReader(node.sysfs.root).ib_port_counters("mlx5_0", 1)
        assert set(result.counters) == EXPECTED_COUNTERS
        assert result.counters["link_downed"] == 1


class TestPublicNames:
    def test_all_lists_the_public_names(self):
        """``__all__`` names exactly the module's public classes and functions, and exists."""
        module = sysfs_module
        public = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        }
        listed = {
            name
            for name in module.__all__
            if getattr(getattr(module, name), "__module__", None) == module.__name__
        }
        assert listed == public
        assert all(hasattr(module, name) for name in module.__all__)
