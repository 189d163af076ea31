"""The JSON API's reads of the fleet: nodes, events and jobs.

    GET /api/v1/nodes                 every node with a health summary
    GET /api/v1/nodes/<name>          one node, down to each NVLink and IB port
    GET /api/v1/nodes/<name>/evidence?since=
                                      the node's evidence bundle, a gzip'd tar
                                      (:mod:`collector.model.evidence`; since: 7 days back)
    GET /api/v1/events?node=&kind=&since=&until=&after=&limit=&order=asc|desc
                                      journaled events, paged by journal id
    GET /api/v1/jobs?node=            training jobs (with a rank on the node) with their
                                      throughput, MFU, stragglers, drops
    GET /api/v1/jobs/<id>             one job, with each rank's node, GPU and compute-time ratio,
                                      and the evidence last gathered (its ranks' stacks grouped)

Their query parameters are checked and read by :mod:`collector.api.query`.
"""

from __future__ import annotations

import threading
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

from collector.api.incidents import MAX_LIMIT, ApiError
from collector.api.query import LIFECYCLE, NODES_PREFIX
from collector.model.evidence import DEFAULT_SINCE_S, UnknownNodeError, build_bundle
from collector.model.node_states import NodeFlags, node_state
from fleetwatch.model import EventKind

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.api.query import Params
    from collector.jobs.book import JobBook
    from collector.model.evidence_pack import Bundle
    from collector.model.fleet import FleetModel
    from collector.model.lifecycle import Lifecycle
    from collector.model.state import NodeState
    from collector.store.events import EventReader, EventRow
    from collector.store.lifecycle import TransitionRow

KINDS: Final = frozenset(k.value for k in EventKind)
# Evidence bundles built at once: each holds the HTTP thread for a few milliseconds (a quiet
# node) to a second or two (one at its limits), and shares the CPU with the event loop.
MAX_BUNDLES: Final = 2
# The lifecycle of a node that never moved.
_NEVER_MOVED: Final = {
    "state": "in_service",
    "since_unix": None,
    "actor": "",
    "incident": "",
    "reason": "",
}


def node_summary(node: NodeState, flags: NodeFlags | None = None) -> dict[str, Any]:
    """The short form used by ``/api/v1/nodes``; ``state`` as in ``fleetwatch_node_state``."""
    return {
        "name": node.name,
        "state": node_state(node, flags or NodeFlags()),
        "boot_id": node.boot_id,
        "reachable": node.reachable,
        "connected": node.connected,
        "last_seen_unix": round(node.last_seen_unix, 3),
        "agent_version": node.agent_version,
        "driver_version": node.driver_version,
        "gpus": len(node.gpus),
        "gpus_lost": sum(1 for g in node.gpus.values() if not g.present),
        "nvlinks_down": sum(g.nvlinks_down for g in node.gpus.values()),
        "ib_ports": len(node.ports),
        "ib_ports_down": sum(1 for p in node.ports.values() if p.state and not p.up),
        "events": dict(node.events),
    }


def lifecycle_json(row: TransitionRow | None) -> dict[str, Any]:
    """Where a node stands: its state, since when, who or what put it there, and why."""
    if row is None:
        return dict(_NEVER_MOVED)
    return {
        "state": row.state,
        "since_unix": row.at_ms / 1000,
        "actor": row.actor,
        "incident": row.incident,
        "reason": row.reason,
    }


def node_detail(node: NodeState, flags: NodeFlags | None = None) -> dict[str, Any]:
    """The long form used by ``/api/v1/nodes/<name>``."""
    detail = node_summary(node, flags)
    detail["gpus"] = [
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
            "last_xid": g.last_xid or None,
            "signals": dict(sorted(g.signals.items())),
            "nvlinks": [
                {"link": link, **dict(sorted(values.items()))}
                for link, values in sorted(g.link_signals.items())
            ],
        }
        for g in sorted(node.gpus.values(), key=lambda g: g.index)
    ]
    detail["ib_ports"] = [
        {
            "device": p.device,
            "port": p.port,
            "rate": p.rate,
            "link_layer": p.link_layer,
            "state": p.state,
            "phys_state": p.phys_state,
            "link_downed": p.link_downed,
            "down_events": p.down_events,
            "signals": dict(sorted(p.signals.items())),
        }
        for p in node.ports.values()
    ]
    detail["other_signals"] = dict(node.other)
    return detail


def event_json(row: EventRow) -> dict[str, Any]:
    """One journaled event as JSON."""
    return {
        "id": row.id,
        "node": row.node,
        "boot_id": row.boot_id or None,
        "seq": row.seq,
        "time_ms": row.time_ms,
        "received_ms": row.received_ms,
        "kind": row.kind,
        "target": {
            "kind": row.target_kind,
            "gpu_uuid": row.gpu_uuid or None,
            "index": row.target_index,
            "device": row.device or None,
        },
        "xid": row.xid or None,
        "xid_class": row.xid_class or None,
        "detail": row.detail,
    }


class FleetReads:
    """Answers the GETs of nodes, events and jobs (from the HTTP thread)."""

    __slots__ = ("_bundles", "_fleet", "_jobs", "_journal", "_lifecycle", "_node_flags")

    def __init__(
        self,
        *,
        fleet: FleetModel,
        journal: EventReader,
        node_flags: Callable[[], NodeFlags],
        jobs: JobBook | None,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        """Read ``fleet`` and ``journal``; ``node_flags`` says which nodes are drained.

        ``lifecycle`` says where each node stands (None: each reads as in service).
        """
        self._fleet = fleet
        self._journal = journal
        self._node_flags = node_flags
        self._jobs = jobs
        self._bundles = threading.BoundedSemaphore(MAX_BUNDLES)
        self._lifecycle = lifecycle

    def get(  # noqa: PLR0911 - one answer per endpoint
        self, name: str, path: str, params: Params
    ) -> tuple[HTTPStatus, object]:
        """Answer endpoint ``name`` (as :data:`collector.api.query.TAKES` names it)."""
        if name == "/api/v1/nodes":
            nodes = self._fleet.snapshot()
            flags = self._node_flags()
            listed = [self._with_lifecycle(node_summary(n, flags)) for n in nodes.values()]
            return HTTPStatus.OK, {"nodes": listed}
        if name == "/api/v1/nodes/<name>":
            node_name = unquote(path.removeprefix("/api/v1/nodes/"))
            node = self._fleet.snapshot().get(node_name)
            if node is None:
                return HTTPStatus.NOT_FOUND, {"error": f"no node named {node_name!r}"}
            return HTTPStatus.OK, self._with_lifecycle(node_detail(node, self._node_flags()))
        if name == LIFECYCLE:
            return self.lifecycle(path, params)
        if name == "/api/v1/events":
            return HTTPStatus.OK, self.events(params)
        if name in ("/api/v1/jobs", "/api/v1/jobs/<id>"):
            job_id = unquote(path.removeprefix("/api/v1/jobs").lstrip("/"))
            return self.jobs(job_id, params.text("node"))
        return HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {path[:200]}"}

    def _with_lifecycle(self, shown: dict[str, Any]) -> dict[str, Any]:
        """``shown`` (a node's JSON) with where the node stands in its lifecycle."""
        shown["lifecycle"] = lifecycle_json(
            self._lifecycle.row(shown["name"]) if self._lifecycle is not None else None
        )
        return shown

    def lifecycle(self, path: str, params: Params) -> tuple[HTTPStatus, object]:
        """``/api/v1/nodes/<name>/lifecycle``: where the node stands, and its moves.

        Oldest first, from ``since`` (every one kept, by default).
        """
        node = unquote(path.removeprefix("/api/v1/nodes/").removesuffix("/lifecycle"))
        if node not in self._fleet.snapshot() and (
            self._lifecycle is None or self._lifecycle.row(node) is None
        ):
            return HTTPStatus.NOT_FOUND, {"error": f"no node named {node!r}"}
        since_ms = params.time_ms("since") or 0
        moves = self._journal.read_lifecycle(lambda s: s.history(node, since_ms))
        now = self._lifecycle.row(node) if self._lifecycle is not None else None
        return HTTPStatus.OK, {
            "node": node,
            "lifecycle": lifecycle_json(now),
            "moves": [m.to_json() for m in moves],
        }

    def evidence(self, path: str, params: Params) -> Bundle:
        """``/api/v1/nodes/<name>/evidence``: the node's bundle from ``since`` (7 days back).

        ApiError: 404 for a node neither the fleet nor the journal knows, 503 while
        :data:`MAX_BUNDLES` others are being built.
        """
        node = unquote(path.removeprefix(NODES_PREFIX).removesuffix("/evidence"))
        now_ms = round(params.now * 1000)
        since_ms = params.time_ms("since")
        if since_ms is None:
            since_ms = now_ms - DEFAULT_SINCE_S * 1000
        if not self._bundles.acquire(blocking=False):
            msg = f"{MAX_BUNDLES} evidence bundles are being built; ask again in a few seconds"
            raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, msg)
        try:
            return build_bundle(self._journal, self._fleet, node, since_ms=since_ms, now_ms=now_ms)
        except UnknownNodeError as exc:
            raise ApiError(HTTPStatus.NOT_FOUND, str(exc)) from exc
        finally:
            self._bundles.release()

    def events(self, params: Params) -> dict[str, Any]:
        """``/api/v1/events``: the page of events the parameters select."""
        kind = params.choice("kind", KINDS, None)
        order = params.choice("order", ("asc", "desc"), "asc")
        since, until = params.window()
        rows = self._journal.events(
            node=params.text("node"),
            kind=kind,
            after_id=params.integer("after", 0, 0, 2**62),
            limit=params.integer("limit", 100, 1, MAX_LIMIT),
            newest_first=order == "desc",
            since_ms=since,
            until_ms=until,
        )
        return {
            "events": [event_json(r) for r in rows],
            "last_id": rows[-1].id if rows else None,
        }

    def jobs(self, job_id: str, node: str | None) -> tuple[HTTPStatus, object]:
        """Every job (those with a rank on ``node``, when given), or the one ``job_id`` names."""
        book = self._jobs
        jobs = book.summaries() if book is not None else []
        if not job_id:
            if node is not None and book is not None:
                jobs = [j for j in jobs if any(r["node"] == node for r in book.ranks(j["id"]))]
            return HTTPStatus.OK, {"jobs": jobs}
        for job in jobs:
            if job["id"] == job_id and book is not None:
                ranks = book.ranks(job_id)
                evidence = book.evidence_of(job_id)
                return HTTPStatus.OK, {**job, "rank_detail": ranks, "evidence": evidence}
        return HTTPStatus.NOT_FOUND, {"error": f"no job {job_id!r}"}
