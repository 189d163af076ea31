"""``fleetwatch lifecycle NODE [repair|repaired|rma]``: where a node stands, and moving it.

Without a move it prints the node's lifecycle state (in service, suspect, drained, in repair,
re-qualifying, RMA), since when and why, then its moves, oldest first (``GET
/api/v1/nodes/<node>/lifecycle``). With one, it asks the collector to move it (``POST`` the same
path, a change: the API token is sent): ``repair`` when work on it starts, ``repaired`` when it
is fixed (a node fleetwatch drained is released), ``rma`` when it goes back to the vendor.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Final, TextIO

from cli.api import call, read_token
from cli.output import print_json, table

if TYPE_CHECKING:
    import argparse

MOVES: Final = ("repair", "repaired", "rma")
_SHOWN: Final = {
    "in_service": "in service",
    "in_repair": "in repair",
    "requalifying": "re-qualifying",
    "rma": "RMA",
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``lifecycle`` to the CLI's subcommands."""
    p = sub.add_parser(
        "lifecycle", help="a node's lifecycle (in service ... RMA); move it: repair, repaired, rma"
    )
    p.add_argument("node")
    p.add_argument("move", nargs="?", choices=MOVES, help="move the node (a change: token sent)")
    p.add_argument("--reason", default="", help="journaled with the move")
    p.add_argument("--since", metavar="WHEN", help="only moves from WHEN on (30m, 2h, 7d, ...)")


def shown(state: str) -> str:
    """A state as people read it."""
    return _SHOWN.get(state, state)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Show the node's lifecycle, or move it."""
    out = out or sys.stdout
    path = f"/api/v1/nodes/{urllib.parse.quote(args.node, safe='')}/lifecycle"
    if args.move:
        token = read_token(args.token_file, os.environ)
        body = {"move": args.move, "reason": args.reason}
        answer = call(args.api, "POST", path, body, token=token)
        if args.output == "json":
            print_json(answer, out)
            return 0
        was, now = shown(answer["previous"]), shown(answer["state"])
        said = f"{args.node}: {now}" + (f" (was {was})" if was != now else " (no change)")
        print(said, file=out)
        return 0
    if args.since:
        path += "?" + urllib.parse.urlencode({"since": args.since})
    data: dict[str, Any] = call(args.api, "GET", path)
    if args.output == "json":
        print_json(data, out)
        return 0
    now = data["lifecycle"]
    since = now.get("since_unix")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if since else "always"
    line = f"{data['node']}: {shown(now['state'])} since {when}"
    if now.get("actor"):
        line += f", by {now['actor']}"
    print(line, file=out)
    if now.get("reason"):
        print(f"  why: {now['reason']}", file=out)
    moves = data.get("moves", [])
    print(f"\nmoves: {len(moves) or 'none'}", file=out)
    if moves:
        rows = [["WHEN", "FROM", "TO", "BY", "INCIDENT", "REASON"]]
        rows += [
            [
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m["at_ms"] / 1000)),
                shown(m["previous"]),
                shown(m["state"]),
                m["actor"],
                m["incident"] or "-",
                m["reason"] or "-",
            ]
            for m in moves
        ]
        table(rows, out)
    return 0
