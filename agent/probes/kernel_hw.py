"""The kernel's other hardware lines, parsed by a pure function.

Besides the GPU's Xid lines and PCIe AER reports (:mod:`agent.probes.xid`,
:mod:`agent.probes.aer`), the kernel logs faults of the rest of the node:

* CPU machine checks (``arch/x86/kernel/cpu/mce/core.c``, which prefixes its lines ``mce: `` and
  the error lines ``[Hardware Error]: ``)::

      mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 5: be00000000800400
      mce: [Hardware Error]: Machine check events logged
      mce: [Hardware Error]: Machine check: Processor context corrupt
      mce: Uncorrected hardware memory error in user-access at 3ff3a5c400
      EDAC MC1: 1 UE memory read error on CPU_SrcID#1_Ha#0_Chan#2_DIMM#0 (...)

  An error prints several ``[Hardware Error]`` lines (RIP, TSC, ADDR, PROCESSOR, "Run the above
  through 'mcelog --ascii'"); only the first of them, which names the CPU, is a finding. Its last
  number is the bank's MCi_STATUS register: bit 61 (UC) set means the hardware could not correct
  the error (Intel SDM vol. 3B 16.3.2.2; AMD's MCA_STATUS has UC at the same place), which is a
  ``machine_check_uncorrected``; so are "Processor context corrupt", the kernel's "Uncorrected
  hardware memory error", a fatal machine check's panic and EDAC's ``UE`` lines. Corrected
  errors are not printed one by one: the kernel says ``Machine check events logged``.
* Filesystem errors (``fs/ext4/super.c``, ``fs/xfs/xfs_message.c``, ``fs/btrfs/messages.c``)::

      EXT4-fs error (device nvme0n1p2): ext4_find_entry:1455: inode #2: comm ls: reading ...
      EXT4-fs (nvme0n1p2): Remounting filesystem read-only
      XFS (md0): metadata I/O error in "xfs_trans_read_buf_map" at daddr 0x1 len 1 error 5
      XFS (md0): Filesystem has been shut down due to log error (0x2).
      BTRFS error (device sdb): bdev /dev/sdb errs: wr 1, rd 0, flush 0, corrupt 0, gen 0

  and below them the disks (``block/blk-core.c``, ``drivers/md/raid*.c``): an I/O error on a
  device, or a RAID array that dropped a member::

      I/O error, dev nvme1n1, sector 1953525120 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 0
      md/raid1:md0: Disk failure on nvme1n1p1, disabling device.

* NVSwitch errors from NVIDIA's nvswitch driver: ``nvidia-nvswitchN: SXid (PCI:<bdf>): <sxid>,
  Fatal|Non-fatal, <what>``, followed by lines of the same SXid with ``Severity ...`` or
  ``Data {...}`` (continuations, not findings).
* The outcome of PCIe error recovery (``drivers/pci/pcie/err.c``, ``aer.c``; ``AER: `` in front
  on kernels since 5.0)::

      nvidia 0000:18:00.0: AER: can't recover (no error_detected callback)
      pcieport 0000:15:01.0: AER: Root Port link has been reset (0)
      pcieport 0000:15:01.0: AER: subordinate device reset failed
      pcieport 0000:15:01.0: AER: device recovery failed
      pcieport 0000:15:01.0: AER: device recovery successful

:func:`parse_hw_line` turns one line into a :class:`HwLine`, or None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from agent.probes.pci import normalize_bus_id
from fleetwatch.model import EventKind
from fleetwatch.wire.validate import DEVICE_NAME, MAX_DETAIL

__all__ = ["AerOutcome", "HwLine", "parse_hw_line"]


class AerOutcome(StrEnum):
    """How PCIe error recovery ended, or a step of it."""

    NO_DRIVER = "no AER-aware driver"  # the device's driver has no error handlers
    LINK_RESET = "link reset"  # the port above reset the link
    RESET_FAILED = "reset failed"  # the devices below did not come back after the reset
    FAILED = "recovery failed"
    RECOVERED = "recovered"

    @property
    def unrecovered(self) -> bool:
        """True when the device is left out of service (until a reboot or a rescan)."""
        return self in _UNRECOVERED


_UNRECOVERED: Final = frozenset({AerOutcome.NO_DRIVER, AerOutcome.RESET_FAILED, AerOutcome.FAILED})


@dataclass(frozen=True, slots=True)
class HwLine:
    """One hardware finding of the kernel log.

    ``kind`` is the event it becomes. ``device`` names the component: ``cpu12`` for a machine
    check that names its CPU, the block device of a filesystem, a PCI bus id (normalised) for
    an SXid or a recovery outcome; "" when the line names none. ``code`` is the SXid; ``outcome``
    the recovery step of a :attr:`EventKind.PCIE_AER_UNRECOVERED` line (which is that event's
    kind only when the outcome is :attr:`AerOutcome.unrecovered`; the other outcomes are only
    attached to their AER report).
    """

    kind: EventKind
    device: str
    text: str
    code: int = 0
    outcome: AerOutcome | None = None


_BDF: Final = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
_MCE_CPU: Final = re.compile(
    r"\[Hardware Error\]: CPU (\d{1,5}): Machine Check(?: Exception)?:"
    r"(?: [0-9A-Fa-f]{1,16} Bank \d{1,3}: ([0-9A-Fa-f]{1,16})\b)?"
)
_MCI_STATUS_UC: Final = 1 << 61  # MCi_STATUS: the error was not corrected
_MCE_LOGGED: Final = re.compile(r"Machine check events logged")
_MCE_FATAL: Final = re.compile(
    r"mce: \[Hardware Error\]: Machine check: (.+)|Kernel panic - not syncing: Fatal machine check"
    r"|mce: Uncorrected hardware memory error"
)
_EDAC_UE: Final = re.compile(r"EDAC (MC\d{1,4}): \d+ UE ")
_EXT_ERROR: Final = re.compile(r"EXT[234]-fs error \(device ([^)\s]{1,64})\)")
_EXT_COUNT: Final = re.compile(r"EXT[234]-fs \(([^)\s]{1,64})\): error count since last fsck")
_EXT_RO: Final = re.compile(r"EXT[234]-fs \(([^)\s]{1,64})\): Remounting filesystem read-only")
_JBD2_ABORT: Final = re.compile(r"Aborting journal on device ([^\s.]{1,64}?)(?:-\d+)?\.?$")
_XFS: Final = re.compile(r"XFS \(([^)\s]{1,64})\): (.*)")
_XFS_SHUTDOWN: Final = re.compile(
    r"[Ff]ilesystem has been shut down|Shutting down filesystem|xfs_do_force_shutdown"
)
_XFS_ERROR: Final = re.compile(
    r"[Cc]orruption|I/O [Ee]rror|[Ii]nternal error|xfs_repair|writeback error|log error"
)
_BTRFS: Final = re.compile(r"BTRFS (?:error|critical|crit) \(device ([^)\s]{1,64})\)")
_BLOCK_IO: Final = re.compile(r"(?:blk_update_request: )?I/O error, dev ([^,\s]{1,64}), sector")
_MD_FAILURE: Final = re.compile(r"md/raid\d*:(md[\w-]{1,60}): Disk failure on ")
_BTRFS_RO: Final = re.compile(r"BTRFS.*\(device ([^)\s]{1,64})\).*forced readonly")
_SXID: Final = re.compile(
    rf"nvidia-nvswitch\d+: SXid \(PCI:({_BDF})\): (\d{{1,10}}), (Fatal|Non-fatal)\b",
)
_AER_OUTCOMES: Final = (
    (re.compile(r"can't recover \(no error_detected callback\)"), AerOutcome.NO_DRIVER),
    (re.compile(r"device has no AER-aware driver"), AerOutcome.NO_DRIVER),  # kernels before 5.2
    (re.compile(r"(?:Root|Downstream) Port link has been reset"), AerOutcome.LINK_RESET),
    (re.compile(r"subordinate device reset failed"), AerOutcome.RESET_FAILED),
    (re.compile(r"[Dd]evice recovery failed"), AerOutcome.FAILED),
    (re.compile(r"[Dd]evice recovery successful"), AerOutcome.RECOVERED),
)
_AER_PREFIX: Final = re.compile(rf"(?:[\w.-]+ )?({_BDF}): (?:AER: )?")
# Cheap tests first: a line without any of these is none of ours (most of the log).
_MARKERS: Final = (
    "Hardware Error",
    "mce: ",
    "achine check",
    "EDAC",
    "-fs",
    "journal",
    "I/O error",
    "md/raid",
    "XFS",
    "BTRFS",
    "SXid",
    "AER",
)
_MARKERS_RECOVERY: Final = ("recover", "has been reset", "reset failed")


def _device(name: str) -> str:
    """A component name the wire can carry ("" when the kernel's is not one)."""
    return name if DEVICE_NAME.fullmatch(name) else ""


def _detail(text: str) -> str:
    return text.strip()[:MAX_DETAIL]


def parse_hw_line(text: str) -> HwLine | None:
    """Return the hardware finding in one kernel log line, or None when it holds none."""
    if not any(m in text for m in _MARKERS) and not any(m in text for m in _MARKERS_RECOVERY):
        return None
    for parse in (_machine_check, _filesystem, _sxid, _aer_outcome):
        found = parse(text)
        if found is not None:
            return found
    return None


def _machine_check(text: str) -> HwLine | None:
    if (m := _MCE_CPU.search(text)) is not None:
        uncorrected = m[2] is not None and bool(int(m[2], 16) & _MCI_STATUS_UC)
        kind = EventKind.MACHINE_CHECK_UNCORRECTED if uncorrected else EventKind.MACHINE_CHECK
        return HwLine(kind, f"cpu{int(m[1])}", _detail(text))
    if _MCE_LOGGED.search(text):
        return HwLine(EventKind.MACHINE_CHECK, "", _detail(text))
    if _MCE_FATAL.search(text):
        return HwLine(EventKind.MACHINE_CHECK_UNCORRECTED, "", _detail(text))
    if (m := _EDAC_UE.search(text)) is not None:
        return HwLine(EventKind.MACHINE_CHECK_UNCORRECTED, m[1].lower(), _detail(text))
    return None


def _filesystem(text: str) -> HwLine | None:
    if (m := _EXT_RO.search(text)) is not None:
        return HwLine(EventKind.FS_READ_ONLY, _device(m[1]), _detail(text))
    if (m := _BTRFS_RO.search(text)) is not None:
        return HwLine(EventKind.FS_READ_ONLY, _device(m[1]), _detail(text))
    for pattern in (_EXT_ERROR, _EXT_COUNT, _JBD2_ABORT, _BTRFS, _BLOCK_IO, _MD_FAILURE):
        if (m := pattern.search(text)) is not None:
            return HwLine(EventKind.FS_ERROR, _device(m[1]), _detail(text))
    if (m := _XFS.search(text)) is not None:
        if _XFS_SHUTDOWN.search(m[2]):
            return HwLine(EventKind.FS_READ_ONLY, _device(m[1]), _detail(text))
        if _XFS_ERROR.search(m[2]):
            return HwLine(EventKind.FS_ERROR, _device(m[1]), _detail(text))
    return None


def _sxid(text: str) -> HwLine | None:
    m = _SXID.search(text)
    if m is None or int(m[2]) > 0xFFFF:  # noqa: PLR2004 - SXids are five decimal digits
        return None
    kind = EventKind.SXID_FATAL if m[3] == "Fatal" else EventKind.SXID
    return HwLine(kind, normalize_bus_id(m[1]), _detail(text), code=int(m[2]))


def _aer_outcome(text: str) -> HwLine | None:
    for pattern, outcome in _AER_OUTCOMES:
        if pattern.search(text) is None:
            continue
        prefix = _AER_PREFIX.search(text)
        device = normalize_bus_id(prefix[1]) if prefix is not None else ""
        return HwLine(EventKind.PCIE_AER_UNRECOVERED, device, _detail(text), outcome=outcome)
    return None
