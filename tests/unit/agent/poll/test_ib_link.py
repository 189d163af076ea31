"""Links read every counter interval: port rates, RoCE GIDs, NIC and NVSwitch PCIe links.

The trees are written with the simulator's sysfs writer in the kernel's formats
(``drivers/infiniband/core/sysfs.c``: ``rate``, ``gids/N``, ``gid_attrs/types/N``;
``drivers/pci/pci-sysfs.c``: the link files) and read by the real readers.
"""

import os
from collections import Counter
from pathlib import Path

import pytest

from agent.poll.findings import PollResult
from agent.poll.ib_link import IbLinkPoller
from agent.poll.sampler import Sampler
from agent.sim.hardware import SimNode
from agent.sim.sysfs_tree import SimSysfsTree
from agent.sources.ib_link import IbLinkReader, parse_ib_rate
from agent.sources.nvml import NvmlSource
from agent.sources.pci_sysfs import PciSysfsReader
from agent.sources.sysfs import IbPortInfo, SysfsReader
from fleetwatch.model import EventKind, Target
from fleetwatch.testing import FakeClock
from rules.xid_catalog import load_catalog

NDR = "400 Gb/sec (4X NDR)"
GEN5, GEN4 = "32.0 GT/s PCIe", "16.0 GT/s PCIe"
NVSWITCH_IDS = {"vendor": "0x10de", "device": "0x22a3", "class": "0x068000"}


class TestParseRate:
    @pytest.mark.parametrize(
        ("text", "gbps", "width", "speed"),
        [
            ("400 Gb/sec (4X NDR)\n", 400.0, 4, "NDR"),
            ("200 Gb/sec (4X HDR)", 200.0, 4, "HDR"),
            ("100 Gb/sec (1X NDR)", 100.0, 1, "NDR"),
            ("2.5 Gb/sec (1X SDR)", 2.5, 1, "SDR"),
            ("56 Gb/sec (4X FDR)", 56.0, 4, "FDR"),
            ("800 Gb/sec (4X XDR)", 800.0, 4, "XDR"),
            ("200 Gb/sec", 200.0, None, ""),  # a rate the simulator names without a table entry
        ],
    )
    def test_any_rate_the_kernel_prints(
        self, text: str, gbps: float, width: int | None, speed: str
    ):
        rate = parse_ib_rate(text)
        assert (rate.gbps, rate.width, rate.speed) == (gbps, width, speed)

    @pytest.mark.parametrize("text", ["", "fast", "400 Gbps", "Gb/sec (4X NDR)"])
    def test_other_text_is_refused_naming_it(self, text: str):
        with pytest.raises(ValueError, match="is not an IB rate"):
            parse_ib_rate(text)


def write_port(tree: SimSysfsTree, device: str, *, rate: str = NDR, layer: str = "InfiniBand"):
    tree.write_ib_port(
        device,
        1,
        state="4: ACTIVE",
        phys_state="5: LinkUp",
        rate=rate,
        link_layer=layer,
        counters={"link_downed": 0},
    )


def set_rate(tree: SimSysfsTree, device: str, rate: str) -> None:
    (tree.root / "class" / "infiniband" / device / "ports" / "1" / "rate").write_text(rate + "\n")


def ports(n: int, layer: str = "InfiniBand") -> tuple[IbPortInfo, ...]:
    return tuple(IbPortInfo(f"mlx5_{i}", 1, NDR, layer) for i in range(n))


def poll(
    poller: IbLinkPoller, infos: tuple[IbPortInfo, ...], *, down: tuple[str, ...] = ()
) -> tuple[PollResult, Counter[str]]:
    result = PollResult()
    for p in infos:
        state = "DOWN" if p.device in down else "ACTIVE"
        result.samples[Target.ib_port(p.device, p.port), "ib_state"] = state
    errors: Counter[str] = Counter()
    poller.poll(infos, result, 1_000, errors)
    return result, errors


@pytest.fixture
def tree(tmp_path: Path) -> SimSysfsTree:
    return SimSysfsTree(tmp_path / "sys")


class TestPortRate:
    def test_a_rail_below_its_peers_is_low_from_the_first_poll(self, tree: SimSysfsTree):
        for i in range(4):
            write_port(tree, f"mlx5_{i}", rate="200 Gb/sec (4X HDR)" if i == 2 else NDR)
        poller = IbLinkPoller(IbLinkReader(tree.root), None)
        result, errors = poll(poller, ports(4))
        low = Target.ib_port("mlx5_2", 1)
        assert result.samples[low, "ib_rate_gbps"] == 200.0
        assert result.samples[low, "ib_rate_expected_gbps"] == 400.0
        assert result.samples[low, "ib_rate_low"] == 1
        assert result.samples[Target.ib_port("mlx5_0", 1), "ib_rate_low"] == 0
        assert [(e.kind, e.target, e.detail) for e in result.events] == [
            (EventKind.IB_RATE_LOW, low, f"mlx5_2/1 runs at 200 Gb/sec (4X HDR), expected {NDR}"),
        ]
        assert errors == Counter()
        again, _ = poll(poller, ports(4))
        assert again.events == []  # reported once, while it stays low
        assert again.samples[low, "ib_rate_low"] == 1

    def test_a_port_read_every_interval_sees_a_retrain(self, tree: SimSysfsTree):
        """Width counts too: one lane left of four is a quarter of the rate."""
        for i in range(2):
            write_port(tree, f"mlx5_{i}")
        poller = IbLinkPoller(IbLinkReader(tree.root), None)
        first, _ = poll(poller, ports(2))
        assert first.events == []
        set_rate(tree, "mlx5_1", "100 Gb/sec (1X NDR)")
        later, _ = poll(poller, ports(2))
        port = Target.ib_port("mlx5_1", 1)
        assert later.samples[port, "ib_link_width"] == 1
        assert [e.kind for e in later.events] == [EventKind.IB_RATE_LOW]
        set_rate(tree, "mlx5_1", NDR)
        back, _ = poll(poller, ports(2))
        assert back.samples[port, "ib_rate_low"] == 0
        assert back.events == []

    def test_every_rail_lower_than_it_was_is_low_against_its_own_past(self, tree: SimSysfsTree):
        for i in range(2):
            write_port(tree, f"mlx5_{i}")
        poller = IbLinkPoller(IbLinkReader(tree.root), None)
        poll(poller, ports(2))
        for i in range(2):
            set_rate(tree, f"mlx5_{i}", "200 Gb/sec (4X HDR)")
        result, _ = poll(poller, ports(2))
        assert [e.target.device for e in result.events] == ["mlx5_0", "mlx5_1"]

    def test_a_down_port_is_not_judged_and_does_not_set_the_bar(self, tree: SimSysfsTree):
        write_port(tree, "mlx5_0", rate="40 Gb/sec (4X QDR)")
        write_port(tree, "mlx5_1", rate="200 Gb/sec (4X HDR)")
        poller = IbLinkPoller(IbLinkReader(tree.root), None)
        result, _ = poll(poller, ports(2), down=("mlx5_0",))
        assert result.samples[Target.ib_port("mlx5_0", 1), "ib_rate_low"] == 0
        assert result.samples[Target.ib_port("mlx5_1", 1), "ib_rate_low"] == 0
        assert result.events == []

    def test_other_cards_are_not_peers(self, tree: SimSysfsTree):
        """A 200 Gb/s storage NIC beside 400 Gb/s rails is another kind of card, not a low rail."""
        write_port(tree, "mlx5_0")
        write_port(tree, "mlx5_1", rate="200 Gb/sec (4X HDR)")
        for device, board in (("mlx5_0", "MT_0000000838"), ("mlx5_1", "MT_0000000359")):
            base = tree.root / "class" / "infiniband" / device
            (base / "hca_type").write_text("MT4129\n")
            (base / "board_id").write_text(board + "\n")
        poller = IbLinkPoller(IbLinkReader(tree.root), None)
        result, _ = poll(poller, ports(2))
        assert result.samples[Target.ib_port("mlx5_1", 1), "ib_rate_low"] == 0

    def test_an_unreadable_rate_is_counted_and_costs_only_that_port(self, tree: SimSysfsTree):
        write_port(tree, "mlx5_0")
        write_port(tree, "mlx5_1", rate="garbage")
        poller = IbLinkPoller(IbLinkReader(tree.root), None)
        result, errors = poll(poller, ports(2))
        assert errors == Counter({"sysfs": 1})
        assert (Target.ib_port("mlx5_1", 1), "ib_rate_gbps") not in result.samples
        assert result.samples[Target.ib_port("mlx5_0", 1), "ib_rate_gbps"] == 400.0


def write_gids(tree: SimSysfsTree, device: str, entries: dict[int, tuple[str, str]]) -> None:
    """GID table of 8 entries; ``entries`` maps an index to (gid, type); the rest are unused."""
    base = tree.root / "class" / "infiniband" / device / "ports" / "1"
    (base / "gids").mkdir(exist_ok=True)
    (base / "gid_attrs" / "types").mkdir(parents=True, exist_ok=True)
    for i in range(8):
        gid, kind = entries.get(i, ("0000:0000:0000:0000:0000:0000:0000:0000", ""))
        (base / "gids" / str(i)).write_text(gid + "\n")
        types = base / "gid_attrs" / "types" / str(i)
        if kind:
            types.write_text(kind + "\n")
        elif types.exists():
            types.unlink()  # an unused entry's type cannot be read


LINK_LOCAL = "fe80:0000:0000:0000:0a88:66ff:fe1b:2c40"
IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:0a00:0011"


class TestRoceGids:
    def test_roce_v2_entries_are_counted_and_their_loss_is_a_fault(self, tree: SimSysfsTree):
        write_port(tree, "mlx5_0", layer="Ethernet")
        write_gids(
            tree,
            "mlx5_0",
            {
                0: (LINK_LOCAL, "IB/RoCE v1"),
                1: (LINK_LOCAL, "RoCE v2"),
                2: (IPV4_MAPPED, "IB/RoCE v1"),
                3: (IPV4_MAPPED, "RoCE v2"),
            },
        )
        poller = IbLinkPoller(IbLinkReader(tree.root), None)
        roce = ports(1, "Ethernet")
        port = Target.ib_port("mlx5_0", 1)
        result, _ = poll(poller, roce)
        assert result.samples[port, "roce_v2_gids"] == 2
        assert result.samples[port, "roce_gid_missing"] == 0
        # The interface lost its addresses and the v2 entries with them; v1 link-local remains.
        write_gids(tree, "mlx5_0", {0: (LINK_LOCAL, "IB/RoCE v1")})
        result, _ = poll(poller, roce)
        assert result.samples[port, "roce_gid_missing"] == 1
        assert [(e.kind, e.target) for e in result.events] == [
            (EventKind.ROCE_GID_MISSING, port),
        ]
        assert "1 GID entries in use" in result.events[0].detail

    def test_infiniband_ports_have_no_roce_check(self, tree: SimSysfsTree):
        write_port(tree, "mlx5_0")
        poller = IbLinkPoller(IbLinkReader(tree.root), None)
        result, errors = poll(poller, ports(1))
        assert (Target.ib_port("mlx5_0", 1), "roce_gid_missing") not in result.samples
        assert errors == Counter()


def hca_on_pci(tree: SimSysfsTree, device: str, bdf: str, root_port: str, speed: str = GEN5):
    tree.write_pci_function(root_port, host_bridge="pci0000:40", root_port=True, speed=speed)
    tree.write_pci_function(bdf, upstream=root_port)
    link = tree.root / "class" / "infiniband" / device / "device"
    if link.is_symlink():
        link.unlink()
    target = (tree.root / "bus" / "pci" / "devices" / bdf).resolve()
    link.symlink_to(os.path.relpath(target, link.parent))


class TestPcieLinks:
    def test_a_nic_trained_below_its_slot_is_degraded(self, tree: SimSysfsTree):
        write_port(tree, "mlx5_0")
        hca_on_pci(tree, "mlx5_0", "0000:41:00.0", "0000:40:01.0")
        pci = PciSysfsReader(tree.root)
        poller = IbLinkPoller(IbLinkReader(tree.root), pci)
        port = Target.ib_port("mlx5_0", 1)
        result, _ = poll(poller, ports(1))
        assert result.samples[port, "nic_pcie_link_degraded"] == 0
        assert result.samples[port, "nic_pcie_link_width"] == 16
        tree.set_pci_link("0000:41:00.0", speed=GEN4, width=8)
        result, _ = poll(poller, ports(1))
        assert result.samples[port, "nic_pcie_link_degraded"] == 1
        assert result.samples[port, "nic_pcie_link_speed_gts"] == 16.0
        assert [(e.kind, e.target, e.detail) for e in result.events] == [
            (
                EventKind.PCIE_LINK_DEGRADED,
                port,
                "NIC mlx5_0 (0000:41:00.0) PCIe link at 16 GT/s x8, can run 32 GT/s x16",
            ),
        ]

    def test_a_gen5_nic_in_a_gen4_slot_is_what_the_slot_allows(self, tree: SimSysfsTree):
        write_port(tree, "mlx5_0")
        hca_on_pci(tree, "mlx5_0", "0000:41:00.0", "0000:40:01.0", speed=GEN4)
        tree.set_pci_link("0000:41:00.0", speed=GEN4)
        poller = IbLinkPoller(IbLinkReader(tree.root), PciSysfsReader(tree.root))
        result, _ = poll(poller, ports(1))
        port = Target.ib_port("mlx5_0", 1)
        assert result.samples[port, "nic_pcie_link_speed_gts_max"] == 16.0
        assert result.samples[port, "nic_pcie_link_degraded"] == 0

    def test_nvswitches_are_found_and_a_narrow_one_counted(self, tree: SimSysfsTree):
        for i in range(4):
            tree.write_pci_function(
                f"0000:0{5 + i}:00.0", host_bridge=f"pci0000:0{5 + i}", attrs=NVSWITCH_IDS, width=2
            )
        tree.write_pci_function("0000:18:00.0", attrs={"vendor": "0x10de", "class": "0x030200"})
        poller = IbLinkPoller(IbLinkReader(tree.root), PciSysfsReader(tree.root))
        assert poller.discover() == ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0")
        result, _ = poll(poller, ())
        assert result.samples[Target.node(), "nvswitch_pcie_links_degraded"] == 0
        tree.set_pci_link("0000:07:00.0", width=1)
        result, _ = poll(poller, ())
        assert result.samples[Target.node(), "nvswitch_pcie_links_degraded"] == 1
        assert result.samples[Target.pci("0000:07:00.0"), "pcie_sysfs_link_width"] == 1
        assert [(e.kind, e.target) for e in result.events] == [
            (EventKind.PCIE_LINK_DEGRADED, Target.pci("0000:07:00.0")),
        ]


class TestSampler:
    async def test_the_ib_rate_low_fault_is_seen_at_the_next_counter_interval(self, tmp_path: Path):
        """The simulator's ib_rate_low fault changes only the port's rate file."""
        clock = FakeClock()
        node = SimNode("node-a", tmp_path / "sys", clock, gpus=2, nvlinks=2, ib_ports=4)
        sampler = Sampler(
            nvml=NvmlSource(node.nvml),
            sysfs=SysfsReader(node.sysfs.root),
            kmsg=node.kmsg,
            udev=node.udev,
            catalog=load_catalog(),
            clock=clock,
            pci=PciSysfsReader(node.sysfs.root),
            counter_interval_s=30.0,
        )
        sampler.discover()
        first = await sampler.poll()
        port = Target.ib_port("mlx5_3", 1)
        assert first.samples[port, "ib_rate_low"] == 0
        node.ib_rate(3, 200)
        clock.advance(5.0)
        between = await sampler.poll()  # not due yet: the rate is not read every poll
        assert (port, "ib_rate_gbps") not in between.samples
        clock.advance(30.0)
        due = await sampler.poll()
        assert due.samples[port, "ib_rate_low"] == 1
        assert [(e.kind, e.target) for e in due.events] == [(EventKind.IB_RATE_LOW, port)]
