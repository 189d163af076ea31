"""The evidence bundle: what is known about one node, read for a vendor's RMA or a ticket.

``fleetwatch evidence NODE`` and ``GET /api/v1/nodes/<node>/evidence`` give it: the node's
inventory (its last Hello, the fleet model's view of it, pre-flight's version answers), its
journaled events and the kernel's text of them, its incidents and actions, and the pre-flight
runs that qualified it, each since a time (:data:`DEFAULT_SINCE_S` back by default), packed by
:mod:`collector.model.evidence_pack` into one gzip'd tar with a manifest.

:func:`build_bundle` reads the journal (on the reader's own connections) and the fleet model
(one node copied under its lock), and blocks while it does: call it off the event loop (the
HTTP thread does; an action would use ``asyncio.to_thread``). It knows nothing of HTTP. Each
read asks for at most one row more than its limit, so a flapping node's history costs what the
limits allow, and the manifest can say what was cut.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

from collector.model.evidence_pack import BundleLimits, Evidence, Member, pack
from fleetwatch.model import EventKind
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Iterable

    from collector.model.evidence_pack import Bundle
    from collector.model.fleet import FleetModel
    from collector.model.state import NodeState
    from collector.store.events import EventReader, EventRow, NodeRow
    from collector.store.preflight import PreflightStore, ResultRow, RunRow

__all__ = [
    "DEFAULT_SINCE_S",
    "KERNEL_KINDS",
    "UnknownNodeError",
    "build_bundle",
    "gather",
    "inventory",
]

DEFAULT_SINCE_S: Final = 7 * 86_400
# Events whose text is what the node's kernel logged (or the agent's one line about it).
KERNEL_KINDS: Final = tuple(
    k.value
    for k in (
        EventKind.XID,
        EventKind.SXID,
        EventKind.SXID_FATAL,
        EventKind.GPU_LOST,
        EventKind.PCIE_AER,
        EventKind.PCIE_AER_UNRECOVERED,
        EventKind.PCI_RECOVERY,
        EventKind.MACHINE_CHECK,
        EventKind.MACHINE_CHECK_UNCORRECTED,
        EventKind.FS_ERROR,
        EventKind.FS_READ_ONLY,
    )
)
# Pre-flight checks whose text answers are inventory.
_VERSION_CHECKS: Final = frozenset(
    {"driver_version", "cuda_version", "vbios_version", "nic_firmware"}
)


class UnknownNodeError(LookupError):
    """Neither the fleet model nor the journal knows the node."""


def build_bundle(  # noqa: PLR0913 - what is read, and the bundle's node, window and bounds
    reader: EventReader,
    fleet: FleetModel | None,
    node: str,
    *,
    since_ms: int,
    now_ms: int,
    limits: BundleLimits | None = None,
) -> Bundle:
    """Read and pack ``node``'s evidence since ``since_ms`` (blocking: not on the event loop).

    Raises:
        UnknownNodeError: neither ``fleet`` nor the journal knows ``node``.
    """
    return pack(gather(reader, fleet, node, since_ms=since_ms, limits=limits), now_ms)


def _newest(rows: list[Any], limit: int) -> Member:
    """``rows`` (newest first, at most ``limit + 1``) as a Member, oldest first."""
    return Member(list(reversed(rows[:limit])), truncated=len(rows) > limit)


def gather(
    reader: EventReader,
    fleet: FleetModel | None,
    node: str,
    *,
    since_ms: int,
    limits: BundleLimits | None = None,
) -> Evidence:
    """Read what a bundle of ``node`` holds from the journal and the fleet model."""
    lim = limits or BundleLimits()
    row = reader.node_row(node)
    live = fleet.read_node(node, lambda n, _c, _u: n.copy()) if fleet is not None else None
    if row is None and live is None:
        msg = f"no node named {node!r} in the fleet or the journal"
        raise UnknownNodeError(msg)
    events = _newest(
        reader.events(node=node, since_ms=since_ms, limit=lim.events + 1, newest_first=True),
        lim.events,
    )
    kernel = _kernel_events(reader, node, since_ms, events, lim.kernel_lines)
    incidents = reader.read(
        lambda s: s.incidents(node=node, since_ms=since_ms, limit=lim.incidents + 1)
    )
    incidents.sort(key=lambda i: (i.started_ms, i.id), reverse=True)
    actions = reader.read(lambda s: s.actions(node=node, since_ms=since_ms, limit=lim.actions + 1))

    def runs_of(store: PreflightStore) -> list[tuple[RunRow, list[ResultRow]]]:
        runs = store.runs(limit=lim.preflight_runs + 1, node=node)
        return [(r, store.results(r.id, node)) for r in runs if r.started_ms >= since_ms]

    runs = reader.read_preflight(runs_of)
    preflight = [
        {
            "run": run.to_json(),
            "node_verdict": (run.node_verdicts or {}).get(
                node, "could_not_run" if run.verdict else "running"
            ),
            "results": [r.to_json() for r in results],
        }
        for run, results in runs
    ]
    return Evidence(
        node=node,
        since_ms=since_ms,
        inventory=inventory(node, row, live, runs),
        events=events,
        kernel=kernel,
        incidents=_newest(incidents, lim.incidents),
        actions=_newest(actions, lim.actions),
        preflight=_newest(preflight, lim.preflight_runs),
        limits=lim,
    )


def _kernel_events(
    reader: EventReader, node: str, since_ms: int, events: Member, limit: int
) -> Member:
    """The node's events of :data:`KERNEL_KINDS` that carry a text, newest ``limit``.

    Taken from ``events`` when it holds every event of the window, else read kind by kind, so
    that a flood of link flaps cannot push the kernel's lines out.
    """
    if not events.truncated:
        found = [e for e in reversed(events.rows) if e.kind in KERNEL_KINDS and e.detail]
        return _newest(found, limit)
    rows: list[EventRow] = []
    for kind in KERNEL_KINDS:
        rows += reader.events(
            node=node, kind=kind, since_ms=since_ms, limit=limit + 1, newest_first=True
        )
    found = sorted((e for e in rows if e.detail), key=lambda e: e.id, reverse=True)
    return _newest(found, limit)


def _finite(values: dict[str, Any]) -> dict[str, Any]:
    """Signals, sorted, with a value JSON cannot hold (NaN, infinity) as None."""
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v
        for k, v in sorted(values.items())
    }


def _hello(row: NodeRow | None) -> pb.Hello | None:
    if row is None:
        return None
    try:
        return pb.Hello.FromString(row.hello)
    except Exception:  # noqa: BLE001 - a row that does not parse is a Hello we do not have
        return None


def inventory(
    node: str,
    row: NodeRow | None,
    live: NodeState | None,
    runs: Iterable[tuple[RunRow, list[ResultRow]]] = (),
) -> dict[str, Any]:
    """What the node is made of: its last Hello, the model's view, pre-flight's answers.

    ``live`` (the fleet model's state) wins over the journal's Hello where both say a thing;
    the newest pre-flight answer of a version check gives a GPU's VBIOS, an HCA's firmware,
    the driver's and CUDA's versions.
    """
    hello = _hello(row)
    versions: dict[tuple[str, str], str] = {}
    for _run, results in runs:  # newest run first: the first answer seen is kept
        for r in results:
            if r.node == node and r.check in _VERSION_CHECKS and r.text:
                versions.setdefault((r.check, r.component), r.text)
    gpus: list[dict[str, Any]] = []
    if live is not None:
        gpus = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "pci_bus_id": g.pci_bus_id,
                "model": g.model,
                "present": g.present,
                "nvlink_count": g.nvlink_count,
                "nvlinks_down": sorted(link for link, up in g.nvlink_up.items() if not up),
                "pcie_replay_count": g.pcie_replay_count,
                "xid_counts": {str(x): c for x, c in sorted(g.xid_counts.items())},
                "signals": _finite(g.signals),
            }
            for g in sorted(live.gpus.values(), key=lambda g: g.index)
        ]
    elif hello is not None:
        gpus = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "pci_bus_id": g.pci_bus_id,
                "model": g.model,
                "nvlink_count": g.nvlink_count,
            }
            for g in sorted(hello.gpus, key=lambda g: g.index)
        ]
    for gpu in gpus:
        gpu["serial"] = None  # no agent reads it (the NVML probe masks what names one GPU)
        gpu["vbios_version"] = versions.get(("vbios_version", f"gpu:{gpu['index']}"))
    ports: list[dict[str, Any]] = []
    if live is not None:
        ports = [
            {
                "device": p.device,
                "port": p.port,
                "rate": p.rate,
                "link_layer": p.link_layer,
                "state": p.state,
                "phys_state": p.phys_state,
                "link_downed": p.link_downed,
                "down_events": p.down_events,
                "signals": _finite(p.signals),
            }
            for p in sorted(live.ports.values(), key=lambda p: (p.device, p.port))
        ]
    elif hello is not None:
        ports = [
            {"device": p.device, "port": p.port, "rate": p.rate, "link_layer": p.link_layer}
            for p in sorted(hello.ib_ports, key=lambda p: (p.device, p.port))
        ]
    for port in ports:
        port["firmware"] = versions.get(("nic_firmware", f"nic:{port['device']}"))
    signals = _finite(live.signals) if live is not None else {}
    return {
        "node": node,
        "boot_id": live.boot_id if live is not None else (hello.boot_id if hello else None),
        "agent_version": (live.agent_version if live else hello.agent_version if hello else None)
        or None,
        "driver_version": versions.get(("driver_version", "node"))
        or (live.driver_version if live else hello.driver_version if hello else None)
        or None,
        "nvml_version": (hello.nvml_version if hello else "") or None,
        "cuda_version": versions.get(("cuda_version", "node")),
        "protocol_version": hello.protocol_version if hello else None,
        "hello_unix_ms": hello.time_unix_ms if hello else None,
        "connected": live.connected if live is not None else None,
        "reachable": live.reachable if live is not None else (row.reachable if row else None),
        "last_seen_ms": round(live.last_seen_unix * 1000)
        if live is not None
        else (row.last_seen_ms if row else None),
        "collector": (row.collector if row else "") or None,
        "gpus": gpus,
        "ib_ports": ports,
        "bmc": {k: v for k, v in signals.items() if k.startswith("bmc_")},
        "signals": {k: v for k, v in signals.items() if not k.startswith("bmc_")},
        "in_fleet_model": live is not None,
    }
