"""Fakes for testing the agent's parts: a sampler reading a simulated node through the real sources.

The simulated hardware (``agent/sim/``) is the fake; this module only puts the real readers on it,
as :mod:`fleetwatch.testing` holds the fake clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.poll.sampler import Sampler
from agent.sources.nvml import NvmlSource
from agent.sources.pci_sysfs import PciSysfsReader
from agent.sources.sysfs import SysfsReader
from rules.xid_catalog import load_catalog

if TYPE_CHECKING:
    from agent.sim.hardware import SimNode


def sim_sampler(node: SimNode, *, pci: bool = True, counter_interval_s: float = 1.0) -> Sampler:
    """A discovered sampler over ``node``'s NVML, sysfs, kernel log and udev (and PCI sysfs)."""
    sampler = Sampler(
        nvml=NvmlSource(node.nvml),
        sysfs=SysfsReader(node.sysfs.root),
        kmsg=node.kmsg,
        udev=node.udev,
        catalog=load_catalog(),
        clock=node.clock,
        pci=PciSysfsReader(node.sysfs.root) if pci else None,
        counter_interval_s=counter_interval_s,
    )
    sampler.discover()
    return sampler
