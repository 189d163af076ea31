"""The kernel's other hardware lines: machine checks, filesystems, SXids, AER recovery outcomes.

The lines are as the kernel and NVIDIA's nvswitch driver print them (formats from
``arch/x86/kernel/cpu/mce/core.c``, ``fs/ext4/super.c``, ``fs/xfs/xfs_message.c``,
``drivers/pci/pcie/err.c`` and ``aer.c``, and the nvswitch driver's SXid print).
"""

from pathlib import Path

import pytest

from agent.poll.sampler import Sampler
from agent.probes.kernel_hw import AerOutcome, parse_hw_line
from agent.probes.xid import parse_xid_line
from agent.sim.hardware import SimNode
from agent.testing import sim_sampler
from fleetwatch.model import EventKind, Target
from fleetwatch.testing import FakeClock

MCE_LINES = (
    "mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 5: be00000000800400",
    "mce: [Hardware Error]: RIP !INEXACT! 10:<ffffffff8167e2b5> {intel_idle+0x95/0x120}",
    "mce: [Hardware Error]: TSC 2a1b3c4d5e6f ADDR fe8c0 MISC 228aa040101086",
    "mce: [Hardware Error]: PROCESSOR 0:806f8 TIME 1764031200 SOCKET 0 APIC 18 microcode 2b000590",
    "mce: [Hardware Error]: Run the above through 'mcelog --ascii'",
)


class TestParseHwLine:
    @pytest.mark.parametrize(
        ("line", "kind", "device"),
        [
            # MCi_STATUS 0xbe...: UC (bit 61) set, as is PCC; 0x9c...: VAL, EN, MISCV, ADDRV only.
            (MCE_LINES[0], EventKind.MACHINE_CHECK_UNCORRECTED, "cpu12"),
            (
                "mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 7: 9c00000000800400",
                EventKind.MACHINE_CHECK,
                "cpu3",
            ),
            (
                "mce: [Hardware Error]: CPU 0: Machine Check Exception: 5 Bank 1: b200000000070005",
                EventKind.MACHINE_CHECK_UNCORRECTED,
                "cpu0",
            ),
            (
                "mce: [Hardware Error]: CPU 40: Machine Check: 0 Bank 16: 8c000051000800c0",
                EventKind.MACHINE_CHECK,
                "cpu40",
            ),
            ("mce: [Hardware Error]: Machine check events logged", EventKind.MACHINE_CHECK, ""),
            (
                "Kernel panic - not syncing: Fatal machine check",
                EventKind.MACHINE_CHECK_UNCORRECTED,
                "",
            ),
            ("[Hardware Error]: Machine check events logged", EventKind.MACHINE_CHECK, ""),
            (
                "mce: [Hardware Error]: Machine check: Processor context corrupt",
                EventKind.MACHINE_CHECK_UNCORRECTED,
                "",
            ),
            (
                "mce: Uncorrected hardware memory error in user-access at 3ff3a5c400",
                EventKind.MACHINE_CHECK_UNCORRECTED,
                "",
            ),
            (
                (
                    "EDAC MC1: 1 UE memory read error on CPU_SrcID#1_Ha#0_Chan#2_DIMM#0 "
                    "(channel:2 slot:0 page:0x5e1c0 offset:0x0 grain:32)"
                ),
                EventKind.MACHINE_CHECK_UNCORRECTED,
                "mc1",
            ),
            (
                (
                    "EXT4-fs error (device nvme0n1p2): ext4_find_entry:1455: inode #2: comm ls: "
                    "reading directory lblock 0"
                ),
                EventKind.FS_ERROR,
                "nvme0n1p2",
            ),
            (
                "EXT4-fs (nvme0n1p2): error count since last fsck: 7",
                EventKind.FS_ERROR,
                "nvme0n1p2",
            ),
            ("Aborting journal on device sda1-8.", EventKind.FS_ERROR, "sda1"),
            (
                "EXT4-fs (nvme0n1p2): Remounting filesystem read-only",
                EventKind.FS_READ_ONLY,
                "nvme0n1p2",
            ),
            (
                (
                    'XFS (md0): metadata I/O error in "xfs_trans_read_buf_map" at daddr 0x1 len 1 '
                    "error 5"
                ),
                EventKind.FS_ERROR,
                "md0",
            ),
            (
                "XFS (md0): Corruption detected. Unmount and run xfs_repair",
                EventKind.FS_ERROR,
                "md0",
            ),
            (
                "XFS (md0): Filesystem has been shut down due to log error (0x2).",
                EventKind.FS_READ_ONLY,
                "md0",
            ),
            (
                (
                    "BTRFS error (device sdb): bdev /dev/sdb errs: wr 1, rd 0, flush 0, corrupt 0, "
                    "gen 0"
                ),
                EventKind.FS_ERROR,
                "sdb",
            ),
            (
                "BTRFS info (device sdb): forced readonly",
                EventKind.FS_READ_ONLY,
                "sdb",
            ),
            (
                (
                    "I/O error, dev nvme1n1, sector 1953525120 op 0x1:(WRITE) flags 0x800 "
                    "phys_seg 1 prio class 0"
                ),
                EventKind.FS_ERROR,
                "nvme1n1",
            ),
            (
                (
                    "blk_update_request: I/O error, dev sda, sector 2048 op 0x0:(READ) flags 0x0 "
                    "phys_seg 1 prio class 0"
                ),
                EventKind.FS_ERROR,
                "sda",
            ),
            (
                "md/raid1:md0: Disk failure on nvme1n1p1, disabling device.",
                EventKind.FS_ERROR,
                "md0",
            ),
        ],
    )
    def test_finds_kind_and_component(self, line: str, kind: EventKind, device: str):
        found = parse_hw_line(line)
        assert found is not None
        assert (found.kind, found.device) == (kind, device)
        assert found.text == line

    @pytest.mark.parametrize(
        "line",
        [
            *MCE_LINES[1:],  # the rest of a machine check's report: not findings of their own
            "mce: CPU0: Core temperature above threshold, cpu clock throttled (total events = 1)",
            "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
            "EXT4-fs warning (device sda1): ext4_dx_add_entry:2412: Directory index full!",
            "XFS (md0): Mounting V5 Filesystem",
            "XFS (md0): Ending clean mount",
            (
                "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine instance 32 "
                "Sub-engine instance 00"
            ),
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Data {0x00000000, 0x00000000}",
            "pcieport 0000:15:01.0: AER: broadcast error_detected message",
            "NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=python, Graphics Exception",
            "",
        ],
    )
    def test_other_lines_are_not_findings(self, line: str):
        assert parse_hw_line(line) is None

    def test_sxid_names_the_nvswitch_and_its_severity(self):
        line = "nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
        fatal = parse_hw_line(line)
        assert fatal is not None
        assert (fatal.kind, fatal.device, fatal.code) == (
            EventKind.SXID_FATAL,
            "0000:08:00.0",
            20034,
        )
        nonfatal = parse_hw_line(
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress "
            "non-posted PRIV error (First)"
        )
        assert nonfatal is not None
        assert (nonfatal.kind, nonfatal.code) == (EventKind.SXID, 12028)

    @pytest.mark.parametrize(
        ("line", "outcome", "device"),
        [
            (
                "nvidia 0000:18:00.0: AER: can't recover (no error_detected callback)",
                AerOutcome.NO_DRIVER,
                "0000:18:00.0",
            ),
            (
                "pcieport 0000:15:01.0: AER: Root Port link has been reset (-25)",
                AerOutcome.LINK_RESET,
                "0000:15:01.0",
            ),
            (
                "pcieport 0000:00:03.1: Root Port link has been reset",  # before 5.0: no AER:
                AerOutcome.LINK_RESET,
                "0000:00:03.1",
            ),
            (
                "pcieport 0000:15:01.0: AER: subordinate device reset failed",
                AerOutcome.RESET_FAILED,
                "0000:15:01.0",
            ),
            (
                "pcieport 0000:15:01.0: AER: device recovery failed",
                AerOutcome.FAILED,
                "0000:15:01.0",
            ),
            (
                "pcieport 0000:00:03.1: AER: Device recovery failed",
                AerOutcome.FAILED,
                "0000:00:03.1",
            ),
            (
                "pcieport 0000:15:01.0: AER: device recovery successful",
                AerOutcome.RECOVERED,
                "0000:15:01.0",
            ),
        ],
    )
    def test_aer_recovery_outcomes(self, line: str, outcome: AerOutcome, device: str):
        found = parse_hw_line(line)
        assert found is not None
        assert (found.outcome, found.device) == (outcome, device)
        assert found.outcome is not None
        assert found.outcome.unrecovered == (
            outcome in {AerOutcome.NO_DRIVER, AerOutcome.RESET_FAILED, AerOutcome.FAILED}
        )


class TestOlderXidForm:
    def test_bus_id_without_pci_tag(self):
        """Drivers before the ``PCI:`` tag printed the bus id alone in the parenthesis."""
        line = parse_xid_line("NVRM: Xid (0000:03:00): 13, 0002 00000000 000090c0 00001b0c")
        assert line is not None
        assert (line.pci_bus_id, line.xid) == ("0000:03:00.0", 13)

    def test_current_form_still_parses(self):
        line = parse_xid_line(
            "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen "
            "off the bus."
        )
        assert line is not None
        assert (line.pci_bus_id, line.xid) == ("0000:91:00.0", 79)


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode("node-a", tmp_path / "sys", FakeClock(), gpus=4, nvlinks=2, ib_ports=2)


@pytest.fixture
def sampler(node: SimNode) -> Sampler:
    return sim_sampler(node)


class TestKernelLogPoller:
    async def test_a_machine_check_report_is_one_event_naming_its_cpu(
        self, sampler: Sampler, node: SimNode
    ):
        await sampler.poll()
        for line in MCE_LINES:
            node.kmsg.write(line, level=0)
        events = sampler.poll_events().events
        assert [(e.kind, e.target) for e in events] == [
            (EventKind.MACHINE_CHECK_UNCORRECTED, Target.node_device("cpu12")),
        ]
        assert events[0].detail == MCE_LINES[0]

    async def test_a_failing_disk_is_one_event_per_kind_and_device_a_poll(
        self, sampler: Sampler, node: SimNode
    ):
        await sampler.poll()
        for block in (1, 2, 3):
            node.kmsg.write(
                f"EXT4-fs error (device nvme0n1p2): ext4_find_entry:1455: inode #{block}: "
                "comm python: reading directory lblock 0",
                level=2,
            )
        node.kmsg.write("Aborting journal on device nvme0n1p2-8.", level=2)
        node.kmsg.write("EXT4-fs (nvme0n1p2): Remounting filesystem read-only", level=2)
        events = sampler.poll_events().events
        where = Target.node_device("nvme0n1p2")
        assert [(e.kind, e.target) for e in events] == [
            (EventKind.FS_ERROR, where),
            (EventKind.FS_READ_ONLY, where),
        ]
        assert events[0].detail.endswith("(4 lines)")

    async def test_sxids_name_their_nvswitch_and_number(self, sampler: Sampler, node: SimNode):
        await sampler.poll()
        node.kmsg.write(
            "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
            level=3,
        )
        node.kmsg.write(
            "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Severity 1 Engine instance 48 "
            "Sub-engine instance 00",
            level=3,
        )
        node.kmsg.write(
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress "
            "non-posted PRIV error (First)",
            level=3,
        )
        events = sampler.poll_events().events
        assert [(e.kind, e.target, e.xid) for e in events] == [
            (EventKind.SXID_FATAL, Target.pci("0000:06:00.0"), 20034),
            (EventKind.SXID, Target.pci("0000:05:00.0"), 12028),
        ]

    async def test_failed_recovery_is_attached_to_its_aer_report(
        self, sampler: Sampler, node: SimNode
    ):
        """The outcome lines name the ports; the event names the GPU the report was about."""
        await sampler.poll()
        gpu = node.gpus[1]
        bdf = gpu.sysfs_bus_id
        root = node.pcie_paths[1][0]
        for line in (
            f"pcieport {root}: AER: Uncorrected (Non-Fatal) error received: {bdf}",
            (
                f"nvidia {bdf}: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
                "type=Transaction Layer, (Requester ID)"
            ),
            f"nvidia {bdf}:   device [10de:2330] error status/mask=00004000/00000000",
            f"nvidia {bdf}:    [14] CmpltTO                (First)",
            f"nvidia {bdf}: AER: can't recover (no error_detected callback)",
            f"pcieport {root}: AER: Root Port link has been reset (0)",
            f"pcieport {root}: AER: device recovery failed",
        ):
            node.kmsg.write(line, level=3)
        events = sampler.poll_events().events
        target = Target.gpu(gpu.uuid)
        assert [(e.kind, e.target) for e in events] == [
            (EventKind.PCIE_AER, target),
            (EventKind.PCIE_AER_UNRECOVERED, target),
        ]
        assert "recovery: no AER-aware driver; link reset; recovery failed" in events[0].detail
        assert "can't recover" in events[1].detail
        assert "CmpltTO" in events[1].detail

    async def test_an_outcome_in_a_later_poll_finds_its_report(
        self, sampler: Sampler, node: SimNode
    ):
        await sampler.poll()
        gpu = node.gpus[2]
        bdf = gpu.sysfs_bus_id
        node.kmsg.write(
            f"nvidia {bdf}: PCIe Bus Error: severity=Uncorrected (Fatal), "
            "type=Transaction Layer, (Receiver ID)",
            level=3,
        )
        first = sampler.poll_events().events
        assert [e.kind for e in first] == [EventKind.PCIE_AER]
        node.kmsg.write("pcieport 0000:00:01.0: AER: subordinate device reset failed", level=3)
        node.kmsg.write("pcieport 0000:00:01.0: AER: device recovery failed", level=3)
        later = sampler.poll_events().events
        assert [(e.kind, e.target) for e in later] == [
            (EventKind.PCIE_AER_UNRECOVERED, Target.gpu(gpu.uuid)),
        ]
        node.kmsg.write("pcieport 0000:00:01.0: AER: device recovery failed", level=3)
        stray = sampler.poll_events().events  # that recovery is over: a stray line names the port
        assert [(e.kind, e.target) for e in stray] == [
            (EventKind.PCIE_AER_UNRECOVERED, Target.pci("0000:00:01.0")),
        ]

    async def test_a_successful_recovery_is_no_fault(self, sampler: Sampler, node: SimNode):
        await sampler.poll()
        bdf = node.gpus[0].sysfs_bus_id
        node.kmsg.write(
            f"nvidia {bdf}: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
            "type=Transaction Layer, (Requester ID)",
            level=3,
        )
        node.kmsg.write("pcieport 0000:00:01.0: AER: device recovery successful", level=3)
        events = sampler.poll_events().events
        assert [e.kind for e in events] == [EventKind.PCIE_AER]
        assert events[0].detail.endswith("recovery: recovered")

    async def test_the_older_xid_form_reaches_its_gpu(self, sampler: Sampler, node: SimNode):
        await sampler.poll()
        gpu = node.gpus[3]
        short = gpu.sysfs_bus_id.rsplit(".", 1)[0]
        node.kmsg.write(f"NVRM: Xid ({short}): 13, 0002 00000000 000090c0 00001b0c", level=3)
        events = sampler.poll_events().events
        assert [(e.kind, e.target, e.xid) for e in events] == [
            (EventKind.XID, Target.gpu(gpu.uuid), 13),
        ]
