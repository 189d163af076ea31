"""A read that fails at every poll is logged once, and once more when it reads again.

Seen on a real H100 node (the standing GPU check): a GPU whose PCI function is missing from the
sysfs tree logged ``pcie_read_failed`` at every poll, hundreds of lines a minute.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

from structlog.testing import capture_logs

from agent.poll.findings import PollResult
from agent.poll.pcie import PciePoller
from agent.sources.nvml import GpuIdentity
from agent.sources.pci_sysfs import PciSysfsReader

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "sysfs" / "h100-cx7"


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
