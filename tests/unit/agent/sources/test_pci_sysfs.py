from pathlib import Path

import pytest

import agent.sources.pci_sysfs as pci_module
from agent.exceptions import SourceError
from agent.sim.sysfs_tree import SimSysfsTree
from agent.sources.pci_sysfs import (
    LinkSpeed,
    PciSysfsReader,
    parse_aer_counts,
    parse_link_speed,
)

FIXTURE = Path(__file__).parents[3] / "fixtures" / "sysfs" / "h100-cx7"
GPUS = (
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
)
OLD_KERNEL_COR = """Receiver Error 2
Bad TLP 0
Bad DLLP 1
RELAY_NUM Rollover 0
Replay Timer Timeout 0
Advisory Non-Fatal 0
TOTAL_ERR_COR 3
"""


@pytest.fixture
def tree(tmp_path: Path) -> SimSysfsTree:
    tree = SimSysfsTree(tmp_path)
    tree.write_gpu_pcie_path("0000:18:00.0")
    return tree


def gpu_dir(tree: SimSysfsTree) -> Path:
    return tree.root / "bus/pci/devices/0000:18:00.0"


class TestParseLinkSpeed:
    @pytest.mark.parametrize(
        ("text", "gts", "gen"),
        [
            ("2.5 GT/s PCIe\n", 2.5, 1),
            ("5.0 GT/s PCIe", 5.0, 2),
            ("8.0 GT/s PCIe", 8.0, 3),
            ("16.0 GT/s PCIe", 16.0, 4),
            ("32.0 GT/s PCIe", 32.0, 5),
            ("64.0 GT/s PCIe", 64.0, 6),
            ("2.5 GT/s", 2.5, 1),
            ("5 GT/s", 5.0, 2),
            ("16 GT/s\n", 16.0, 4),
        ],
    )
    def test_current_and_old_kernel_formats(self, text, gts, gen):
        """Both "32.0 GT/s PCIe" and the pre-5.7 "16 GT/s" give GT/s and the generation."""
        assert parse_link_speed(text) == LinkSpeed(gts=gts, generation=gen)

    @pytest.mark.parametrize("text", ["Unknown\n", "Unknown speed"])
    def test_unknown_speed_is_none(self, text):
        """A link that is down has no speed."""
        assert parse_link_speed(text) is None

    @pytest.mark.parametrize("text", ["", "fast", "32.0 Gb/s", "GT/s PCIe"])
    def test_garbage_is_refused(self, text):
        """Anything else is not a speed."""
        with pytest.raises(ValueError, match="not a PCIe link speed"):
            parse_link_speed(text)


class TestParseAerCounts:
    def test_current_kernel_names(self):
        """Short names and the TOTAL_ERR_ line; the total may differ from the sum of lines."""
        aer = parse_aer_counts("RxErr 6\nBadTLP 2\nBadDLLP 3\nTOTAL_ERR_COR 9\n")
        assert dict(aer.counts) == {"RxErr": 6, "BadTLP": 2, "BadDLLP": 3}
        assert aer.total == 9

    def test_old_kernel_names_with_spaces(self):
        """Older kernels print names such as "Receiver Error"; the count is the last word."""
        aer = parse_aer_counts(OLD_KERNEL_COR)
        assert aer.counts["Receiver Error"] == 2
        assert aer.counts["Bad DLLP"] == 1
        assert aer.total == 3

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("RxErr lots\nTOTAL_ERR_COR 1\n", "not 'Name count'"),
            ("17\nTOTAL_ERR_COR 1\n", "not 'Name count'"),
            ("RxErr 1\n", "no TOTAL_ERR_"),
            ("", "no TOTAL_ERR_"),
        ],
    )
    def test_malformed_files_are_refused(self, text, message):
        """A line without a count, or no total line, is not an AER counter file."""
        with pytest.raises(ValueError, match=message):
            parse_aer_counts(text)


class TestPciReaderOnFixture:
    @pytest.mark.parametrize("bdf", GPUS)
    def test_every_gpu_is_gen5_x16(self, bdf):
        """The eight H100s train at 32 GT/s (Gen5), x16, which is also their maximum."""
        link = PciSysfsReader(FIXTURE).function_status(bdf).link
        assert (
            link.current_speed and link.current_speed.generation,
            link.max_speed and link.max_speed.generation,
            link.current_width,
            link.max_width,
        ) == (5, 5, 16, 16)
        assert not link.width_degraded
        assert not link.speed_below_max

    @pytest.mark.parametrize("bdf", GPUS)
    def test_upstream_port_is_the_switch_port_in_the_resolved_path(self, bdf):
        """The parent directory that is a PCI function is the switch downstream port."""
        reader = PciSysfsReader(FIXTURE)
        bus = int(bdf[5:7], 16)
        chain = reader.upstream_chain(bdf)
        assert chain[:2] == (f"0000:{bus - 1:02x}:00.0", f"0000:{bus - 2:02x}:00.0")
        assert chain[-1] == f"0000:{bus - 3:02x}:01.0"
        assert chain[0] == reader.upstream_port(bdf) == reader.function_status(bdf).upstream

    def test_nvml_bus_id_format_is_accepted(self):
        """NVML's 8-digit uppercase bus id names the same function."""
        status = PciSysfsReader(FIXTURE).function_status("00000000:5D:00.0")
        assert status.bdf == "0000:5d:00.0"

    def test_link_partner_carries_the_correctable_errors(self):
        """The switch port above GPU 3 counted errors the GPU itself did not."""
        reader = PciSysfsReader(FIXTURE)
        port = reader.function_status(reader.upstream_port("0000:5d:00.0") or "")
        gpu = reader.function_status("0000:5d:00.0")
        assert port.aer is not None
        assert gpu.aer is not None
        assert port.aer.correctable is not None
        assert gpu.aer.correctable is not None
        assert (port.aer.correctable.counts["RxErr"], port.aer.correctable.total) == (6, 9)
        assert gpu.aer.correctable.total == 0

    def test_root_port_has_rootport_totals_and_others_do_not(self):
        """Only root ports have aer_rootport_total_err_*; they count received messages."""
        reader = PciSysfsReader(FIXTURE)
        root = reader.function_status("0000:5a:01.0").aer
        gpu = reader.function_status("0000:5d:00.0").aer
        assert root is not None
        assert gpu is not None
        assert (
            root.rootport_total_err_cor,
            root.rootport_total_err_fatal,
            root.rootport_total_err_nonfatal,
        ) == (9, 0, 0)
        assert gpu.rootport_total_err_cor is None

    def test_uncorrectable_counters_use_the_uncorrectable_names(self):
        """aer_dev_fatal lists uncorrectable error names with a TOTAL_ERR_FATAL total."""
        aer = PciSysfsReader(FIXTURE).function_status("0000:ab:00.0").aer
        assert aer is not None
        assert aer.fatal is not None
        assert aer.correctable is not None
        assert {"CmpltTO", "MalfTLP", "UnsupReq"} <= set(aer.fatal.counts)
        assert (aer.correctable.counts["Timeout"], aer.correctable.total) == (1, 2)


class TestPciReaderOddContent:
    def test_missing_aer_files_give_none_without_errors(self, tree: SimSysfsTree):
        """A function that is not AER-capable has aer None, which is not a read error."""
        tree.write_pci_function("0000:20:00.0", aer=False)
        status = PciSysfsReader(tree.root).function_status("0000:20:00.0")
        assert (status.aer, status.read_errors) == (None, 0)
        assert status.upstream is None

    def test_one_missing_aer_file_leaves_the_others(self, tree: SimSysfsTree):
        """Only the absent file reads as None."""
        (gpu_dir(tree) / "aer_dev_fatal").unlink()
        aer = PciSysfsReader(tree.root).function_status("0000:18:00.0").aer
        assert aer is not None
        assert aer.fatal is None
        assert aer.nonfatal is not None

    def test_old_speed_format(self, tree: SimSysfsTree):
        """A pre-5.7 kernel's "16 GT/s" reads as Gen4, below a Gen5 maximum."""
        (gpu_dir(tree) / "current_link_speed").write_text("16 GT/s\n")
        link = PciSysfsReader(tree.root).function_status("0000:18:00.0").link
        assert link.current_speed == LinkSpeed(16.0, 4)
        assert link.speed_below_max

    def test_link_down_reads_unknown_speed_and_zero_width(self, tree: SimSysfsTree):
        """A dead link is "Unknown" and width 0: no speed, degraded width, no read error."""
        tree.set_pci_link("0000:18:00.0", speed="Unknown", width=0)
        status = PciSysfsReader(tree.root).function_status("0000:18:00.0")
        assert (status.link.current_speed, status.link.current_width) == (None, 0)
        assert status.link.width_degraded
        assert status.read_errors == 0

    @pytest.mark.parametrize(
        ("name", "content"),
        [
            ("current_link_width", "x16\n"),
            ("current_link_speed", ""),
            ("aer_dev_correctable", "RxErr\n"),
            ("aer_dev_nonfatal", ""),
        ],
    )
    def test_garbage_or_empty_files_are_counted(self, tree: SimSysfsTree, name, content):
        """A present file that does not parse is None and named in unreadable."""
        (gpu_dir(tree) / name).write_text(content)
        status = PciSysfsReader(tree.root).function_status("0000:18:00.0")
        assert status.unreadable == (name,)
        assert status.link.max_width == 16

    def test_missing_function_is_a_source_error(self, tree: SimSysfsTree):
        """A function that is not on the bus fails the read, naming it."""
        with pytest.raises(SourceError, match=r"0000:99:00\.0"):
            PciSysfsReader(tree.root).function_status("0000:99:00.0")


class TestSimTreePci:
    def test_symlinks_are_relative_and_nest_like_the_kernel(self, tree: SimSysfsTree):
        """bus/pci/devices/<bdf> points into devices/ with a relative link."""
        target = gpu_dir(tree).readlink().as_posix()
        assert target == (
            "../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
        )

    def test_same_result_shape_as_the_fixture(self, tree: SimSysfsTree):
        """The simulated GPU reads like the fixture's: same AER names, link and chain shape."""
        sim = PciSysfsReader(tree.root).function_status("0000:18:00.0")
        real = PciSysfsReader(FIXTURE).function_status("0000:18:00.0")
        assert sim.link == real.link
        assert sim.aer == real.aer
        assert sim.aer is not None
        chain = PciSysfsReader(tree.root).upstream_chain("0000:18:00.0")
        assert chain == PciSysfsReader(FIXTURE).upstream_chain("0000:18:00.0")

    def test_aer_errors_count_on_the_function_and_its_root_port(self, tree: SimSysfsTree):
        """Errors add to the device's counts and total and to the root port's message total."""
        tree.add_aer_errors("0000:17:00.0", "correctable", {"RxErr": 3, "BadTLP": 1})
        tree.add_aer_errors("0000:17:00.0", "correctable", {"RxErr": 1})
        reader = PciSysfsReader(tree.root)
        aer = reader.function_status("0000:17:00.0").aer
        root = reader.function_status("0000:15:01.0").aer
        assert aer is not None
        assert root is not None
        assert aer.correctable is not None
        assert (
            aer.correctable.counts["RxErr"],
            aer.correctable.counts["BadTLP"],
            aer.correctable.total,
        ) == (4, 1, 5)
        assert (root.rootport_total_err_cor, root.rootport_total_err_fatal) == (5, 0)

    def test_unknown_severity_is_refused(self, tree: SimSysfsTree):
        """Severity is one of correctable, nonfatal, fatal."""
        with pytest.raises(ValueError, match="severity"):
            tree.add_aer_errors("0000:18:00.0", "scary", {"RxErr": 1})

    def test_downtrain_shows_as_degraded_width(self, tree: SimSysfsTree):
        """A link retrained to Gen4 x8 keeps its Gen5 x16 maximum."""
        tree.set_pci_link("0000:18:00.0", speed="16.0 GT/s PCIe", width=8)
        link = PciSysfsReader(tree.root).function_status("0000:18:00.0").link
        assert (
            link.current_speed and link.current_speed.generation,
            link.current_width,
            link.max_width,
        ) == (4, 8, 16)
        assert link.width_degraded

    def test_removing_a_port_removes_everything_below_it(self, tree: SimSysfsTree):
        """A hot-removed switch port takes the GPU below it off the bus too."""
        tree.remove_pci_function("0000:17:00.0")
        reader = PciSysfsReader(tree.root)
        with pytest.raises(SourceError):
            reader.function_status("0000:18:00.0")
        assert reader.function_status("0000:16:00.0").bdf == "0000:16:00.0"
        assert not gpu_dir(tree).is_symlink()

    def test_a_function_cannot_move_to_another_parent(self, tree: SimSysfsTree):
        """Writing an existing bdf under a different port is refused."""
        with pytest.raises(ValueError, match="another parent"):
            tree.write_pci_function("0000:18:00.0", upstream="0000:16:00.0")

    def test_gpu_bus_too_low_for_the_ports_above(self, tmp_path: Path):
        """Three ports sit above a GPU, so its bus must leave room for them."""
        with pytest.raises(ValueError, match="no room"):
            SimSysfsTree(tmp_path).write_gpu_pcie_path("0000:02:00.0")


class TestPublicNames:
    def test_all_lists_the_public_names(self):
        """``__all__`` names exactly the module's public classes and functions, and exists."""
        module = pci_module
        public = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        }
        listed = {
            name
            for name in module.__all__
            if getattr(getattr(module, name), "__module__", None) == module.__name__
        }
        assert listed == public
        assert all(hasattr(module, name) for name in module.__all__)
