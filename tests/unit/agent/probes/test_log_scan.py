"""``fleetwatch scan``: the agent's parsers over saved dmesg, journal and syslog files.

The files under ``tests/fixtures/logs/`` are written in each tool's format (``dmesg -T``,
``journalctl -k`` in its short, short-precise and short-iso forms, an rsyslog file with other
programs' lines and the kernel's own timestamps, and a clean boot).
"""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.probes.log_scan import MAX_AER_BLOCK, LogScanner, split_prefix
from cli.scan import EXIT_CLEAN, EXIT_FAULTS, EXIT_UNREADABLE, scan
from rules.xid_catalog import load_catalog

LOGS = Path(__file__).parents[3] / "fixtures" / "logs"


def findings(name: str) -> list[tuple[str, str, str, int | None, int]]:
    out = io.StringIO()
    status = scan(
        str(LOGS / name),
        as_json=True,
        catalog_path=None,
        stdin=io.StringIO(),
        out=out,
        err=io.StringIO(),
    )
    body = json.loads(out.getvalue())
    assert status == (EXIT_FAULTS if body["findings"] else EXIT_CLEAN)
    return [
        (f["host"], f["kind"], f["component"], f["number"], f["count"]) for f in body["findings"]
    ]


class TestPrefixes:
    @pytest.mark.parametrize(
        ("raw", "when", "host"),
        [
            ("[ 1234.567890] NVRM: text", "1234.567890", ""),
            ("[Tue Nov 25 01:02:03 2026] NVRM: text", "Tue Nov 25 01:02:03 2026", ""),
            ("kern  :err   : [ 1234.567890] NVRM: text", "1234.567890", ""),
            ("Nov 25 01:02:03 gpu-01 kernel: NVRM: text", "Nov 25 01:02:03", "gpu-01"),
            (
                "Nov  5 01:02:03.123456 gpu-01 kernel: NVRM: text",
                "Nov  5 01:02:03.123456",
                "gpu-01",
            ),
            (
                "2026-11-25T01:02:03+0000 gpu-01 kernel: NVRM: text",
                "2026-11-25T01:02:03+0000",
                "gpu-01",
            ),
            (
                "2026-11-25T01:02:03.123456+00:00 gpu-01 kernel: [ 12.5] NVRM: text",
                "2026-11-25T01:02:03.123456+00:00",
                "gpu-01",
            ),
            ("6,1234,5678901,-;NVRM: text", "5.678901", ""),
            ("[ 1234.567890] gpu-01 kernel: NVRM: text", "1234.567890", "gpu-01"),
            ("NVRM: text", "", ""),  # dmesg -t: no prefix at all
            ("[Feb12 00:48] NVRM: text", "Feb12 00:48", ""),  # dmesg -H, a line with the time
            ("[  +0.000001] NVRM: text", "+0.000001", ""),  # dmesg -H, the lines after it
            ("[   36.117975][  T291] NVRM: text", "36.117975", ""),  # CONFIG_PRINTK_CALLER
            ("[    0.004000][    C3] NVRM: text", "0.004000", ""),
            ("фев 12 00:48:02 gpu-01 kernel: NVRM: text", "фев 12 00:48:02", "gpu-01"),
            ("jan. 29 20:50:17 gpu-01 kernel: NVRM: text", "jan. 29 20:50:17", "gpu-01"),
        ],
    )
    def test_each_form_leaves_the_kernel_text(self, raw: str, when: str, host: str):
        line = split_prefix(raw + "\n")
        assert line is not None
        assert (line.when, line.host, line.text) == (when, host, "NVRM: text")

    @pytest.mark.parametrize(
        "raw",
        [
            "-- Boot 0c9a6b1e3d5f4a7e8b2c1d0e9f8a7b6c --",
            "-- No entries --",
            "Nov 25 01:02:03 gpu-01 trainer[90112]: mce: [Hardware Error]: CPU 1: Machine Check",
            "[ 1234.567890] gpu-01 trainer[90112]: mce: [Hardware Error]: CPU 1: Machine Check",
            "",
        ],
    )
    def test_markers_and_other_programs_are_skipped(self, raw: str):
        assert split_prefix(raw) is None

    @pytest.mark.parametrize(
        "text",
        [
            "EDAC MC1: 1 UE memory read error on CPU_SrcID#1_Ha#0_Chan#2_DIMM#0",
            "EXT4-fs (nvme0n1p2): Remounting filesystem read-only",
            "XFS (md0): Filesystem has been shut down due to log error (0x2).",
            "nvidia 0000:18:00.0: AER: can't recover (no error_detected callback)",
        ],
    )
    def test_kernel_text_after_dmesg_time_is_not_taken_for_a_host(self, text: str):
        line = split_prefix(f"[  123.456789] {text}")
        assert line is not None
        assert (line.host, line.text) == ("", text)


class TestScanFiles:
    def test_dmesg_t(self):
        assert findings("dmesg-T.txt") == [
            ("", "pcie_aer", "0000:18:00.0", None, 1),
            ("", "xid", "0000:2a:00.0", 48, 1),
            ("", "xid", "0000:2a:00.0", 94, 1),
            ("", "pcie_aer", "0000:9d:00.0", None, 1),
            ("", "pcie_aer_unrecovered", "0000:9d:00.0", None, 2),
            ("", "machine_check", "node", None, 2),
            ("", "gpu_lost", "0000:bb:00.0", 79, 1),
        ]

    def test_journalctl_short(self):
        host = "gpu-node-17"
        assert findings("journalctl-k.txt") == [
            (host, "sxid_fatal", "0000:07:00.0", 20034, 1),
            (host, "fs_error", "nvme0n1p2", None, 4),
            (host, "fs_read_only", "nvme0n1p2", None, 1),
        ]

    def test_journalctl_short_precise(self):
        host = "gpu-node-17"
        assert findings("journalctl-k-precise.txt") == [
            (host, "machine_check", "cpu40", None, 1),  # MCi_STATUS 0xcc...: corrected
            (host, "machine_check_uncorrected", "mc1", None, 1),  # EDAC's UE
        ]

    def test_journalctl_short_iso(self):
        host = "gpu-node-17"
        assert findings("journalctl-k-iso.txt") == [
            (host, "pcie_aer", "0000:9d:00.0", None, 1),
            (host, "pcie_aer_unrecovered", "0000:9d:00.0", None, 2),
            (host, "fs_error", "md0", None, 1),
            (host, "fs_read_only", "md0", None, 1),
        ]

    def test_syslog_of_several_hosts_skips_other_programs(self):
        """A user program's line that looks like a machine check is not the kernel's."""
        assert findings("syslog") == [
            ("gpu-node-03", "gpu_lost", "0000:bb:00.0", 79, 1),
            ("gpu-node-04", "xid", "0000:3d:00.0", 13, 2),
        ]

    def test_a_clean_boot_has_no_faults(self):
        assert findings("clean-dmesg.txt") == []

    def test_the_unrecovered_aer_names_its_report(self):
        scanner = LogScanner(load_catalog())
        scanner.feed_all((LOGS / "dmesg-T.txt").read_text().splitlines())
        unrecovered = [f for f in scanner.findings() if f.kind == "pcie_aer_unrecovered"]
        assert len(unrecovered) == 1
        assert "no AER-aware driver" in unrecovered[0].detail
        assert "after AER nonfatal: transaction; CmpltTO" in unrecovered[0].detail
        assert unrecovered[0].first == "Tue Nov 25 05:02:17 2026"
        assert unrecovered[0].last == "Tue Nov 25 05:02:18 2026"


# One AER report (pcieport and its device), as each tool or kernel writes the prefix.
AER_REPORT = (
    "pcieport 0000:15:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:18:00.0",
    (
        "nvidia 0000:18:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
        "type=Transaction Layer, (Requester ID)"
    ),
    "nvidia 0000:18:00.0:   device [10de:2330] error status/mask=00004000/00000000",
    "nvidia 0000:18:00.0:    [14] CmpltTO                (First)",
)


class TestRealPrefixes:
    """AER reports pasted from real nodes, under the prefixes their tools and kernels write."""

    @pytest.mark.parametrize(
        "prefixes",
        [
            ["[Feb12 00:48] ", "[  +0.000001] ", "[  +0.000002] ", "[  +0.000002] "],
            ["[   36.117975][  T291] "] * 4,
            ["фев 12 00:48:02 gpu-01 kernel: "] * 4,
            ["jan. 29 20:50:17 gpu-01 kernel: "] * 4,
        ],
        ids=["dmesg-H", "printk-caller", "journalctl-ru", "journalctl-nl"],
    )
    def test_the_aer_report_is_found(self, prefixes: list[str]):
        scanner = LogScanner(load_catalog())
        scanner.feed_all(p + line for p, line in zip(prefixes, AER_REPORT, strict=True))
        (finding,) = scanner.findings()
        assert (finding.kind, finding.component) == ("pcie_aer", "0000:18:00.0")
        assert "CmpltTO" in finding.detail

    def test_dmesg_h_relative_lines_take_the_time_of_the_last_full_one(self):
        scanner = LogScanner(load_catalog())
        scanner.feed("[Feb12 00:48] nvidia 0000:18:00.0: AER: can't recover (no error_detected "
                     "callback)")  # fmt: skip
        scanner.feed("[  +0.250000] NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off")
        lost = [f for f in scanner.findings() if f.kind == "gpu_lost"]
        assert [(f.first, f.last) for f in lost] == [("Feb12 00:48", "Feb12 00:48")]

    def test_the_older_kernels_no_aer_aware_driver_wording_is_an_outcome(self):
        scanner = LogScanner(load_catalog())
        scanner.feed_all(f"[ 10.{i}] {line}" for i, line in enumerate(AER_REPORT))
        scanner.feed("[ 10.5] nvidia 0000:18:00.0: device has no AER-aware driver")
        unrecovered = [f for f in scanner.findings() if f.kind == "pcie_aer_unrecovered"]
        assert [f.component for f in unrecovered] == ["0000:18:00.0"]
        assert "no AER-aware driver" in unrecovered[0].detail


class TestHostileLines:
    def test_a_record_with_a_5000_digit_field_does_not_end_the_scan(self, tmp_path: Path):
        """Such a record once stopped the scan (exit 2, "cannot read") and hid the Xid 79 after
        it; it is read as text now, and everything after it is found."""
        log = tmp_path / "dmesg.txt"
        log.write_text(
            f"6,1,{'9' * 5000},-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, text\n"
            f"[ 1.0] NVRM: Xid (PCI:0000:18:00): {'7' * 5000}, pid=1, name=x, text\n"
            "[ 2.0] NVRM: Xid (PCI:0000:bb:00): 79, pid='<unknown>', GPU has fallen off the bus.\n"
        )
        out, err = io.StringIO(), io.StringIO()
        status = scan(
            str(log), as_json=True, catalog_path=None, stdin=io.StringIO(), out=out, err=err
        )
        assert status == EXIT_FAULTS
        body = json.loads(out.getvalue())
        # the record's time is no number: its Xid is read, its prefix is not taken off
        assert [(f["kind"], f["number"]) for f in body["findings"]] == [
            ("xid", 13),
            ("gpu_lost", 79),
        ]
        assert (body["unparsed_lines"], err.getvalue()) == (0, "")

    def test_control_characters_reach_the_terminal_escaped(self, tmp_path: Path):
        log = tmp_path / "dmesg.txt"
        log.write_text("[ 2.0] NVRM: Xid (PCI:0000:bb:00): 1234, \x1b]0;owned\x07\x1b[2J\n")
        out = io.StringIO()
        scan(str(log), as_json=False, catalog_path=None, stdin=io.StringIO(), out=out, err=out)
        shown = out.getvalue()
        assert "\x1b" not in shown
        assert "\x07" not in shown
        assert "\\x1b]0;owned\\x07\\x1b[2J" in shown


class TestStorm:
    def test_an_aer_storm_is_read_in_bounded_blocks_and_still_counted(self):
        """A million-line AER storm in a row is folded a block at a time, each report counted."""
        scanner = LogScanner(load_catalog())
        report = (
            "[  100.000001] pcieport 0000:15:01.0: AER: Corrected error received: 0000:18:00.0",
            (
                "[  100.000002] nvidia 0000:18:00.0: PCIe Bus Error: severity=Corrected, "
                "type=Physical Layer, (Receiver ID)"
            ),
            (
                "[  100.000003] nvidia 0000:18:00.0:   device [10de:2330] error status/mask="
                "00000001/0000e000"
            ),
            "[  100.000004] nvidia 0000:18:00.0:    [ 0] RxErr                  (First)",
        )
        reports = 3_000  # 12,000 lines: two blocks
        scanner.feed_all(line for _ in range(reports) for line in report)
        assert scanner._block is not None
        assert len(scanner._block.lines) <= MAX_AER_BLOCK
        (finding,) = scanner.findings()
        assert (finding.kind, finding.component) == ("pcie_aer", "0000:18:00.0")
        assert finding.count == reports


class TestCommand:
    def run(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", "scan", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )

    def test_table_from_standard_input_exits_1(self):
        done = self.run("-", stdin=(LOGS / "journalctl-k.txt").read_text())
        assert done.returncode == EXIT_FAULTS
        lines = done.stdout.splitlines()
        assert lines[0].split() == [
            "FIRST", "LAST", "COUNT", "HOST", "KIND", "COMPONENT", "DETAIL",
        ]  # fmt: skip
        assert "sxid_fatal 20034" in lines[1]
        assert lines[-1] == "3 faults (6 lines) in 12 lines"

    def test_clean_file_exits_0(self):
        done = self.run(str(LOGS / "clean-dmesg.txt"))
        assert (done.returncode, done.stdout) == (EXIT_CLEAN, "no hardware faults in 8 lines\n")

    def test_unreadable_file_exits_2_naming_it(self, tmp_path: Path):
        done = self.run(str(tmp_path / "missing.log"))
        assert done.returncode == EXIT_UNREADABLE
        assert "cannot read" in done.stderr
        assert "missing.log" in done.stderr

    def test_help_says_what_the_exit_status_means(self):
        done = self.run("--help")
        assert "exit status: 0 no fault found, 1 faults found, 2" in done.stdout
        assert "logger -t kernel" in done.stdout  # a syslog file's kernel lines may be forged
