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


def node_table(nodes: dict[str, NodeState]) -> list[str]:
    """A row per node: reachability, GPUs, NVLinks, IB ports and problems."""
    lines = [f"  {'node':<9}{'state':<13}{'GPUs':<7}{'NVL down':<10}{'IB up':<7}problems"]
    for node in sorted(nodes.values(), key=lambda n: n.name):
        state = "up" if node.reachable else "UNREACHABLE"
        present = sum(g.present for g in node.gpus.values())
        down = sum(g.nvlinks_down for g in node.gpus.values())
        ports_up = sum(p.up for p in node.ports.values())
        problems = [
            f"GPU {g.index} lost"
            for g in sorted(node.gpus.values(), key=lambda g: g.index)
            if not g.present
        ]
        problems += [
            f"GPU {g.index} NVLink {link} down"
            for g in node.gpus.values()
            for link, up in sorted(g.nvlink_up.items())
            if not up
        ]
        problems += [
            f"GPU {g.index} {g.pcie_replay_count} PCIe replays"
            for g in sorted(node.gpus.values(), key=lambda g: g.index)
            if g.pcie_replay_count
        ]
        problems += [
            f"{p.device}/{p.port} flapped {p.down_events}x"
            for p in node.ports.values()
            if p.down_events
        ]
        lines.append(
            f"  {node.name:<9}{state:<13}{present}/{len(node.gpus):<5}{down:<10}"
            f"{ports_up}/{len(node.ports):<5}{', '.join(problems) or '-'}",
        )
    return lines


def events_by_kind(rows: list[EventRow]) -> str:
    """``gpu_lost 1, ib_port_down 2, ...`` in first-seen order."""
    counts = Counter(row.kind for row in rows)
    return ", ".join(f"{kind} {count}" for kind, count in counts.items()) or "none"
