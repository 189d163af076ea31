from pathlib import Path

import pytest

from agent.probes.pci import normalize_bus_id
from agent.probes.xid import parse_xid_line
from rules.exceptions import CatalogError
from rules.xid_catalog import load_catalog, parse_catalog


class TestParseXidLine:
    @pytest.mark.parametrize(
        ("line", "bus", "xid"),
        [
            (
                (
                    "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, "
                    "GPU has fallen off the bus."
                ),
                "0000:91:00.0",
                79,
            ),
            (
                "NVRM: Xid (PCI:0000:1b:00): 13, pid=2312, name=python3, Graphics SM Warp",
                "0000:1b:00.0",
                13,
            ),
            (
                "NVRM: Xid (PCI:0000:3a:00 GPU-I:01 GPU-CI:00): 31, pid=77, name=train, MMU Fault",
                "0000:3a:00.0",
                31,
            ),
            (
                "NVRM: Xid (PCI:0000:5d:00): 48, An uncorrectable double bit error",
                "0000:5d:00.0",
                48,
            ),
        ],
    )
    def test_every_driver_format(self, line, bus, xid):
        """Current, MIG and pre-pid formats all give bus id and Xid number."""
        parsed = parse_xid_line(line)
        assert parsed is not None
        assert (parsed.pci_bus_id, parsed.xid) == (bus, xid)
        assert parsed.text == line

    @pytest.mark.parametrize(
        "line",
        [
            "NVRM: GPU at PCI:0000:91:00: GPU-4f1a2b3c-0000-1111-2222-333344445555",
            "NVRM: Xid (PCI:0000:91:00",
            "nvidia 0000:17:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer",
            "",
        ],
    )
    def test_other_lines_are_not_xids(self, line):
        """Announcements, truncated lines and AER lines are not Xid events."""
        assert parse_xid_line(line) is None


class TestNormalizeBusId:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("00000000:1B:00.0", "0000:1b:00.0"),
            ("0000:1b:00", "0000:1b:00.0"),
            ("0000:1b:00.0", "0000:1b:00.0"),
            ("0001:AB:1F.3", "0001:ab:1f.3"),
        ],
    )
    def test_nvml_kernel_and_sysfs_forms_agree(self, text, expected):
        """NVML, the kernel log and sysfs name the same GPU the same way."""
        assert normalize_bus_id(text) == expected

    @pytest.mark.parametrize("text", ["", "GPU-1", "0000:1b", "100000000:1b:00.0"])
    def test_rejects_what_is_not_a_bus_id(self, text):
        """Garbage is an error, not a silent mismatch."""
        with pytest.raises(ValueError, match=r"bus id|domain"):
            normalize_bus_id(text)


class TestXidCatalog:
    def test_builtin_catalog_classifies_key_xids(self):
        """The shipped catalog knows the Xids that stop training."""
        catalog = load_catalog()
        assert catalog.class_of(79) == "bus"
        assert catalog.class_of(48) == "memory"
        assert catalog.class_of(74) == "nvlink"
        assert catalog.class_of(13) == "application"
        entry = catalog.get(79)
        assert entry is not None
        assert (entry.action, entry.fatal) == ("RESTART_BM", True)

    def test_unknown_xid_is_unknown(self):
        """An Xid the catalog lacks is classified as unknown, not guessed."""
        assert load_catalog().class_of(9999) == "unknown"
        assert load_catalog().get(9999) is None

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            (
                "version: 1\nxids: {79: {name: x, class: bus, action: REBOOT, fatal: true}}",
                "action",
            ),
            (
                "version: 1\nxids: {79: {name: x, class: disk, action: IGNORE, fatal: true}}",
                "class",
            ),
            ("version: 1\nxids: {79: {name: x, class: bus, action: IGNORE}}", "lacks fatal"),
            ("version: 1\nxids: {abc: {name: x, class: bus, action: IGNORE, fatal: no}}", "key"),
            ("version: 2\nxids: {}", "version: 1"),
            ("version: 1\nxids: [1, 2]", "map Xid numbers"),
            ("{{{{", "not valid YAML"),
        ],
    )
    def test_broken_catalog_names_the_problem(self, text, message):
        """A broken catalog file is refused with a message naming the entry and field."""
        with pytest.raises(CatalogError, match=message):
            parse_catalog(text, "user.yaml")

    def test_missing_file_is_a_clear_error(self, tmp_path: Path):
        """A catalog path that does not exist says so."""
        with pytest.raises(CatalogError, match="cannot read"):
            load_catalog(tmp_path / "nope.yaml")
