"""sysfs trees as real kernels and HCAs write them, odd ones included: each file is read on its
own, and what cannot be read is unknown, never the end of the port's or the node's reading."""

from __future__ import annotations

import os
from collections import Counter
from typing import TYPE_CHECKING

from structlog.testing import capture_logs

from agent.poll.findings import PollResult
from agent.poll.ib import IbPoller
from agent.poll.ib_link import IbLinkPoller
from agent.probes.counters import IB_COUNTER_WIDTH_BITS
from agent.sim.sysfs_tree import SimSysfsTree
from agent.sources.ib_link import IbLinkReader
from agent.sources.pci_sysfs import PciSysfsReader
from agent.sources.sysfs import IB_EXTENDED_ONLY_COUNTERS, SysfsReader
from fleetwatch.model import Target
from fleetwatch.testing import FakeClock

if TYPE_CHECKING:
    from pathlib import Path

NO_PMA = "N/A (no PMA)\n"  # what the kernel writes for a device without a PMA (iWARP)


def port_dir(root: Path, device: str, port: int = 1) -> Path:
    return root / "class" / "infiniband" / device / "ports" / str(port)


def write_port(
    root: Path,
    device: str,
    *,
    state: str = "4: ACTIVE",
    phys: str = "5: LinkUp",
    link_layer: str | None = "InfiniBand",
    counter: str = "0",
    extended: bool = True,
) -> Path:
    base = port_dir(root, device)
    (base / "counters").mkdir(parents=True)
    (base / "state").write_text(state + "\n")
    (base / "phys_state").write_text(phys + "\n")
    (base / "rate").write_text("100 Gb/sec (4X EDR)\n")
    if link_layer is not None:
        (base / "link_layer").write_text(link_layer + "\n")
    for name in IB_COUNTER_WIDTH_BITS:
        if extended or name not in IB_EXTENDED_ONLY_COUNTERS:
            (base / "counters" / name).write_text(counter + "\n")
    return base


def poll(root: Path, polls: int = 2) -> tuple[list[PollResult], Counter[str], list[str]]:
    reader = SysfsReader(root)
    poller = IbPoller(reader, FakeClock())
    ports = tuple(reader.ib_ports())
    errors: Counter[str] = Counter()
    results = []
    with capture_logs() as logs:
        for at in range(polls):
            result = PollResult()
            poller.poll(ports, result, at * 1000, errors, counters=True)
            results.append(result)
    return results, errors, [e["event"] for e in logs if e["log_level"] != "debug"]


def test_an_iwarp_port_without_pma_reports_its_state_and_no_errors(tmp_path: Path):
    write_port(tmp_path, "i40iw0", link_layer="Ethernet", counter=NO_PMA.strip())
    results, errors, logged = poll(tmp_path)
    port = Target.ib_port("i40iw0", 1)
    for result in results:
        assert result.samples[port, "ib_state"] == "ACTIVE"
        assert result.samples[port, "ib_phys_state"] == "LinkUp"
        assert (port, "ib_link_downed") not in result.samples  # unknown: no PMA to count it
    assert errors["sysfs"] == 0
    assert logged == []  # no warning, let alone one every poll


def test_the_port_goes_down_and_up_without_counters(tmp_path: Path):
    base = write_port(tmp_path, "i40iw0", counter=NO_PMA.strip())
    reader = SysfsReader(tmp_path)
    poller = IbPoller(reader, FakeClock())
    ports = tuple(reader.ib_ports())
    kinds = []
    for state in ("4: ACTIVE", "1: DOWN", "4: ACTIVE"):
        (base / "state").write_text(state + "\n")
        result = PollResult()
        poller.poll(ports, result, 0, Counter(), counters=True)
        kinds += [(e.kind, e.detail) for e in result.events]
    assert [k for k, _ in kinds] == ["ib_port_down", "ib_port_up"]
    assert "link_downed unknown" in kinds[0][1]


def test_one_port_without_link_layer_does_not_hide_the_others(tmp_path: Path):
    write_port(tmp_path, "mlx5_0", link_layer=None)
    write_port(tmp_path, "mlx5_1")
    found = [(p.device, p.port, p.link_layer) for p in SysfsReader(tmp_path).ib_ports()]
    assert found == [("mlx5_0", 1, ""), ("mlx5_1", 1, "InfiniBand")]


def test_an_unreadable_state_file_keeps_what_was_read(tmp_path: Path):
    base = write_port(tmp_path, "mlx5_0")
    (base / "phys_state").unlink()
    results, errors, _ = poll(tmp_path, polls=1)
    port = Target.ib_port("mlx5_0", 1)
    assert results[0].samples[port, "ib_state"] == "ACTIVE"
    assert results[0].samples[port, "ib_link_downed"] == 0
    assert (port, "ib_phys_state") not in results[0].samples
    assert errors["sysfs"] == 1


def test_data_counters_without_the_extended_set_are_32_bit_and_stop_at_their_top(
    tmp_path: Path,
):
    """PortCounters' port_xmit_data (4-octet words) stops at 2**32 - 1: saturated, no rate."""
    top = str(2**32 - 1)
    write_port(tmp_path, "mlx4_0", counter=top, extended=False)
    write_port(tmp_path, "mlx5_0", counter=top, extended=True)
    results, _, _ = poll(tmp_path)
    narrow, wide = Target.ib_port("mlx4_0", 1), Target.ib_port("mlx5_0", 1)
    last = results[-1].samples
    assert last[narrow, "ib_port_xmit_bytes"] == (2**32 - 1) * 4
    assert last[narrow, "ib_port_xmit_bytes_saturated"] == 1
    assert (narrow, "ib_port_xmit_bytes_per_second") not in last  # stuck at the top: unknown
    assert (wide, "ib_port_xmit_bytes_saturated") not in last  # 64-bit: wraps, never stops


def test_a_nic_whose_upstream_port_cannot_be_read_keeps_its_own_link(tmp_path: Path):
    """The port above a card only caps what the card could train to; without it (its parent
    directory is on the card's path, but no such PCI function is listed) the card's own link
    is still sampled, and the gap is counted."""
    tree = SimSysfsTree(tmp_path / "sys")
    tree.write_ib_port(
        "mlx5_0",
        1,
        state="4: ACTIVE",
        phys_state="5: LinkUp",
        rate="400 Gb/sec (4X NDR)",
        link_layer="InfiniBand",
        counters={},
    )
    tree.write_pci_function("0000:40:01.0", host_bridge="pci0000:40", root_port=True)
    card = tree.write_pci_function("0000:41:00.0", upstream="0000:40:01.0")
    link = tree.root / "class" / "infiniband" / "mlx5_0" / "device"
    link.unlink()
    link.symlink_to(os.path.relpath(card, link.parent))
    (tree.root / "bus" / "pci" / "devices" / "0000:40:01.0").unlink()  # the port above: gone
    poller = IbLinkPoller(IbLinkReader(tree.root), PciSysfsReader(tree.root))
    info = tuple(SysfsReader(tree.root).ib_ports())
    result, errors = PollResult(), Counter[str]()
    port = Target.ib_port("mlx5_0", 1)
    result.samples[port, "ib_state"] = "ACTIVE"
    poller.poll(info, result, 1_000, errors)
    assert result.samples[port, "nic_pcie_link_width"] == 16
    assert result.samples[port, "nic_pcie_link_degraded"] == 0
    assert errors["sysfs"] == 1
