"""``fleetwatch preflight run|show|history``: qualify nodes through the collector's API.

``run`` asks the collector to plan and start a run (``POST /api/v1/preflight``), waits for it to
finish, prints a table and exits as a Slurm prolog or health check reads it: 0 pass (warnings
included), 1 fail, 2 could not run (the collector unreachable, a node that never answered, a
tool that crashed). ``--dry-run`` prints the plan and starts nothing. ``show`` prints a past run
(the newest by default) and exits by its verdict; ``history`` lists runs.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

from cli.api import ApiCallError, call
from fleetwatch.preflight.vocabulary import EXIT_COULD_NOT_RUN, EXIT_FAIL, EXIT_PASS

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

POLL_S: Final = 1.0
WAIT_S: Final = 6 * 3600.0
REASON_WIDTH: Final = 90
_SHOWN_PER_NODE: Final = 4


def exit_status(verdict: str) -> int:
    """0 pass or warn, 1 fail, 2 could not run (or unknown)."""
    if verdict in ("pass", "warn"):
        return EXIT_PASS
    return EXIT_FAIL if verdict == "fail" else EXIT_COULD_NOT_RUN


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], api_default: str) -> None:
    """Add ``preflight`` and its three subcommands to the ``fleetwatch`` parser."""
    api_help = "the collector's HTTP API (default $FLEETWATCH_API or http://127.0.0.1:9470)"
    pre = sub.add_parser("preflight", help="qualify nodes before a job: run, show, history")
    pre.add_argument("--api", default=api_default, help=api_help)
    pre.add_argument("--json", action="store_true", help="print the API's JSON")
    pre.add_argument(
        "--token-file", type=Path, metavar="FILE", help="the API token (else $FLEETWATCH_API_TOKEN)"
    )
    kinds = pre.add_subparsers(dest="preflight_command", required=True)
    run = kinds.add_parser("run", help="run checks on nodes; exit 0 pass, 1 fail, 2 could not run")
    run.add_argument("--level", choices=("quick", "standard", "full"), default="quick")
    run.add_argument(
        "--nodes", default="all", metavar="EXPR", help="all, a,b,c or a hostlist gpu-[01-16]"
    )
    run.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    run.add_argument(
        "--wait", type=float, default=WAIT_S, metavar="S", help="give up waiting after S seconds"
    )
    show = kinds.add_parser("show", help="one run's table (default: the newest); exit by verdict")
    show.add_argument("run", nargs="?", default="latest", metavar="RUN")
    history = kinds.add_parser("history", help="past runs, newest first")
    history.add_argument("--node", help="only runs that qualified this node")
    history.add_argument("--limit", type=int, default=20)


def run_command(args: argparse.Namespace, token: Callable[[], str | None], out: TextIO) -> int:
    """Run the subcommand ``args`` names; the exit status."""
    if args.preflight_command == "run":
        try:
            tok = token()
        except ApiCallError as exc:
            print(f"fleetwatch preflight: {exc}", file=out)
            return EXIT_COULD_NOT_RUN
        return run(
            args.api,
            level=args.level,
            nodes=args.nodes,
            dry_run=args.dry_run,
            wait_s=args.wait,
            as_json=args.json,
            out=out,
            token=tok,
        )
    if args.preflight_command == "show":
        return show(args.api, args.run, as_json=args.json, out=out)
    return history(args.api, node=args.node, limit=args.limit, as_json=args.json, out=out)


def run(  # noqa: PLR0913 - the run's shape and where to print
    api: str,
    *,
    level: str,
    nodes: str,
    dry_run: bool,
    out: TextIO,
    wait_s: float = WAIT_S,
    as_json: bool = False,
    token: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Start a run and wait for it; print its table; the exit status (2 on any API failure)."""
    body = {"level": level, "nodes": nodes, "dry_run": dry_run}
    try:
        started = call(api, "POST", "/api/v1/preflight", body, token=token)
    except ApiCallError as exc:
        print(f"fleetwatch preflight: could not run: {exc}", file=out)
        return EXIT_COULD_NOT_RUN
    if dry_run:
        if as_json:
            print(json.dumps(started, indent=2), file=out)
        else:
            print_plan(started["plan"], out)
        return EXIT_PASS
    run_id = started["run_id"]
    deadline = time.monotonic() + wait_s
    while True:
        try:
            detail = call(api, "GET", f"/api/v1/preflight/{urllib.parse.quote(run_id)}")
        except ApiCallError as exc:
            print(f"fleetwatch preflight: lost the collector during {run_id}: {exc}", file=out)
            return EXIT_COULD_NOT_RUN
        if detail["run"]["verdict"] != "running":
            break
        if time.monotonic() > deadline:
            print(f"fleetwatch preflight: {run_id} still running after {wait_s:g} s", file=out)
            return EXIT_COULD_NOT_RUN
        sleep(POLL_S)
    return print_detail(detail, out, as_json=as_json)


def show(api: str, run_id: str, *, as_json: bool, out: TextIO) -> int:
    """Print one run; exit by its verdict."""
    try:
        detail = call(api, "GET", f"/api/v1/preflight/{urllib.parse.quote(run_id)}")
    except ApiCallError as exc:
        print(f"fleetwatch preflight show: {exc}", file=out)
        return EXIT_COULD_NOT_RUN
    return print_detail(detail, out, as_json=as_json)


def history(api: str, *, node: str | None, limit: int, as_json: bool, out: TextIO) -> int:
    """List runs, newest first."""
    query = urllib.parse.urlencode({"limit": limit, **({"node": node} if node else {})})
    data = call(api, "GET", f"/api/v1/preflight?{query}")
    if as_json:
        print(json.dumps(data, indent=2), file=out)
        return EXIT_PASS
    rows = [["RUN", "LEVEL", "NODES", "VERDICT", "STARTED (UTC)", "SUMMARY"]]
    for r in data.get("runs", []):
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["started_ms"] / 1000))
        rows.append(
            [
                r["id"],
                r["level"],
                str(len(r["nodes"])),
                r["verdict"],
                started,
                (r.get("detail") or r.get("round") or "")[:REASON_WIDTH],
            ]
        )
    _table(rows, out)
    return EXIT_PASS


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        line = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row))
        print(line.rstrip(), file=out)


def print_plan(plan: dict[str, Any], out: TextIO) -> None:
    """The rounds a run would take, node by node."""
    print(
        f"plan {plan['run_id']}: level {plan['level']}, {len(plan['nodes'])} nodes, "
        f"{len(plan['rounds'])} rounds",
        file=out,
    )
    for index, rnd in enumerate(plan["rounds"], start=1):
        print(f"round {index}: {rnd['name']} (up to {rnd['timeout_s']:g} s)", file=out)
        for node, task in rnd["nodes"].items():
            parts = [", ".join(task["checks"])]
            parts += [
                f"{g['check']} rank {g['rank']} of {len(g['nodes'])} at {g['rendezvous']}"
                for g in task.get("groups", [])
            ]
            parts += [
                f"ib_write_bw {t['rail']} {t['role']} with {t['peer']}:{t['port']}"
                for t in task.get("ib_write_bw", [])
            ]
            print(f"  {node}: " + "; ".join(parts), file=out)


def print_detail(detail: dict[str, Any], out: TextIO, *, as_json: bool = False) -> int:
    """A run's table: each node, its verdict and what failed; then the blame; exit by verdict."""
    run_row = detail["run"]
    verdict = run_row["verdict"]
    if as_json:
        print(json.dumps(detail, indent=2), file=out)
        return exit_status(verdict)
    print(
        f"pre-flight {run_row['id']} ({run_row['level']}, {len(run_row['nodes'])} nodes): "
        f"{verdict.upper()}",
        file=out,
    )
    bad: dict[str, list[dict[str, Any]]] = {}
    for r in detail.get("results", []):
        if r["verdict"] != "pass":
            bad.setdefault(r["node"], []).append(r)
    rows = [["NODE", "VERDICT", "CHECKS", "WHAT"]]
    for node, info in sorted(detail.get("nodes", {}).items()):
        checks = info.get("checks", {})
        failing = [
            r for r in bad.get(node, []) if not r["component"].startswith(("nodes:", "rail:"))
        ]
        passed = sum(1 for v in checks.values() if v == "pass")
        what = "; ".join(_why(r) for r in failing[:_SHOWN_PER_NODE])
        if len(failing) > _SHOWN_PER_NODE:
            what += f"; and {len(failing) - _SHOWN_PER_NODE} more"
        rows.append([node, info["verdict"], f"{passed}/{len(checks)} pass", what or "-"])
    _table(rows, out)
    _print_across(bad, run_row, out)
    return exit_status(verdict)


def _print_across(
    bad: dict[str, list[dict[str, Any]]], run_row: dict[str, Any], out: TextIO
) -> None:
    shared = [
        r
        for rs in bad.values()
        for r in rs
        if r["component"].startswith(("nodes:", "rail:"))
        and r["verdict"] in ("fail", "could_not_run")
    ]
    if shared:
        print("across nodes:", file=out)
        for r in shared[:12]:
            print(f"  {r['node']}: {_why(r)}", file=out)
    suspects = run_row.get("suspects") or []
    if suspects:
        print("blamed:", file=out)
        for s in suspects:
            where = s["node"] or ", ".join(s.get("nodes", []))
            print(f"  {s['kind']} {s['component']} ({where}): {s['reason']}", file=out)
    if run_row.get("detail"):
        print(run_row["detail"], file=out)


def _why(r: dict[str, Any]) -> str:
    if r.get("error") or not r.get("reason"):
        return f"{r['check']} {r['component']}: {r.get('error') or r['verdict']}"[:REASON_WIDTH]
    return str(r["reason"])[:REASON_WIDTH]
