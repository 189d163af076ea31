"""Text rendering for the demo: a fleet status line, event lines and the final summary."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collector.fleet import NodeState
    from collector.store_sqlite import EventRow


def _gpu_index(node: NodeState | None, uuid: str) -> str:
    if node is not None and uuid in node.gpus:
        return f"GPU {node.gpus[uuid].index}"
    return uuid[:12]


def event_line(row: EventRow, node: NodeState | None) -> str:
    """One journaled event, the way on-call would want to read it."""
    match row.target_kind:
        case "gpu":
            where = _gpu_index(node, row.gpu_uuid)
        case "nvlink":
            where = f"{_gpu_index(node, row.gpu_uuid)} NVLink {row.target_index}"
        case "ib_port":
            where = f"IB {row.device}/{row.target_index}"
        case "pci":
            where = f"PCI {row.device}"
        case _:
            where = "node"
    xid = f" Xid {row.xid} ({row.xid_class})" if row.xid else ""
    detail = f"  {row.detail[:90]}" if row.detail else ""
    return f"  event #{row.id:<3} {row.node:<8} {row.kind:<16} {where}{xid}{detail}"


def fleet_line(elapsed_s: float, nodes: dict[str, NodeState]) -> str:
    """One line of fleet health."""
    reachable = sum(1 for n in nodes.values() if n.reachable)
    gpus = [g for n in nodes.values() for g in n.gpus.values()]
    ports = [p for n in nodes.values() for p in n.ports.values()]
    events = sum(sum(n.events.values()) for n in nodes.values())
    return (
        f"[{elapsed_s:5.1f}s] nodes up {reachable}/{len(nodes)} | "
        f"GPUs present {sum(g.present for g in gpus)}/{len(gpus)} | "
        f"NVLinks down {sum(g.nvlinks_down for g in gpus)} | "
        f"IB ports up {sum(p.up for p in ports)}/{len(ports)} | events {events}"
    )


THERMAL_REASONS = 0x20 | 0x40
CONGESTED_WAITS_PER_S = 10_000


def gpu_problems(node: NodeState) -> list[str]:
    """What is wrong with the node's GPUs, in words."""
    problems: list[str] = []
    for g in sorted(node.gpus.values(), key=lambda g: g.index):
        name = f"GPU {g.index}"
        if not g.present:
            problems.append(f"{name} lost")
            continue
        problems += [
            f"{name} NVLink {link} down" for link, up in sorted(g.nvlink_up.items()) if not up
        ]
        if g.pcie_replay_count:
            problems.append(f"{name} {g.pcie_replay_count} PCIe replays")
        width, top = g.number("pcie_link_width"), g.number("pcie_link_width_max")
        if width is not None and top is not None and width < top:
            problems.append(f"{name} PCIe x{width:g} of x{top:g}")
        if int(g.number("clock_event_reasons") or 0) & THERMAL_REASONS:
            problems.append(f"{name} thermal throttling at {g.number('temperature_celsius'):g} C")
        if g.number("ecc_dbe_volatile_total"):
            problems.append(f"{name} {g.number('ecc_dbe_volatile_total'):g} DBE")
        if g.number("remap_failure"):
            problems.append(f"{name} row remap failed")
        elif g.number("remap_pending"):
            problems.append(f"{name} row remap pending")
    return problems


def port_problems(node: NodeState) -> list[str]:
    """What is wrong with the node's IB ports, in words."""
    problems: list[str] = []
    for p in node.ports.values():
        name = f"{p.device}/{p.port}"
        if p.state and not p.up:
            problems.append(f"{name} {p.state}")
        if p.down_events:
            problems.append(f"{name} flapped {p.down_events}x")
        waits = p.number("ib_port_xmit_wait_per_second")
        if waits is not None and waits >= CONGESTED_WAITS_PER_S:
            problems.append(f"{name} congested ({waits:,.0f} waits/s)")
        if p.number("ib_symbol_error"):
            problems.append(f"{name} {p.number('ib_symbol_error'):g} symbol errors")
    return problems


def node_table(nodes: dict[str, NodeState]) -> list[str]:
    """A row per node: reachability, GPUs, NVLinks, IB ports and problems."""
    lines = [f"  {'node':<9}{'state':<13}{'GPUs':<7}{'NVL down':<10}{'IB up':<7}problems"]
    for node in sorted(nodes.values(), key=lambda n: n.name):
        state = "up" if node.reachable else "UNREACHABLE"
        present = sum(g.present for g in node.gpus.values())
        down = sum(g.nvlinks_down for g in node.gpus.values())
        ports_up = sum(p.up for p in node.ports.values())
        problems = gpu_problems(node) + port_problems(node)
        lines.append(
            f"  {node.name:<9}{state:<13}{present}/{len(node.gpus):<5}{down:<10}"
            f"{ports_up}/{len(node.ports):<5}{', '.join(problems) or '-'}",
        )
    return lines


def events_by_kind(rows: list[EventRow]) -> str:
    """``gpu_lost 1, ib_port_down 2, ...`` in first-seen order."""
    counts = Counter(row.kind for row in rows)
    return ", ".join(f"{kind} {count}" for kind, count in counts.items()) or "none"
