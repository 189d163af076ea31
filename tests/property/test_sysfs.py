"""sysfs readers over hostile trees: empty, binary, huge, negative or non-numeric files, missing
files, directories where files should be. Readers return values, skip and count, or raise
SourceError; what they return makes samples and a Hello the collector accepts."""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from agent.exceptions import SourceError
from agent.poll.findings import PollResult
from agent.poll.ib import IbPoller
from agent.poll.pcie import pcie_samples
from agent.sources.pci_sysfs import PciSysfsReader, parse_aer_counts, parse_link_speed
from agent.sources.sysfs import SysfsReader
from agent.sources.sysfs_io import U64_MAX, parse_uint
from fleetwatch import PROTOCOL_VERSION
from fleetwatch.model import Target, sample_to_pb
from fleetwatch.testing import FakeClock
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import (
    MAX_TEXT,
    WireError,
    validate_event,
    validate_hello,
    validate_report,
)
from tests.property.hostile import assert_clear, tried

TARGET = "sysfs"
DIRECTORY = object()  # a directory where a file should be
MISSING = None

CONTENTS = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"\n",
            b"0\n",
            b"-1\n",
            b"18446744073709551615\n",  # 2**64 - 1
            b"18446744073709551616\n",  # 2**64
            b"9" * 4096,
            b"\xff\xfe\x00",
            b"4: ACTIVE\n",
            b"5: LinkUp\n",
            b"1: DOWN\n",
            b"400 Gb/sec (4X NDR)\n",
            b"InfiniBand\n",
            b"32.0 GT/s PCIe\n",
            b"9" * 400 + b" GT/s\n",
            b"Unknown\n",
            b"16\n",
            b"RxErr 3\nBadTLP 0\nTOTAL_ERR_COR 3\n",
            b"TOTAL_ERR_FATAL " + b"9" * 30 + b"\n",
            b"Receiver Error 2\nTOTAL_ERR_COR\n",
            b"x" * 4096,
            "²\n".encode(),
        ]
    ),
)
ENTRY = st.one_of(CONTENTS, st.just(DIRECTORY), st.just(MISSING))


def put(path: Path, entry: object) -> None:
    """Make ``path`` a file with ``entry`` bytes, a directory, or nothing."""
    if entry is MISSING:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if entry is DIRECTORY:
        path.mkdir(exist_ok=True)
    else:
        assert isinstance(entry, bytes)
        path.write_bytes(entry)


DEVICE_NAMES = st.one_of(
    st.sampled_from(["mlx5_0", "mlx5_1", "mlx5 0", "a" * 80, "ünï", "-x", ".hidden"]),
    st.text(alphabet="abcxyz_059-.", min_size=1, max_size=10),
)
PORT_NAMES = st.sampled_from(["1", "2", "0", "256", "99999999999999999999", "²", "01", "x"])
IB_FILES = ("rate", "link_layer", "state", "phys_state")
COUNTER_NAMES = st.sampled_from(
    [
        "symbol_error",
        "link_downed",
        "port_xmit_data",
        "port_rcv_data",
        "port_xmit_wait",
        "unicast_xmit_packets",
        "lifespan",
        "weird name",
        "ÜBER",
    ]
)


@st.composite
def ib_trees(draw: st.DrawFn) -> dict[str, object]:
    """Relative path -> entry, for a class/infiniband tree with broken parts."""
    tree: dict[str, object] = {}
    for device in draw(st.lists(DEVICE_NAMES, max_size=2, unique=True)):
        for port in draw(st.lists(PORT_NAMES, max_size=2, unique=True)):
            base = f"class/infiniband/{device}/ports/{port}"
            for name in IB_FILES:
                tree[f"{base}/{name}"] = draw(ENTRY)
            for sub in ("counters", "hw_counters"):
                for counter in draw(st.lists(COUNTER_NAMES, max_size=4, unique=True)):
                    tree[f"{base}/{sub}/{counter}"] = draw(ENTRY)
    return tree


def build(root: Path, tree: dict[str, object]) -> None:
    for rel, entry in sorted(tree.items()):
        path = root / rel
        if path.parent.is_file():  # a file stands where a directory should: keep the file
            continue
        put(path, entry)


def hello_for(ports: list[pb.IbPort]) -> pb.Hello:
    return pb.Hello(
        node="gpu-001",
        boot_id="b00t",
        protocol_version=PROTOCOL_VERSION,
        ib_ports=ports,
    )


class TestIbPorts:
    @given(ib_trees())
    @example(
        {
            "class/infiniband/mlx5_0/ports/1/rate": b"R" * 4096,
            "class/infiniband/mlx5_0/ports/1/link_layer": b"InfiniBand",
            "class/infiniband/mlx5_0/ports/1/state": b"4: " + b"A" * 4000,
            "class/infiniband/mlx5_0/ports/1/phys_state": b"5: LinkUp",
            "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data": b"18446744073709551615",
            "class/infiniband/mlx5_0/ports/1/counters/symbol_error": b"9" * 4096,
            "class/infiniband/mlx5_0/ports/1/counters/link_downed": b"3",
            "class/infiniband/mlx5_0/ports/1/counters/symbol_error/x": b"a directory",
            "class/infiniband/mlx5_0/ports/256/rate": b"x",
            "class/infiniband/mlx5_0/ports/²/rate": b"x",
            "class/infiniband/bad name/ports/1/rate": b"x",
        }
    )
    @example(
        {
            "class/infiniband/mlx5_0/ports/1/rate": b"x",
            "class/infiniband/mlx5_0/ports/1/link_layer": b"x",
            "class/infiniband/mlx5_0/ports/01/rate": b"x",
            "class/infiniband/mlx5_0/ports/01/link_layer": b"x",
        }
    )  # port 1 twice: the Hello was refused
    def test_hostile_ib_tree_gives_what_the_wire_accepts(self, tree):
        """Discovery lists only ports a Hello may carry; polls give samples a Report may carry."""
        tried(TARGET)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            build(root, tree)
            reader = SysfsReader(root)
            try:
                ports = reader.ib_ports()
            except SourceError as exc:
                assert_clear(exc, "cannot read")
                return
            inventory = validate_hello(
                hello_for(
                    [
                        pb.IbPort(
                            device=p.device, port=p.port, rate=p.rate, link_layer=p.link_layer
                        )
                        for p in ports
                    ]
                )
            )
            poller = IbPoller(reader, FakeClock())
            errors: Counter[str] = Counter()
            for _ in range(2):  # a second poll has rates and state changes
                result = PollResult()
                poller.poll(tuple(ports), result, 1_767_225_600_000, errors, counters=True)
                report = pb.Report(
                    samples=[sample_to_pb(t, s, v) for (t, s), v in result.samples.items()]
                )
                validate_report(report, inventory)
                for seq, event in enumerate(result.events, start=1):
                    try:
                        validate_event(event.to_pb(seq), inventory)
                    except WireError as exc:  # refused and counted by the agent, not a crash
                        assert_clear(exc)
            reader.close()


@st.composite
def pci_trees(draw: st.DrawFn) -> dict[str, object]:
    base = "devices/pci0000:15/0000:15:01.0/0000:18:00.0"
    tree: dict[str, object] = {}
    for name in (
        "current_link_speed",
        "max_link_speed",
        "current_link_width",
        "max_link_width",
        "aer_dev_correctable",
        "aer_dev_nonfatal",
        "aer_dev_fatal",
        "aer_rootport_total_err_cor",
        "aer_rootport_total_err_fatal",
        "aer_rootport_total_err_nonfatal",
    ):
        tree[f"{base}/{name}"] = draw(ENTRY)
    return tree


class TestPciFunction:
    @given(pci_trees(), st.booleans())
    @example(
        {"devices/pci0000:15/0000:15:01.0/0000:18:00.0/current_link_speed": b"9" * 400 + b" GT/s"},
        True,
    )
    @example({"devices/pci0000:15/0000:15:01.0/0000:18:00.0/max_link_width": b"9" * 4096}, True)
    def test_hostile_pci_files_are_skipped_and_named(self, tree, linked):
        """Bad files are None and listed in ``unreadable``; samples stay finite and in range."""
        tried(TARGET)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            build(root, tree)
            (root / "devices/pci0000:15/0000:15:01.0/0000:18:00.0").mkdir(
                parents=True, exist_ok=True
            )
            devices = root / "bus/pci/devices"
            devices.mkdir(parents=True)
            if linked:
                (devices / "0000:18:00.0").symlink_to(
                    root / "devices/pci0000:15/0000:15:01.0/0000:18:00.0"
                )
            reader = PciSysfsReader(root)
            try:
                status = reader.function_status("0000:18:00.0")
            except SourceError as exc:
                assert_clear(exc, "cannot read")
                return
            assert status.upstream == "0000:15:01.0"
            for name in status.unreadable:
                assert (
                    tree.get(f"devices/pci0000:15/0000:15:01.0/0000:18:00.0/{name}") is not MISSING
                )
            target = Target.pci("0000:18:00.0")
            for (t, signal), value in pcie_samples(target, status).items():
                sample = sample_to_pb(t, signal, value)
                if sample.WhichOneof("value") == "real_value":
                    assert math.isfinite(sample.real_value)


class TestParsers:
    @given(st.one_of(st.text(max_size=40), st.binary(max_size=40), st.just("9" * 5000)))
    @example("9" * 5000)
    @example("18446744073709551616")
    @example("²")
    def test_parse_uint_is_a_u64_or_none(self, raw):
        """parse_uint gives 0..2**64-1 or None, never an exception."""
        tried(TARGET)
        value = parse_uint(raw)
        assert value is None or 0 <= value <= U64_MAX

    @given(
        st.one_of(
            st.text(max_size=40),
            st.from_regex(r"\d{1,400}(\.\d{1,5})? GT/s( PCIe)?", fullmatch=True),
        )
    )
    @example("9" * 400 + " GT/s")
    def test_link_speed_is_finite_or_value_error(self, text):
        """A link speed is finite, None for Unknown, or ValueError naming the text."""
        tried(TARGET)
        try:
            speed = parse_link_speed(text)
        except ValueError as exc:
            assert_clear(exc, "link speed")
            return
        assert speed is None or math.isfinite(speed.gts)

    @given(st.text(max_size=200))
    def test_aer_counts_parse_or_value_error(self, text):
        """An aer_dev_* file parses to u64 counts, or ValueError says which line is wrong."""
        tried(TARGET)
        try:
            counts = parse_aer_counts(text)
        except ValueError as exc:
            assert_clear(exc, "AER")
            return
        assert 0 <= counts.total <= U64_MAX
        assert all(0 <= v <= U64_MAX for v in counts.counts.values())


def test_state_text_is_bounded_in_samples(tmp_path):
    """A 4 KiB state file does not become a sample longer than the wire's text limit."""
    tried(TARGET)
    base = tmp_path / "class/infiniband/mlx5_0/ports/1"
    put(base / "state", b"4: " + b"A" * 4000)
    put(base / "phys_state", b"5: LinkUp")
    put(base / "counters/link_downed", b"0")
    status = SysfsReader(tmp_path).ib_port_status("mlx5_0", 1)
    assert len(status.state) <= MAX_TEXT
