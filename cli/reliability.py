"""``fleetwatch reliability [NODE] [--window 30d]``: time between incidents, to repair, lemons.

Without a node: the fleet's figures over the window (30 days by default), its remediations and
incident episodes of the last 7 days, the lemon nodes, then a line per node that had anything
(``GET /api/v1/reliability``). With one: that node's, with each time between incidents and
each repair (``?node=NODE``). docs/oncall.md "Reliability and lemon nodes" says what each is.
"""

from __future__ import annotations

import sys
import urllib.parse
from typing import TYPE_CHECKING, Any, Final, TextIO

from cli.api import call, span
from cli.lifecycle import shown
from cli.output import print_json, table

if TYPE_CHECKING:
    import argparse

_SHOWN_TIMES: Final = 8  # times listed after a mean, at most


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``reliability`` to the CLI's subcommands."""
    p = sub.add_parser(
        "reliability",
        help="time between incidents, time to repair, GPU time lost, lemon nodes",
    )
    p.add_argument("node", nargs="?", help="one node's figures (default: the fleet's)")
    p.add_argument(
        "--window", default="30d", metavar="DURATION", help="over this long (default 30d)"
    )


def _mean(mean: float | None, times: list[float]) -> str:
    """``mean 2h3m (4)`` or ``none``."""
    if mean is None:
        return "none"
    return f"mean {span(mean)} ({len(times)})"


def _listed(times: list[float]) -> str:
    """``: 3s, 5s, 4s`` (at most :data:`_SHOWN_TIMES`, then how many more)."""
    if not times:
        return ""
    more = len(times) - _SHOWN_TIMES
    words = ", ".join(span(t) for t in times[:_SHOWN_TIMES])
    return f": {words}" + (f" and {more} more" if more > 0 else "")


def _share(ratio: float) -> str:
    """A share as a percentage people read (``0.42 %``, ``< 0.01 %``, ``0 %``)."""
    if ratio == 0:
        return "0 %"
    percent = ratio * 100
    return "< 0.01 %" if percent < 0.01 else f"{percent:.2f} %"  # noqa: PLR2004 - shown digits


def _recent(last: dict[str, Any]) -> str:
    """``5 remediations (4 drains, 1 reset), 5 incident episodes``."""
    kinds = [
        (last["drains"], "drain"),
        (last["resets"], "reset"),
        (last["reboots"], "reboot"),
        (last["rma_tickets"], "RMA ticket"),
    ]
    parts = [f"{n} {word}{'' if n == 1 else 's'}" for n, word in kinds if n]
    count = last["remediations"]
    head = f"{count} remediation{'' if count == 1 else 's'}"
    episodes = last["incident_episodes"]
    tail = f"{episodes} incident episode{'' if episodes == 1 else 's'}"
    return f"{head} ({', '.join(parts)}), {tail}" if parts else f"{head}, {tail}"


def _node(data: dict[str, Any], out: TextIO) -> None:
    node, days = data["node"], round(data["window_s"] / 86400, 1)
    print(
        f"{node['node']}, last {days:g} days: {shown(node['state'])}, {node['gpus']} GPUs", file=out
    )
    between = node["time_between_incidents_s"]
    print(
        f"  incident episodes: {node['incident_episodes']}; time between incidents: "
        f"{_mean(node['mean_time_between_incidents_s'], between)}{_listed(between)}",
        file=out,
    )
    repairs = node["time_to_repair_s"]
    line = f"  repairs done: {_mean(node['mean_time_to_repair_s'], repairs)}{_listed(repairs)}"
    if node["open_repair_s"] is not None:
        line += f"; out of service for {span(node['open_repair_s'])} now"
    print(line, file=out)
    print(
        f"  out of service {span(node['out_of_service_s'])} in all: "
        f"{_share(node['gpu_time_lost_ratio'])} of its GPU time",
        file=out,
    )
    print(f"last 7 days: {_recent(node['last_7d'])}", file=out)
    seen = node["rules_see"]
    print(
        f"lemon: {'yes' if node['lemon'] else 'no'} (the rules see remediations_7d "
        f"{seen['remediations_7d']}, incidents_7d {seen['incidents_7d']}, seen_by_person "
        f"{str(seen['seen_by_person']).lower()})",
        file=out,
    )


def _fleet(data: dict[str, Any], out: TextIO) -> None:
    fleet, days = data["fleet"], round(data["window_s"] / 86400, 1)
    print(f"fleet, last {days:g} days: {fleet['nodes']} nodes, {fleet['gpus']} GPUs", file=out)
    between = fleet["time_between_incidents_s"]
    print(
        f"  incident episodes: {fleet['incident_episodes']}; time between incidents: "
        f"{_mean(fleet['mean_time_between_incidents_s'], between)}",
        file=out,
    )
    repairs = fleet["time_to_repair_s"]
    line = f"  repairs done: {_mean(fleet['mean_time_to_repair_s'], repairs)}"
    if opened := fleet["open_repairs"]:
        oldest = opened[0]
        line += (
            f"; {len(opened)} under way, the oldest {oldest['node']} for {span(oldest['age_s'])}"
        )
    print(line, file=out)
    print(f"  GPU time lost: {_share(fleet['gpu_time_lost_ratio'])}", file=out)
    print(f"last 7 days: {_recent(fleet['last_7d'])}", file=out)
    print(f"lemon nodes: {', '.join(fleet['lemon_nodes']) or 'none'}", file=out)
    nodes = data["nodes"]
    if not nodes:
        return
    rows = [["NODE", "STATE", "EPISODES", "MTBI", "REPAIRS", "MTTR", "OUT NOW", "GPU TIME LOST"]]
    rows[0] += ["REMEDIATIONS 7D", "EPISODES 7D", "LEMON"]
    for n in nodes:
        mtbi, mttr, now = (
            n["mean_time_between_incidents_s"],
            n["mean_time_to_repair_s"],
            n["open_repair_s"],
        )
        rows.append(
            [
                n["node"],
                shown(n["state"]),
                str(n["incident_episodes"]),
                span(mtbi) if mtbi is not None else "-",
                str(n["repairs"]),
                span(mttr) if mttr is not None else "-",
                span(now) if now is not None else "-",
                _share(n["gpu_time_lost_ratio"]),
                str(n["last_7d"]["remediations"]),
                str(n["last_7d"]["incident_episodes"]),
                "yes" if n["lemon"] else "-",
            ]
        )
    print(file=out)
    table(rows, out)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Show the fleet's reliability figures, or one node's."""
    out = out or sys.stdout
    params = {"window": args.window} | ({"node": args.node} if args.node else {})
    data: dict[str, Any] = call(
        args.api, "GET", "/api/v1/reliability?" + urllib.parse.urlencode(params)
    )
    if args.output == "json":
        print_json(data, out)
    elif args.node:
        _node(data, out)
    else:
        _fleet(data, out)
    return 0
