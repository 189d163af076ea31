"""A read that fails at every poll is logged once, and once more when it reads again.

Seen on a real H100 node (the standing GPU check): a GPU whose PCI function is missing from the
sysfs tree logged ``pcie_read_failed`` at every poll, hundreds of lines a minute.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

from structlog.testing import capture_logs

from agent.findings import PollResult
from agent.poll_pcie import PciePoller
from agent.sampler import Sampler
from agent.sim.hardware import SimNode
from agent.sources.nvml import GpuIdentity, NvmlSource
from agent.sources.pci_sysfs import PciSysfsReader
from agent.sources.sysfs import SysfsReader
from fleetwatch.model import Target
from fleetwatch.testing import FakeClock
from rules.xid_catalog import load_catalog

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs" / "h100-cx7"


def test_a_missing_gpu_function_is_logged_once_and_its_return_once(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE, root, symlinks=True)
    devices = root / "bus" / "pci" / "devices"
    bdf = "0000:18:00.0"
    moved = tmp_path / "away"
    (devices / bdf).rename(moved)
    poller = PciePoller(PciSysfsReader(root))
    gpu = GpuIdentity(index=0, uuid="GPU-a", pci_bus_id=bdf, model="m", nvlink_count=0)
    errors: Counter[str] = Counter()
    with capture_logs() as logs:
        for _ in range(5):
            poller.poll((gpu,), set(), PollResult(), errors)
        moved.rename(devices / bdf)
        result = PollResult()
        for _ in range(3):
            result = PollResult()
            poller.poll((gpu,), set(), result, errors)
    events = [entry["event"] for entry in logs]
    assert events == ["pcie_read_failed", "pcie_read_failed_ended"]
    assert errors["sysfs"] == 5  # every failed read still counted
    assert result.samples  # and the GPU's link is read again


async def test_a_gpu_that_keeps_failing_its_reads_is_logged_once(tmp_path: Path) -> None:
    """NVML's Unknown Error on every call: counted at every poll, logged once, and once more
    when the GPU reads again."""
    node = SimNode("n1", tmp_path / "sys", FakeClock(), gpus=2, nvlinks=2, ib_ports=1)
    sampler = Sampler(
        nvml=NvmlSource(node.nvml),
        sysfs=SysfsReader(node.sysfs.root),
        kmsg=node.kmsg,
        udev=node.udev,
        catalog=load_catalog(),
        clock=node.clock,
        pci=PciSysfsReader(node.sysfs.root),
    )
    sampler.discover()
    gpu = Target.gpu(node.gpus[1].uuid)
    with capture_logs() as logs:
        node.gpus[1].unknown_error = True
        for _ in range(4):
            last = await sampler.poll()
        assert last.samples[gpu, "nvml_read_failures"] == 4
        node.gpus[1].unknown_error = False
        await sampler.poll()
    events = [e["event"] for e in logs if e["event"].startswith("gpu_read_failed")]
    assert events == ["gpu_read_failed", "gpu_read_failed_ended"]
