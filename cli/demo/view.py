"""Text rendering for the demo: fleet status, events, incidents, actions and the summary."""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from collector.model.state import NodeState
    from collector.store.events import EventRow
    from collector.store.incidents import ActionRow, IncidentRow


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


def fleet_line(elapsed_s: float, nodes: dict[str, NodeState], *, firing: int = 0) -> str:
    """One line of fleet health, with how many incidents fire."""
    reachable = sum(1 for n in nodes.values() if n.reachable)
    gpus = [g for n in nodes.values() for g in n.gpus.values()]
    ports = [p for n in nodes.values() for p in n.ports.values()]
    events = sum(sum(n.events.values()) for n in nodes.values())
    return (
        f"[{elapsed_s:5.1f}s] nodes up {reachable}/{len(nodes)} | "
        f"GPUs present {sum(g.present for g in gpus)}/{len(gpus)} | "
        f"NVLinks down {sum(g.nvlinks_down for g in gpus)} | "
        f"IB ports up {sum(p.up for p in ports)}/{len(ports)} | events {events} | "
        f"incidents firing {firing}"
    )


def job_line(elapsed_s: float | None, job: dict[str, Any]) -> str:
    """One line about a training job: throughput, MFU, stragglers, a drop and its cause."""
    when = f"[{elapsed_s:5.1f}s] " if elapsed_s is not None else ""
    parts = [
        (
            f"{when}job {job['id']} step {job['step']}: {job['tokens_per_s']:,.0f} tokens/s, "
            f"MFU {job['mfu']:.0%}, ETTR {job['ettr']:.0%}"
        ),
    ]
    state = job.get("state", "running")
    if state in {"hung", "failed"}:
        culprits = job.get("culprits") or []
        held = f": {culprits[0]}" if culprits else ": no rank stands out"
        parts.append(f"{state.upper()}{held}")
    if job.get("restarts"):
        parts.append(f"restarts {job['restarts']}")
    if job["stragglers"]:
        parts.append(
            f"stragglers on {', '.join(job['straggler_nodes'])} "
            f"(-{job['lost_gpu_hours_per_hour']:.1f} GPU-h/h)"
        )
    if job["drop"]:
        suspects = ", ".join(job["suspects"][:3]) or "no node"
        parts.append(f"throughput -{job['drop_share']:.0%} ({job['drop_cause']}: {suspects})")
    return " | ".join(parts)


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


def node_table(
    nodes: dict[str, NodeState], states: dict[str, str], lifecycle: dict[str, str] | None = None
) -> list[str]:
    """A row per node: its state, lifecycle, GPUs, NVLinks, IB ports and problems.

    ``states`` as ``fleetwatch_node_state`` says them, ``lifecycle`` as the node's lifecycle does
    (None or a node left out: in service).
    """
    head = f"  {'node':<9}{'state':<13}{'lifecycle':<13}{'GPUs':<7}{'NVL down':<10}{'IB up':<7}"
    lines = [head + "problems"]
    for node in sorted(nodes.values(), key=lambda n: n.name):
        state = states.get(node.name, "")
        state = state.upper() if state == "unreachable" else state
        state += " " * (13 - len(state)) + f"{(lifecycle or {}).get(node.name, 'in_service'):<13}"
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
    return count_by(row.kind for row in rows)


# ---- incidents and actions --------------------------------------------------------------------

FINAL_STATES: Final = frozenset(
    {"succeeded", "failed", "skipped", "deferred", "dry_run", "shadow", "refused"}
)
_DELIVERED: Final = re.compile(r"[\w .-]+: delivered \(HTTP (\d+)\)")
DETAIL_WIDTH: Final = 70


def short_detail(detail: str) -> str:
    """An action's outcome in a few words: ``webhook 200`` for a delivered webhook."""
    delivered = _DELIVERED.fullmatch(detail)
    return f"webhook {delivered[1]}" if delivered else detail


def _brief(row: ActionRow) -> str:
    detail = short_detail(row.detail)
    return f"{row.action} {row.state}" + (f" ({detail})" if detail else "")


def _note(row: IncidentRow) -> str:
    if row.suppressed_by:
        return f" [suppressed by {row.suppressed_by}]"
    if row.silenced_by:
        return f" [silenced by {row.silenced_by}]"
    return " [escalated]" if row.escalated else ""


def incident_line(
    elapsed_s: float, word: str, row: IncidentRow, actions: Sequence[ActionRow]
) -> str:
    """``[ 4.3s] FIRING   critical gpu_lost node-01/gpu/3 → drain_node succeeded (webhook 200)``."""
    done = f" → {', '.join(_brief(a) for a in actions)}" if actions else ""
    return (
        f"[{elapsed_s:5.1f}s] {word:<8} {row.severity:<8} {row.rule} {row.target}{_note(row)}{done}"
    )


def action_line(elapsed_s: float, row: ActionRow) -> str:
    """An action that changed after its incident fired (a drain that waited, then ran)."""
    rule = row.incident_id.split(":", 1)[0]
    return f"[{elapsed_s:5.1f}s] ACTION   {_brief(row)} for {rule} {row.target}"


def dropped_line(elapsed_s: float, row: IncidentRow, for_s: float) -> str:
    """A pending incident whose condition cleared before its ``for`` was up: no action."""
    return (
        f"[{elapsed_s:5.1f}s] dropped  {row.severity:<8} {row.rule} {row.target} "
        f"(cleared before its for: {for_s:g}s was up; nothing done)"
    )


def _at(ms: int | None, t0: float) -> str:
    return "-" if ms is None else f"{ms / 1000 - t0:.1f}s"


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _cut(text: str, width: int = DETAIL_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def incident_table(rows: Sequence[IncidentRow], t0: float) -> list[str]:
    """Incidents oldest first; times are seconds into the demo (``t0``: its start, Unix s)."""
    head = ["started", "fired", "ended", "state", "severity", "rule", "target", "evidence"]
    return _columns(
        [head]
        + [
            [
                _at(row.started_ms, t0),
                _at(row.fired_ms, t0),
                _at(row.resolved_ms, t0),
                row.phase + _note(row),
                row.severity,
                row.rule,
                row.target,
                _cut(row.evidence, 60),
            ]
            for row in sorted(rows, key=lambda r: (r.started_ms, r.id))
        ],
    )


def action_table(rows: Sequence[ActionRow], t0: float) -> list[str]:
    """Actions in the order they were decided, with their outcome."""
    head = ["decided", "ended", "action", "target", "state", "outcome", "rule"]
    return _columns(
        [head]
        + [
            [
                _at(row.created_ms, t0),
                _at(row.finished_ms, t0),
                row.action,
                row.target,
                row.state,
                _cut(row.detail),
                row.incident_id.split(":", 1)[0],
            ]
            for row in sorted(rows, key=lambda r: r.id)
        ],
    )


def count_by(values: Iterable[str]) -> str:
    """``deferred 1, succeeded 5``, by name: the same run reads the same whatever came first."""
    return ", ".join(f"{k} {n}" for k, n in sorted(Counter(values).items())) or "none"
