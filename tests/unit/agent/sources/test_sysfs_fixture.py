import importlib.util
import os
from pathlib import Path
from types import ModuleType

FIXTURES = Path(__file__).parents[3] / "fixtures" / "sysfs"
TREE = FIXTURES / "h100-cx7"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_h100_cx7", FIXTURES / "make_h100_cx7.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Every entry under root: ("link", target), ("file", content) or ("dir", "")."""
    out: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = ("link", path.readlink().as_posix())
            elif path.is_dir():
                out[rel] = ("dir", "")
            else:
                out[rel] = ("file", path.read_text("ascii"))
    return out


class TestH100Cx7Fixture:
    def test_generator_reproduces_the_checked_in_tree(self, tmp_path: Path):
        """The committed tree is exactly what make_h100_cx7.py writes."""
        load_generator().build(tmp_path / "out")
        assert snapshot(TREE) == snapshot(tmp_path / "out")

    def test_symlinks_are_relative_and_resolve_inside_the_tree(self):
        """Every link works wherever the repository is cloned."""
        links = [p for p in TREE.rglob("*") if p.is_symlink()]
        assert len(links) == 8 * 6 + 8  # 6 PCI functions per GPU, plus class/infiniband
        for link in links:
            assert not link.readlink().is_absolute()
            assert link.resolve(strict=True).is_relative_to(TREE.resolve())

    def test_no_empty_directories(self):
        """git keeps no empty directories, so the tree must not rely on any."""
        empty = [p for p in TREE.rglob("*") if p.is_dir() and not any(p.iterdir())]
        assert empty == []

    def test_gpus_and_hcas_are_on_the_expected_buses(self):
        """The eight H100 bus ids and an HCA next to each are present."""
        devices = TREE / "bus/pci/devices"
        for bus in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB):
            gpu, hca = devices / f"0000:{bus:02x}:00.0", devices / f"0000:{bus + 1:02x}:00.0"
            assert (gpu / "device").read_text().strip() == "0x2330"
            assert (hca / "device").read_text().strip() == "0x1021"

    def test_every_file_ends_with_a_newline_like_sysfs(self):
        """sysfs attributes end in a newline; the fixture's do too."""
        files = [p for p in TREE.rglob("*") if p.is_file() and not p.is_symlink()]
        assert files
        assert all(p.read_text().endswith("\n") for p in files)
