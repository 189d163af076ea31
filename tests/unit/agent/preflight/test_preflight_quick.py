"""The quick checks read a simulated node through the agent's own NVML and sysfs sources."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from agent.poll.sampler import NodeInventory
from agent.preflight.quick import NO_HCA, NO_NVLINK, QUICK_CHECKS, QuickChecks
from agent.sim.hardware import SimNode
from agent.sources.nvml import NvmlSource
from agent.sources.pci_sysfs import PciSysfsReader
from agent.sources.sysfs import SysfsReader
from fleetwatch.preflight.vocabulary import Check
from fleetwatch.testing import FakeClock

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from fleetwatch.preflight.vocabulary import Measurement


def read(
    node: SimNode, after_start: Callable[[], None] = lambda: None
) -> dict[tuple[str, str], Measurement]:
    """Discover the node as the agent does, then (after ``after_start``) run every quick check."""
    nvml = NvmlSource(node.nvml)
    try:
        driver, version = nvml.start()
        gpus = tuple(nvml.identify(i) for i in range(nvml.device_count()))
        sysfs = SysfsReader(node.sysfs.root)
        inventory = NodeInventory(driver, version, gpus, tuple(sysfs.ib_ports()))
        quick = QuickChecks(nvml, sysfs, PciSysfsReader(node.sysfs.root))
        after_start()
        got = quick.run(inventory, QUICK_CHECKS)
    finally:
        nvml.stop()
    return {(m.check.value, m.component): m for m in got}


def test_a_healthy_node_reads_every_quick_check(tmp_path: Path):
    got = read(SimNode("n1", tmp_path, FakeClock()))
    assert {check for check, _ in got} == {c.value for c in QUICK_CHECKS}
    assert all(not m.error for m in got.values()), [m for m in got.values() if m.error]
    assert got["gpu_count", "node"].value == 8
    assert got["nvlink_up", "gpu:0"].value == 18
    assert got["gpu_pcie_link", "gpu:3"].text == "gen5 x16 (max gen5 x16)"
    assert got["nic_pcie_link", "nic:mlx5_2"].value == 1.0
    assert got["ib_port", "ib:mlx5_0/1"].value == 400
    assert got["nic_firmware", "nic:mlx5_7"].text == "28.39.1002"
    assert got["cuda_version", "node"].text == "12.8"
    assert got["ecc_mode", "gpu:5"].value == 1.0
    assert got["vbios_version", "gpu:1"].text


def test_faults_show_in_the_quick_checks(tmp_path: Path):
    node = SimNode("n1", tmp_path, FakeClock())
    node.ib_rate(3, 200)
    node.ib_port_down(4)
    node.pcie_downgrade(2, gen=4, width=8)
    node.gpus[6].remap_pending = True
    node.gpus[1].processes = [77]
    node.gpus[0].nvlink_up[4] = False
    node.sysfs.set_pci_link("0001:13:00.0", width=8)  # the fourth HCA's function
    got = read(node)
    assert got["ib_port", "ib:mlx5_3/1"].value == 200
    assert got["ib_port", "ib:mlx5_4/1"].value == 0.0
    assert got["gpu_pcie_link", "gpu:2"].text == "gen4 x8 (max gen5 x16)"
    assert got["gpu_pcie_link", "gpu:2"].value == 0.0
    assert got["row_remap", "gpu:6"].value == 1.0
    assert got["compute_processes", "gpu:1"].value == 1.0
    assert "77" in got["compute_processes", "gpu:1"].evidence
    assert got["nvlink_up", "gpu:0"].value == 17
    assert "4" in got["nvlink_up", "gpu:0"].evidence
    assert got["nic_pcie_link", "nic:mlx5_3"].text == "gen5 x8 (max gen5 x16)"


def test_a_gpu_lost_after_start_counts_against_gpu_count_and_is_named(tmp_path: Path):
    node = SimNode("n1", tmp_path, FakeClock())

    def lose() -> None:
        node.gpus[4].lost = True

    got = read(node, lose)
    count = got["gpu_count", "node"]
    assert count.value == 7
    assert "GPU 4" in count.evidence
    assert "lost" in count.evidence
    assert not any(component == "gpu:4" for _, component in got)
    assert Check.ECC_MODE.value in {c for c, _ in got}


def test_a_gpu_without_nvlink_and_a_node_without_hca_say_so(tmp_path: Path):
    """What a real H100 passed alone into a VM shows (tests/fixtures/nvml/): NVLink not supported,
    no InfiniBand port. The checks name that instead of 'every link up' or a missing result."""
    node = SimNode("n1", tmp_path, FakeClock())
    for gpu in node.gpus:
        gpu.nvlink_up = []
        gpu.nvlink_errors = []
    shutil.rmtree(node.sysfs.root / "class" / "infiniband")
    (node.sysfs.root / "class" / "infiniband").mkdir()
    got = read(node)
    nvlink = got["nvlink_up", "gpu:0"]
    assert nvlink.value == 0
    assert nvlink.evidence == NO_NVLINK
    for check in ("ib_port", "nic_firmware", "nic_pcie_link"):
        assert got[check, "node"].error == NO_HCA
