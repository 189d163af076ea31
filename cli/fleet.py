"""``fleetwatch nodes`` and ``events``: the fleet and its journal, from the collector's API.

Beside ``incidents`` and ``actions``, over the same JSON API (``GET /api/v1/nodes``,
``/api/v1/nodes/<name>`` and ``/api/v1/events``); reads only, so no token is sent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from typing import Any, Final, TextIO

from cli.api import EVIDENCE_WIDTH, call, span

MAX_LIMIT: Final = 1000  # the API's own bound on a page of events


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], api: str, api_help: str
) -> None:
    """Add ``nodes`` and ``events`` to the CLI's subcommands."""
    nodes = sub.add_parser("nodes", help="nodes the collector knows, with their health")
    nodes.add_argument("--api", default=api, help=api_help)
    nodes.add_argument("node", nargs="?", help="one node, GPU by GPU and port by port")
    nodes.add_argument("--json", action="store_true", help="print the API's JSON")

    events = sub.add_parser("events", help="journaled hardware events, newest first")
    events.add_argument("--api", default=api, help=api_help)
    events.add_argument("--node", help="only this node's")
    events.add_argument("--kind", help="only this kind (gpu_lost, xid, ib_port_down, ...)")
    events.add_argument("--limit", type=_limit, default=50, help="at most this many (1-1000)")
    events.add_argument("--json", action="store_true", help="print the API's JSON")


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        msg = f"--limit must be a whole number from 1 to {MAX_LIMIT}, not {text[:20]!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run ``nodes`` or ``events`` (printing to ``out``, standard output by default)."""
    out = out or sys.stdout
    if args.command == "nodes":
        if args.node:
            return node(args.api, args.node, as_json=args.json, out=out)
        return nodes(args.api, as_json=args.json, out=out)
    return events(
        args.api, node=args.node, kind=args.kind, limit=args.limit, as_json=args.json, out=out
    )


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def _ago(unix: float | None, now: float) -> str:
    if not unix:
        return "-"
    return f"{span(max(now - unix, 0.0))} ago"


def _of(bad: int, total: int) -> str:
    return f"{bad}/{total}" if bad else str(total)


def nodes(api: str, *, as_json: bool, out: TextIO) -> int:
    """List every node with its state, GPUs, links and ports, and when it was last heard."""
    data = call(api, "GET", "/api/v1/nodes")
    if as_json:
        print(json.dumps(data, indent=2), file=out)
        return 0
    rows: list[dict[str, Any]] = sorted(data.get("nodes", []), key=lambda n: n["name"])
    if not rows:
        print("no nodes", file=out)
        return 0
    now = time.time()
    table = [["NODE", "STATE", "GPUS (LOST/ALL)", "NVLINKS DOWN", "IB (DOWN/ALL)", "SEEN", "AGENT"]]
    table += [
        [
            n["name"],
            n["state"],
            _of(n["gpus_lost"], n["gpus"]),
            str(n["nvlinks_down"] or "-"),
            _of(n["ib_ports_down"], n["ib_ports"]),
            _ago(n.get("last_seen_unix"), now),
            n.get("agent_version") or "-",
        ]
        for n in rows
    ]
    _table(table, out)
    unwell = sum(n["state"] != "healthy" for n in rows)
    print(f"{len(rows)} nodes, {len(rows) - unwell} healthy", file=out)
    return 0


def node(api: str, name: str, *, as_json: bool, out: TextIO) -> int:
    """One node: its state, then a line per GPU and per IB port."""
    data = call(api, "GET", f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}")
    if as_json:
        print(json.dumps(data, indent=2), file=out)
        return 0
    seen = _ago(data.get("last_seen_unix"), time.time())
    print(f"{data['name']}: {data['state']}, last heard {seen}", file=out)
    gpus = [["GPU", "UUID", "BUS ID", "PRESENT", "NVLINKS DOWN", "LAST XID", "TEMP C"]]
    gpus += [
        [
            str(g["index"]),
            g["uuid"],
            g["pci_bus_id"],
            "yes" if g["present"] else "LOST",
            ",".join(map(str, g["nvlinks_down"])) or "-",
            str(g["last_xid"] or "-"),
            _number(g["signals"].get("temperature_celsius")),
        ]
        for g in data.get("gpus", [])
    ]
    if len(gpus) > 1:
        _table(gpus, out)
    ports = [["PORT", "STATE", "PHYS", "RATE", "DOWN EVENTS"]]
    ports += [
        [
            f"{p['device']}/{p['port']}",
            p["state"] or "-",
            p["phys_state"] or "-",
            p["rate"] or "-",
            str(p["down_events"]),
        ]
        for p in data.get("ib_ports", [])
    ]
    if len(ports) > 1:
        _table(ports, out)
    return 0


def _number(value: object) -> str:
    return f"{value:.0f}" if isinstance(value, int | float) else "-"


def _target(event: dict[str, Any]) -> str:
    target = event.get("target") or {}
    kind = target.get("kind", "")
    if kind in ("gpu", "nvlink") and target.get("index") is not None:
        gpu = f"GPU {target['gpu_uuid'] or '?'}"
        return f"{gpu} link {target['index']}" if kind == "nvlink" else gpu
    if target.get("device"):
        return f"{target['device']}/{target.get('index', '')}".rstrip("/")
    return kind or "node"


def events(  # noqa: PLR0913 - the query, and how to show it
    api: str,
    *,
    node: str | None,
    kind: str | None,
    limit: int,
    as_json: bool,
    out: TextIO,
) -> int:
    """The newest journaled events (of one node, of one kind), newest first."""
    params: dict[str, str | int] = {"order": "desc", "limit": limit}
    if node:
        params["node"] = node
    if kind:
        params["kind"] = kind
    data = call(api, "GET", f"/api/v1/events?{urllib.parse.urlencode(params)}")
    if as_json:
        print(json.dumps(data, indent=2), file=out)
        return 0
    rows: list[dict[str, Any]] = data.get("events", [])
    if not rows:
        print("no events", file=out)
        return 0
    now = time.time()
    table = [["WHEN", "NODE", "KIND", "TARGET", "XID", "DETAIL"]]
    table += [
        [
            _ago(e["time_ms"] / 1000, now),
            e["node"],
            e["kind"],
            _target(e),
            str(e["xid"] or "-"),
            str(e.get("detail", ""))[:EVIDENCE_WIDTH],
        ]
        for e in rows
    ]
    _table(table, out)
    return 0
