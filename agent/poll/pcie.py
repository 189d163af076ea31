"""PCIe from sysfs: link width and speed, and AER counters, of each GPU and its upstream port.

Errors often show on the link partner (the switch or root port above the GPU), so both ends are
read. A width below the maximum is a fault; a lower speed alone is not (idle links slow down).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from agent.exceptions import SourceError
from agent.poll.failure_episodes import FailureEpisodes
from fleetwatch.model import SampleKey, SampleValue, Target

if TYPE_CHECKING:
    from collections import Counter

    from agent.poll.findings import PollResult
    from agent.sources.nvml import GpuIdentity
    from agent.sources.pci_sysfs import PciFunctionStatus, PciSysfsReader

log = structlog.get_logger("agent.pcie")


def pcie_samples(target: Target, status: PciFunctionStatus) -> dict[SampleKey, SampleValue]:
    """Samples for one PCI function: link, and AER totals when the device has AER."""
    out: dict[SampleKey, SampleValue] = {}
    link = status.link
    if link.current_width is not None:
        out[target, "pcie_sysfs_link_width"] = link.current_width
    if link.max_width is not None:
        out[target, "pcie_sysfs_link_width_max"] = link.max_width
    if link.current_speed is not None:
        out[target, "pcie_sysfs_link_speed_gts"] = link.current_speed.gts
    if link.max_speed is not None:
        out[target, "pcie_sysfs_link_speed_gts_max"] = link.max_speed.gts
    out[target, "pcie_link_width_degraded"] = int(link.width_degraded)
    aer = status.aer
    if aer is not None:
        for name, counts in (
            ("aer_correctable_total", aer.correctable),
            ("aer_nonfatal_total", aer.nonfatal),
            ("aer_fatal_total", aer.fatal),
        ):
            if counts is not None:
                out[target, name] = counts.total
        for name, value in (
            ("aer_rootport_correctable_total", aer.rootport_total_err_cor),
            ("aer_rootport_nonfatal_total", aer.rootport_total_err_nonfatal),
            ("aer_rootport_fatal_total", aer.rootport_total_err_fatal),
        ):
            if value is not None:
                out[target, name] = value
    return out


class PciePoller:
    """Reads each GPU's PCI function and its upstream port every poll."""

    def __init__(self, reader: PciSysfsReader) -> None:
        """Upstream ports are found on first use and remembered."""
        self._reader = reader
        self._upstream: dict[str, str | None] = {}
        self._failures = FailureEpisodes(log, "pcie_read_failed")

    def poll(
        self,
        gpus: tuple[GpuIdentity, ...],
        lost: set[str],
        result: PollResult,
        errors: Counter[str],
    ) -> None:
        """Sample every GPU still on the bus, and the port above it."""
        for gpu in gpus:
            if gpu.uuid in lost:
                continue
            try:
                if gpu.pci_bus_id not in self._upstream:
                    self._upstream[gpu.pci_bus_id] = self._reader.upstream_port(gpu.pci_bus_id)
                status = self._reader.function_status(gpu.pci_bus_id)
                result.samples.update(pcie_samples(Target.gpu(gpu.uuid), status))
                errors["sysfs"] += status.read_errors
                upstream = self._upstream[gpu.pci_bus_id]
                if upstream is not None:
                    port = self._reader.function_status(upstream)
                    result.samples.update(pcie_samples(Target.pci(upstream), port))
                    errors["sysfs"] += port.read_errors
            except SourceError as exc:
                errors["sysfs"] += 1
                self._failures.failed(gpu.uuid, str(exc), gpu_uuid=gpu.uuid)
            else:
                self._failures.succeeded(gpu.uuid, gpu_uuid=gpu.uuid)
