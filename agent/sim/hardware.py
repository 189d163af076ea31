"""A simulated GPU node: the state behind the simulated NVML library, sysfs tree, kmsg and udev.

Faults change this state *and* leave the evidence the real fault leaves in every source it would
touch: an Xid 79 writes the driver's kernel log line and makes every NVML call on that GPU raise
GPU-lost; an IB port going down changes ``state``/``phys_state`` and bumps ``link_downed``.
"""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.sim.kmsg import SimKmsg
from agent.sim.nvml_lib import EVENT_XID, SimNvmlLibrary
from agent.sim.sysfs_tree import SimSysfsTree
from agent.sim.udev import SimUdev
from agent.sources.udev import UdevEvent

if TYPE_CHECKING:
    from pathlib import Path

    from fleetwatch.clock import Clock

# Bus numbers of the eight GPUs on a typical HGX H100 board.
H100_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
H100_MODEL = "NVIDIA H100 80GB HBM3"
H100_NVLINKS = 18
NDR_RATE = "400 Gb/sec (4X NDR)"
LINK_DOWNED_MAX = 255  # 8-bit counter; IB error counters saturate, they do not wrap


@dataclass(slots=True)
class SimGpu:
    """One simulated GPU: what NVML would report about it."""

    index: int
    uuid: str
    bus: int
    model: str = H100_MODEL
    nvlink_up: list[bool] = field(default_factory=lambda: [True] * H100_NVLINKS)
    # Per link: DL replay, DL recovery, DL CRC error counters (they only grow).
    nvlink_errors: list[list[int]] = field(default_factory=list)
    pcie_replays: int = 0
    pcie_gen: int = 5
    pcie_width: int = 16
    max_pcie_gen: int = 5
    max_pcie_width: int = 16
    ecc_sbe_volatile: int = 0
    ecc_dbe_volatile: int = 0
    ecc_sbe_aggregate: int = 0
    ecc_dbe_aggregate: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    clock_event_reasons: int = 0
    temperature_c: int = 41
    power_mw: int = 118_000
    util_gpu: int = 0
    util_mem: int = 0
    sm_clock_mhz: int = 1980
    lost: bool = False
    # Capabilities this GPU lacks, by NVML field id or pynvml function name (architecture quirks).
    unsupported: set[int | str] = field(default_factory=set)

    def __post_init__(self) -> None:
        """Give every link its error counters."""
        if not self.nvlink_errors:
            self.nvlink_errors = [[0, 0, 0] for _ in self.nvlink_up]

    @property
    def nvml_bus_id(self) -> str:
        """The bus id as NVML prints it: 8-digit domain, uppercase."""
        return f"00000000:{self.bus:02X}:00.0"

    @property
    def kernel_bus_id(self) -> str:
        """The bus id as the driver's Xid lines print it: 4-digit domain, no function."""
        return f"0000:{self.bus:02x}:00"


@dataclass(slots=True)
class SimIbPort:
    """One simulated InfiniBand port."""

    device: str
    port: int = 1
    state: str = "ACTIVE"
    phys_state: str = "LinkUp"
    link_downed: int = 0


_STATE_CODES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
_PHYS_CODES = {"Sleep": 1, "Polling": 2, "Disabled": 3, "LinkUp": 5, "LinkErrorRecovery": 6}


def _stable_uuid(*parts: str) -> str:
    digest = hashlib.sha256("/".join(parts).encode()).digest()[:16]
    return str(uuidlib.UUID(bytes=digest))


class SimNode:
    """An 8-GPU, 8-port node whose sources are simulated but read by the real source code."""

    def __init__(  # noqa: PLR0913 - shape of the simulated node
        self,
        name: str,
        sysfs_root: Path,
        clock: Clock,
        *,
        gpus: int = 8,
        nvlinks: int = H100_NVLINKS,
        ib_ports: int = 8,
    ) -> None:
        """Build the node and write its sysfs tree under ``sysfs_root``."""
        self.name = name
        self.boot_id = _stable_uuid(name, "boot")
        self.clock = clock
        self.gpus = [
            SimGpu(
                index=i,
                uuid=f"GPU-{_stable_uuid(name, 'gpu', str(i))}",
                bus=H100_BUSES[i % len(H100_BUSES)] + i // len(H100_BUSES),
                nvlink_up=[True] * nvlinks,
            )
            for i in range(gpus)
        ]
        self.ib_ports = [SimIbPort(device=f"mlx5_{i}") for i in range(ib_ports)]
        self.nvml = SimNvmlLibrary(self)
        self.kmsg = SimKmsg(clock)
        self.udev = SimUdev()
        self.sysfs = SimSysfsTree(sysfs_root)
        for port in self.ib_ports:
            self._write_port(port)

    def _write_port(self, port: SimIbPort) -> None:
        self.sysfs.write_ib_port(
            port.device,
            port.port,
            state=f"{_STATE_CODES[port.state]}: {port.state}",
            phys_state=f"{_PHYS_CODES[port.phys_state]}: {port.phys_state}",
            rate=NDR_RATE,
            link_layer="InfiniBand",
            counters={"link_downed": port.link_downed},
        )

    # ---- faults -------------------------------------------------------------------------------

    def xid(self, gpu: int, xid: int, message: str = "") -> None:
        """The driver reports an Xid on ``gpu``; Xid 79 also takes the GPU off the bus."""
        g = self.gpus[gpu]
        if xid == 79:  # noqa: PLR2004 - Xid 79: fallen off the bus
            g.lost = True
            message = message or "GPU has fallen off the bus."
        text = message or "Graphics Exception"
        self.kmsg.write(
            f"NVRM: Xid (PCI:{g.kernel_bus_id}): {xid}, pid='<unknown>', name=<unknown>, {text}",
        )
        self.nvml.post(g, EVENT_XID, xid)

    def pci_remove(self, gpu: int) -> None:
        """The kernel removes the GPU's PCI function (hot remove or failed recovery)."""
        g = self.gpus[gpu]
        g.lost = True
        bus_id = f"0000:{g.bus:02x}:00.0"
        self.udev.push(UdevEvent("remove", "pci", bus_id, {"PCI_SLOT_NAME": bus_id}))

    def nvlink_down(self, gpu: int, link: int) -> None:
        """One NVLink of ``gpu`` goes down."""
        self.gpus[gpu].nvlink_up[link] = False

    def nvlink_up(self, gpu: int, link: int) -> None:
        """One NVLink of ``gpu`` comes back."""
        self.gpus[gpu].nvlink_up[link] = True

    def pcie_replays(self, gpu: int, count: int) -> None:
        """The GPU's PCIe link replays ``count`` more TLPs (the counter only grows)."""
        self.gpus[gpu].pcie_replays += max(count, 0)

    def ib_port_down(self, port: int) -> None:
        """An IB port loses its link: DOWN/Polling, and ``link_downed`` counts it."""
        p = self.ib_ports[port]
        if p.state == "ACTIVE":
            p.link_downed = min(p.link_downed + 1, LINK_DOWNED_MAX)
        p.state, p.phys_state = "DOWN", "Polling"
        self._write_port(p)

    def ib_port_up(self, port: int) -> None:
        """An IB port trains and becomes ACTIVE again."""
        p = self.ib_ports[port]
        p.state, p.phys_state = "ACTIVE", "LinkUp"
        self._write_port(p)
