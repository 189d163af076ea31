"""``fleetwatch nodes`` and ``events``: the fleet and its journal, from the collector's API.

Beside ``incidents`` and ``actions``, over the same JSON API (``GET /api/v1/nodes``,
``/api/v1/nodes/<name>`` and ``/api/v1/events``, with ``/incidents``, ``/drains`` and
``/actions`` for what is wrong with a node and what was done); reads only, so no token is sent.

``nodes`` says in words what is wrong with each node (its REASON column); ``nodes NODE``
describes one: its state, drain, open incidents, last events and actions, then its GPUs and
ports.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.parse
from http import HTTPStatus
from typing import Any, Final, TextIO

from cli.api import ApiCallError, call, named_gpus, query_string, span
from cli.lifecycle import shown as shown_state
from cli.output import cut, gpu_names, print_json, table

MAX_LIMIT: Final = 1000  # the API's own bound on a page of events


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], api: str, api_help: str
) -> None:
    """Add ``nodes`` and ``events`` to the CLI's subcommands (``api``: see cli.conventions)."""
    del api, api_help  # --api is one of the options every API command shares
    nodes = sub.add_parser("nodes", help="nodes the collector knows, with what is wrong")
    nodes.add_argument("node", nargs="?", help="one node: incidents, drain, events, actions, GPUs")

    events = sub.add_parser("events", help="journaled hardware events, newest first")
    events.add_argument("--node", help="only this node's")
    events.add_argument("--kind", help="only this kind (gpu_lost, xid, ib_port_down, ...)")
    forms = "30m, 2h or 1d back from now, 2026-12-02T03:00 (UTC unless a zone is given), or Unix s"
    events.add_argument("--since", metavar="WHEN", help=f"only events from WHEN on: {forms}")
    events.add_argument("--until", metavar="WHEN", help="only events up to WHEN")
    events.add_argument("--limit", type=_limit, default=50, help="at most this many (1-1000)")


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
            return node(args.api, args.node, output=args.output, out=out)
        return nodes(args.api, output=args.output, out=out)
    return events(
        args.api,
        node=args.node,
        kind=args.kind,
        limit=args.limit,
        output=args.output,
        out=out,
        since=args.since,
        until=args.until,
    )


def _ago(unix: float | None, now: float) -> str:
    if not unix:
        return "-"
    return f"{span(max(now - unix, 0.0))} ago"


def _optional(api: str, path: str) -> dict[str, Any]:
    """GET ``path``; {} when the collector has no such part (no actions configured: no drains)."""
    try:
        data = call(api, "GET", path)
    except ApiCallError as exc:
        if exc.status == HTTPStatus.NOT_FOUND:
            return {}
        raise
    return data if isinstance(data, dict) else {}


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def reasons(
    summary: dict[str, Any], incidents: list[dict[str, Any]], drained_by: str | None
) -> list[str]:
    """What is wrong with a node, in words, worst first (empty: nothing)."""
    found = []
    if not summary.get("reachable", True):
        found.append("unreachable")
    if drained_by:
        found.append(f"drained ({drained_by.split(':')[0]})")
    if summary.get("gpus_lost"):
        found.append(f"{_plural(summary['gpus_lost'], 'GPU')} lost")
    if summary.get("nvlinks_down"):
        found.append(f"{_plural(summary['nvlinks_down'], 'NVLink')} down")
    if summary.get("ib_ports_down"):
        found.append(f"{_plural(summary['ib_ports_down'], 'IB port')} down")
    rules = sorted({i["rule"] for i in incidents if i.get("phase") == "firing"})
    pending = sorted({i["rule"] for i in incidents if i.get("phase") == "pending"} - set(rules))
    if rules:
        found.append("firing: " + ", ".join(rules))
    if pending:
        found.append("pending: " + ", ".join(pending))
    return found


def nodes(api: str, *, output: str, out: TextIO) -> int:
    """List every node with its state, GPUs, links and ports, what is wrong, and when heard."""
    data = call(api, "GET", "/api/v1/nodes")
    if output == "json":
        print_json(data, out)
        return 0
    rows: list[dict[str, Any]] = sorted(data.get("nodes", []), key=lambda n: n["name"])
    if not rows:
        print("no nodes", file=out)
        return 0
    open_incidents = call(api, "GET", "/api/v1/incidents?open=1&limit=1000").get("incidents", [])
    by_node: dict[str, list[dict[str, Any]]] = {}
    for incident in open_incidents:
        by_node.setdefault(incident["node"], []).append(incident)
    drained: dict[str, str] = _optional(api, "/api/v1/drains").get("drained", {})
    now = time.time()
    header = ["NODE", "STATE", "LIFECYCLE", "GPUS", "LOST", "NVLINKS DOWN", "IB PORTS"]
    header += ["IB DOWN", "SEEN"]
    header += ["AGENT", "REASON"] if output == "wide" else ["REASON"]
    shown = [header]
    for n in rows:
        why = "; ".join(reasons(n, by_node.get(n["name"], []), drained.get(n["name"]))) or "-"
        cells = [
            n["name"],
            n["state"],
            n.get("lifecycle", {}).get("state", "in_service"),
            str(n["gpus"]),
            str(n["gpus_lost"] or "-"),
            str(n["nvlinks_down"] or "-"),
            str(n["ib_ports"]),
            str(n["ib_ports_down"] or "-"),
            _ago(n.get("last_seen_unix"), now),
        ]
        cells += [n.get("agent_version") or "-", why] if output == "wide" else [cut(why, output)]
        shown.append(cells)
    table(shown, out)
    unwell = sum(n["state"] != "healthy" for n in rows)
    print(f"{len(rows)} nodes, {len(rows) - unwell} healthy", file=out)
    return 0


def node(api: str, name: str, *, output: str, out: TextIO) -> int:
    """One node described: state, drain, open incidents, last events and actions, GPUs, ports."""
    quoted = urllib.parse.quote(name, safe="")
    data = call(api, "GET", f"/api/v1/nodes/{quoted}")
    incidents = call(
        api, "GET", f"/api/v1/incidents{query_string({'open': 1, 'limit': 100, 'node': name})}"
    )["incidents"]
    recent = call(
        api, "GET", f"/api/v1/events{query_string({'order': 'desc', 'limit': 5, 'node': name})}"
    )["events"]
    done = call(api, "GET", f"/api/v1/actions{query_string({'limit': 5, 'node': name})}")["actions"]
    drains = _optional(api, f"/api/v1/drains{query_string({'node': name})}")
    drained_by = drains.get("drained", {}).get(name)
    if output == "json":
        print_json(
            {
                **data,
                "incidents": incidents,
                "recent_events": recent,
                "recent_actions": done,
                "drained_by": drained_by,
            },
            out,
        )
        return 0
    now = time.time()
    indexes = {g["uuid"]: g["index"] for g in data.get("gpus", [])}
    seen = _ago(data.get("last_seen_unix"), now)
    print(f"{data['name']}: {data['state']}, last heard {seen}", file=out)
    boot = str(data.get("boot_id") or "-")[:8]
    print(
        f"  agent {data.get('agent_version') or '-'}, driver {data.get('driver_version') or '-'}, "
        f"boot {boot}",
        file=out,
    )
    why = reasons(data | {"gpus": len(data.get("gpus", []))}, incidents, drained_by)
    print(f"  what is wrong: {'; '.join(why) if why else 'nothing'}", file=out)
    life = data.get("lifecycle") or {}
    if life.get("actor"):
        since = _ago(life.get("since_unix"), now)
        state = shown_state(life["state"])
        print(f"  lifecycle: {state} since {since}, by {life['actor']}", file=out)
    if drained_by:
        print(f"  drained by fleetwatch for {drained_by}", file=out)
    waiting = [
        w for w in drains.get("waiting", []) if isinstance(w, dict) and w.get("node") == name
    ]
    for w in waiting:
        print(f"  drain waiting: {w.get('why') or w}", file=out)
    _describe_incidents(incidents, indexes, output, out, now)
    _describe_events(recent, indexes, output, out, now)
    _describe_actions(done, output, out, now)
    _describe_hardware(data, output, out)
    return 0


def _describe_incidents(
    rows: list[dict[str, Any]], indexes: dict[str, int], output: str, out: TextIO, now: float
) -> None:
    print(f"\nopen incidents: {len(rows) or 'none'}", file=out)
    if not rows:
        return
    shown = [["SINCE", "PHASE", "SEVERITY", "RULE", "TARGET", "EVIDENCE"]]
    for r in rows:
        since = (r.get("fired_ms") or r.get("started_ms") or 0) / 1000
        evidence = gpu_names(str(r.get("evidence", "")), indexes, output)
        shown.append(
            [
                _ago(since, now),
                r["phase"],
                r["severity"],
                r["rule"],
                r["target"],
                cut(evidence, output),
            ]
        )
    table(shown, out)
    for rule in sorted({r["rule"] for r in rows}):
        runbook = next(
            (r.get("runbook") for r in rows if r["rule"] == rule and r.get("runbook")), ""
        )
        if runbook:
            print(f"  {rule} runbook: {runbook}", file=out)


def _describe_events(
    rows: list[dict[str, Any]], indexes: dict[str, int], output: str, out: TextIO, now: float
) -> None:
    print(f"\nlast events: {len(rows) or 'none'}", file=out)
    if rows:
        shown = [["WHEN", "KIND", "TARGET", "XID", "DETAIL"]]
        shown += [
            [
                _ago(e["time_ms"] / 1000, now),
                e["kind"],
                gpu_names(_target(e), indexes, output),
                str(e["xid"] or "-"),
                cut(e.get("detail", ""), output),
            ]
            for e in rows
        ]
        table(shown, out)


def _describe_actions(rows: list[dict[str, Any]], output: str, out: TextIO, now: float) -> None:
    print(f"\nlast actions: {len(rows) or 'none'}", file=out)
    if rows:
        shown = [["WHEN", "ACTION", "TARGET", "STATE", "DETAIL"]]
        shown += [
            [
                _ago((a.get("created_ms") or 0) / 1000, now),
                a["action"],
                a["target"],
                a["state"],
                cut(a.get("detail", ""), output),
            ]
            for a in rows
        ]
        table(shown, out)


def _describe_hardware(data: dict[str, Any], output: str, out: TextIO) -> None:
    gpus = [["GPU", "UUID", "BUS ID", "PRESENT", "NVLINKS DOWN", "LAST XID", "TEMP C"]]
    gpus += [
        [
            str(g["index"]),
            g["uuid"] if output == "wide" else g["uuid"][:12],
            g["pci_bus_id"],
            "yes" if g["present"] else "LOST",
            ",".join(map(str, g["nvlinks_down"])) or "-",
            str(g["last_xid"] or "-"),
            _number(g["signals"].get("temperature_celsius")),
        ]
        for g in data.get("gpus", [])
    ]
    if len(gpus) > 1:
        print(file=out)
        table(gpus, out)
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
        print(file=out)
        table(ports, out)


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
    output: str,
    out: TextIO,
    since: str | None = None,
    until: str | None = None,
) -> int:
    """The newest journaled events (of one node, of one kind, in a time span), newest first."""
    params = {"order": "desc", "limit": limit, "node": node, "kind": kind}
    params |= {"since": since, "until": until}
    data = call(api, "GET", f"/api/v1/events{query_string(params)}")
    if output == "json":
        print_json(data, out)
        return 0
    rows: list[dict[str, Any]] = data.get("events", [])
    if not rows:
        print("no events", file=out)
        return 0
    now = time.time()
    for e in rows:
        e["_target"] = _target(e)
    named_gpus(api, rows, "_target")
    shown = [["WHEN", "NODE", "KIND", "TARGET", "XID", "DETAIL"]]
    shown += [
        [
            _ago(e["time_ms"] / 1000, now),
            e["node"],
            e["kind"],
            gpu_names(e["_target"], e["_gpus"], output),
            str(e["xid"] or "-"),
            cut(e.get("detail", ""), output),
        ]
        for e in rows
    ]
    table(shown, out)
    return 0
