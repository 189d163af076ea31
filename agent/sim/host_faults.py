"""Simulated faults beyond GPUs and ports: the kernel's other lines, NIC PCIe, RoCE GIDs.

Each leaves what the real fault leaves: the kernel's lines in the kernel's words (formats in
:mod:`agent.probes.kernel_hw`), sysfs files in the kernel's formats. The scenario file's
``mce``, ``fs_error``, ``fs_read_only``, ``sxid``, ``sxid_fatal``, ``aer_unrecovered``,
``nic_pcie_downgrade`` and ``roce_gid_missing`` faults play them (docs/scenarios.md).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

from agent.probes.pci import normalize_bus_id
from agent.sim.kmsg import LEVEL_ERR

if TYPE_CHECKING:
    from agent.sim.hardware import SimNode

# An HGX H100 board's four NVSwitches (the bus ids their SXid lines name).
NVSWITCH_BUSES: Final = ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0")
PCIE_SPEEDS: Final = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe",
                      4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe", 6: "64.0 GT/s PCIe"}  # fmt: skip
LEVEL_EMERG: Final = 0
LEVEL_CRIT: Final = 2
# A RoCE port's default GIDs: link-local (v1 and v2); an IPv4-mapped address (v1 and v2).
_LINK_LOCAL: Final = "fe80:0000:0000:0000:0a88:66ff:fe1b:2c40"
_IPV4: Final = "0000:0000:0000:0000:0000:ffff:0a00:{:04x}"
_UNUSED: Final = "0000:0000:0000:0000:0000:0000:0000:0000"
_GID_TABLE: Final = 16


def machine_check(node: SimNode, cpu: int, *, uncorrected: bool = False) -> None:
    """A CPU reports an error its machine-check bank logged (the kernel survives it).

    Corrected: MCi_STATUS 0x9c00... (valid, enabled, misc and address valid); uncorrected: bit
    61 (UC) set too, 0xbc00... (an uncorrected error the kernel recovered from, as a poisoned
    page it took away: no context corrupt, so no panic).
    """
    if not 0 <= cpu < 4096:  # noqa: PLR2004 - more CPUs than any node has
        msg = f"no CPU {cpu}"
        raise IndexError(msg)
    status = "bc00000000800400" if uncorrected else "9c00000000800400"
    for line in (
        f"mce: [Hardware Error]: CPU {cpu}: Machine Check: 0 Bank 5: {status}",
        "mce: [Hardware Error]: TSC 2a1b3c4d5e6f ADDR fe8c0 MISC 228aa040101086",
        (
            f"mce: [Hardware Error]: PROCESSOR 0:806f8 TIME 1764031200 SOCKET {cpu // 56} "
            f"APIC {cpu * 2} microcode 2b000590"
        ),
        "mce: [Hardware Error]: Run the above through 'mcelog --ascii'",
    ):
        node.kmsg.write(line, level=LEVEL_EMERG)


def fs_error(node: SimNode, device: str, *, read_only: bool) -> None:
    """ext4 finds a corrupt directory on ``device``.

    With ``read_only`` it also aborts the journal and remounts the filesystem read-only
    (``errors=remount-ro``, Ubuntu's default).
    """
    node.kmsg.write(
        f"EXT4-fs error (device {device}): ext4_find_entry:1455: inode #2: comm python3: "
        "reading directory lblock 0",
        level=LEVEL_CRIT,
    )
    if read_only:
        node.kmsg.write(f"Aborting journal on device {device}-8.", level=LEVEL_CRIT)
        node.kmsg.write(f"EXT4-fs ({device}): Remounting filesystem read-only", level=LEVEL_CRIT)


def sxid(node: SimNode, switch: int, code: int, *, fatal: bool) -> None:
    """NVSwitch ``switch`` (0-3) reports SXid ``code`` on a link, in the driver's two lines."""
    bus = NVSWITCH_BUSES[switch]
    name = f"nvidia-nvswitch{switch}"
    severity = "Fatal" if fatal else "Non-fatal"
    node.kmsg.write(f"{name}: SXid (PCI:{bus}): {code}, {severity}, Link 30 LTSSM Fault Up")
    node.kmsg.write(
        f"{name}: SXid (PCI:{bus}): {code}, Severity {int(fatal)} Engine instance 30 "
        "Sub-engine instance 00",
    )


def aer_unrecovered(node: SimNode, gpu: int) -> None:
    """An uncorrectable completion timeout on the GPU's link that error recovery cannot clear.

    The driver has no error handlers, the port resets the link and recovery fails: the device
    stays out of service.
    """
    g = node.gpus[gpu]
    bdf = g.sysfs_bus_id
    path = node.pcie_paths.get(gpu)
    root = path[-1] if path else "0000:00:01.0"
    if path:
        node.sysfs.add_aer_errors(bdf, "nonfatal", {"CmpltTO": 1})
    for line in (
        f"pcieport {root}: AER: Uncorrected (Non-Fatal) error received: {bdf}",
        (
            f"nvidia {bdf}: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction "
            "Layer, (Requester ID)"
        ),
        f"nvidia {bdf}:   device [10de:2330] error status/mask=00004000/00000000",
        f"nvidia {bdf}:    [14] CmpltTO                (First)",
        f"nvidia {bdf}: AER: can't recover (no error_detected callback)",
        f"pcieport {root}: AER: Root Port link has been reset (0)",
        f"pcieport {root}: AER: device recovery failed",
    ):
        node.kmsg.write(line, level=LEVEL_ERR)


def gpu_unknown_error(node: SimNode, gpu: int) -> None:
    """The driver can no longer talk to the GPU: every NVML call on it answers Unknown Error."""
    node.gpus[gpu].unknown_error = True


def hca_function(node: SimNode, port: int) -> str:
    """The PCI function of the port's HCA, made (on a root bus of its own) if it has none."""
    device = node.ib_ports[port].device
    link = node.sysfs.root / "class" / "infiniband" / device / "device"
    if link.is_symlink():
        return normalize_bus_id(link.readlink().name)
    bdf = f"0002:{0x10 + port:02x}:00.0"
    base = node.sysfs.write_pci_function(bdf, host_bridge=f"pci0002:{0x10 + port:02x}")
    link.symlink_to(os.path.relpath(base, link.parent))
    return bdf


def nic_pcie_downgrade(node: SimNode, port: int, *, gen: int, width: int) -> None:
    """The port's NIC retrains its PCIe link slower or narrower (its maximum stays)."""
    bdf = hca_function(node, port)
    node.sysfs.set_pci_link(bdf, speed=PCIE_SPEEDS.get(gen, PCIE_SPEEDS[5]), width=width)


def write_gids(node: SimNode, port: int, *, roce_v2: bool) -> None:
    """Make the port RoCE (link layer Ethernet) and write its GID table.

    The default entries are there; the RoCE v2 ones only with ``roce_v2`` (they go when the
    interface loses its address).
    """
    p = node.ib_ports[port]
    base = node.sysfs.root / "class" / "infiniband" / p.device / "ports" / str(p.port)
    (base / "link_layer").write_text("Ethernet\n", "ascii")
    (base / "gids").mkdir(exist_ok=True)
    types = base / "gid_attrs" / "types"
    types.mkdir(parents=True, exist_ok=True)
    entries = {0: (_LINK_LOCAL, "IB/RoCE v1"), 2: (_IPV4.format(port + 17), "IB/RoCE v1")}
    if roce_v2:
        entries |= {1: (_LINK_LOCAL, "RoCE v2"), 3: (_IPV4.format(port + 17), "RoCE v2")}
    for i in range(_GID_TABLE):
        gid, kind = entries.get(i, (_UNUSED, ""))
        (base / "gids" / str(i)).write_text(gid + "\n", "ascii")
        if kind:
            (types / str(i)).write_text(kind + "\n", "ascii")
        else:
            (types / str(i)).unlink(missing_ok=True)  # an unused entry's type cannot be read


def roce_gid_missing(node: SimNode, port: int) -> None:
    """A RoCE port whose interface lost its address: no RoCE v2 GID is left."""
    write_gids(node, port, roce_v2=False)
