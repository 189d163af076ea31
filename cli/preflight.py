"""``fleetwatch preflight run|show|history``: qualify nodes through the collector's API.

``run`` asks the collector to plan and start a run (``POST /api/v1/preflight``), waits for it to
finish, printing a line as each round completes (:class:`Progress`), then prints a table and
exits as a Slurm prolog or health check reads it: 0 pass (warnings included), 1 fail, 2 could
not run (the collector unreachable, a node that never answered, a tool that crashed).
``--dry-run`` prints the plan and how long it may take (:func:`plan_time`) and starts nothing.
``show`` prints a past run (the newest by default) and exits by its verdict; ``history`` lists
runs.

Nodes whose lines would read the same are folded into one line, named as a compact range
(:func:`fold_names`: ``node-01..14: a job is running here``); what was found and blamed is
printed whole, never cut.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

from cli.api import ApiCallError, call
from cli.output import cut, table
from fleetwatch.preflight.vocabulary import EXIT_COULD_NOT_RUN, EXIT_FAIL, EXIT_PASS

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterable, Mapping, Sequence

POLL_S: Final = 1.0
WAIT_S: Final = 6 * 3600.0
_SHOWN_PER_NODE: Final = 4  # findings on a node's line, then "and N more"
_SHOWN_ACROSS: Final = 12  # lines of results shared between nodes
_NAMED_CHECKS: Final = 4  # a reason shared by more checks of a node counts them instead
_NUMBERED: Final = re.compile(r"(?P<prefix>.*?)(?P<digits>[0-9]+)")
# Stand for a node's own name ("gpu-07") and for "node gpu-07" in the text of its line: on a
# line of several nodes both read "the node".
_SELF: Final = "\x00"
_SELF_NODE: Final = "\x01"


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
    run.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NODE",
        help="one node; repeat for more (with --nodes: those as well)",
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
            nodes=_nodes(args.nodes, args.node),
            dry_run=args.dry_run,
            wait_s=args.wait,
            as_json=args.json,
            out=out,
            token=tok,
        )
    if args.preflight_command == "show":
        return show(args.api, args.run, as_json=args.json, out=out)
    return history(args.api, node=args.node, limit=args.limit, output=args.output, out=out)


def run(  # noqa: PLR0913 - the run's shape, where to print, and the time
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
    monotonic: Callable[[], float] = time.monotonic,
) -> int:
    """Start a run and wait for it; print its rounds as they complete, then its table.

    The exit status (2 on any API failure). With ``as_json`` only the API's JSON is printed.
    """
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
    began = monotonic()
    deadline = began + wait_s
    progress = None if as_json else Progress(started.get("plan") or {}, out)
    if progress is not None:
        progress.start()
    while True:
        try:
            detail = call(api, "GET", f"/api/v1/preflight/{urllib.parse.quote(run_id)}")
        except ApiCallError as exc:
            print(f"fleetwatch preflight: lost the collector during {run_id}: {exc}", file=out)
            return EXIT_COULD_NOT_RUN
        finished = detail["run"]["verdict"] != "running"
        if progress is not None:
            progress.update(detail["run"], monotonic() - began, finished=finished)
        if finished:
            break
        if monotonic() > deadline:
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


def history(api: str, *, node: str | None, limit: int, output: str, out: TextIO) -> int:
    """List runs, newest first; each summary cut at the table's width unless ``-o wide``."""
    query = urllib.parse.urlencode({"limit": limit, **({"node": node} if node else {})})
    data = call(api, "GET", f"/api/v1/preflight?{query}")
    if output == "json":
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
                cut(r.get("detail") or r.get("round") or "", output),
            ]
        )
    table(rows, out)
    return EXIT_PASS


def fold_names(names: Iterable[str]) -> str:
    """The names sorted, each run of consecutive numbers folded: ``login, node-01..14, node-16``.

    A run is names with the same prefix and trailing numbers that follow one another, written
    alike (the same width, or none zero-padded): ``gpu-9, gpu-10`` fold to ``gpu-9..10``;
    ``n9, n010`` do not, nor do ``rack1-gpu2, rack2-gpu2`` (two prefixes). A name without a
    trailing number, and a run of one, stay as they are; a name given twice counts once.
    """
    numbered: list[tuple[str, int, str]] = []
    shown: list[tuple[tuple[str, int, int], str]] = []  # (sort key, text)
    for name in set(names):
        match = _NUMBERED.fullmatch(name)
        if match is None:
            shown.append(((name, -1, 0), name))
        else:
            numbered.append((match["prefix"], int(match["digits"]), match["digits"]))
    numbered.sort(key=lambda n: (n[0], n[1], len(n[2])))
    last: tuple[str, int, str] | None = None
    first = ""  # the digits that begin the run ``last`` ends
    for prefix, number, digits in numbered:
        if last is not None and _follows(last, (prefix, number, digits)):
            shown[-1] = (shown[-1][0], f"{prefix}{first}..{digits}")
        else:
            first = digits
            shown.append(((prefix, number, len(digits)), f"{prefix}{digits}"))
        last = (prefix, number, digits)
    return ", ".join(text for _, text in sorted(shown))


def _follows(before: tuple[str, int, str], name: tuple[str, int, str]) -> bool:
    """Whether ``name`` continues the run that ``before`` ends: same prefix, next number, alike."""
    prefix, number, digits = name

    def padded(d: str) -> bool:
        return len(d) > 1 and d.startswith("0")

    alike = len(digits) == len(before[2]) or not (padded(digits) or padded(before[2]))
    return prefix == before[0] and number == before[1] + 1 and alike


def plan_time(plan: Mapping[str, Any]) -> tuple[float, int, float]:
    """How long a plan may take: its rounds' times added up, as the planner set each round's.

    Every task of a round runs at once and the round ends when its slowest node answers, or at
    its time: the sum is the most the planned rounds take. Returns that, and the bisection
    rounds a ``full`` run adds at most when its multi-node all-reduce fails with nothing of its
    own to blame (each half of the nodes at once, down to 2-3 nodes), and each one's time.
    """
    rounds = plan.get("rounds") or []
    total = sum(float(r["timeout_s"]) for r in rounds)
    multi = [
        float(r["timeout_s"])
        for r in rounds
        if any("allreduce_multi" in t.get("checks", ()) for t in r["nodes"].values())
    ]
    halvings, n = 0, len(plan.get("nodes") or [])
    while multi and n >= 4:  # noqa: PLR2004 - two halves of two nodes at least
        halvings += 1
        n -= n // 2  # the larger half, at worst
    return total, halvings, multi[0] if multi else 0.0


def duration(seconds: float) -> str:
    """``1 h 47 min``, ``12 min 30 s``, ``45 s``."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"


def estimate_line(plan: Mapping[str, Any]) -> str:
    """The plan's time, as :func:`plan_time` adds it up, in words."""
    total, halvings, each = plan_time(plan)
    rounds = _plural(len(plan.get("rounds") or []), "round")
    line = (
        f"estimate: at most {duration(total)} for {rounds} "
        "(each round's time added up; a round ends as soon as every node answered)"
    )
    if halvings:
        line += (
            f"; if the multi-node all-reduce fails with nothing to blame, up to {halvings} "
            f"bisection rounds more ({duration(halvings * each)})"
        )
    return line


def print_plan(plan: dict[str, Any], out: TextIO) -> None:
    """The rounds a run would take, node by node, and how long they may take."""
    print(
        f"plan {plan['run_id']}: level {plan['level']}, {_plural(len(plan['nodes']), 'node')}, "
        f"{_plural(len(plan['rounds']), 'round')}",
        file=out,
    )
    for index, rnd in enumerate(plan["rounds"], start=1):
        print(f"round {index}: {rnd['name']} (up to {duration(rnd['timeout_s'])})", file=out)
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
    print(estimate_line(plan), file=out)


class Progress:
    """One line per round as the run completes it: round n of m, pairs done, failures so far.

    Which rounds are done comes from the collector's view of the run in progress: its
    ``round`` (``"3/9: ib_write_bw 1/2"``: the third is under way), or its ``rounds_done``
    where it says more. A poll that finds several rounds done prints each; the last poll, the run
    finished, prints the rest (unless the run was cut short). The ``ib_write_bw`` pairs are
    counted from the plan; failures so far are shown when the collector reports them
    (``failing``: node -> its worst verdict so far).
    """

    __slots__ = ("_out", "_pairs", "_plan", "_shown")

    def __init__(self, plan: Mapping[str, Any], out: TextIO) -> None:
        """Nothing is printed until :meth:`start`."""
        self._plan = plan
        self._out = out
        self._pairs = [_pairs(r) for r in plan.get("rounds") or []]
        self._shown = 0

    def start(self) -> None:
        """The run's first line: what runs, and how long it may take."""
        plan = self._plan
        rounds = plan.get("rounds") or []
        if not rounds:
            return
        total, _, _ = plan_time(plan)
        print(
            f"pre-flight {plan['run_id']} started: level {plan['level']}, "
            f"{_plural(len(plan['nodes']), 'node')}, {_plural(len(rounds), 'round')}, "
            f"at most {duration(total)}",
            file=self._out,
        )
        self._out.flush()

    def update(self, live: Mapping[str, Any], elapsed_s: float, *, finished: bool) -> None:
        """Print a line for each round done since the last update."""
        rounds = self._plan.get("rounds") or []
        done = min(_rounds_done(live), len(rounds))
        if finished and not str(live.get("detail") or "").startswith("cut short"):
            done = len(rounds)  # the rest were done since the last poll
        failing = live.get("failing")
        while self._shown < done:
            index = self._shown
            self._shown += 1
            line = (
                f"[{elapsed_s:5.0f} s] round {index + 1} of {len(rounds)} done: "
                f"{rounds[index]['name']}, {_plural(len(rounds[index]['nodes']), 'node')}"
            )
            total_pairs = sum(self._pairs)
            if self._pairs[index]:
                line += (
                    f", {_plural(self._pairs[index], 'pair')}; ib_write_bw pairs "
                    f"{sum(self._pairs[: index + 1])} of {total_pairs} done"
                )
            if isinstance(failing, dict) and not finished:
                line += f"; failures so far: {_failing(failing)}"
            print(line, file=self._out)
        self._out.flush()


def _pairs(rnd: Mapping[str, Any]) -> int:
    """The node pairs of a round's ``ib_write_bw`` tests (each pair has one server)."""
    return sum(
        1
        for task in rnd.get("nodes", {}).values()
        if any(t.get("role") == "server" for t in task.get("ib_write_bw", ()))
    )


def _rounds_done(live: Mapping[str, Any]) -> int:
    """Rounds finished: one fewer than the round under way, or the collector's ``rounds_done``.

    The larger: during the bisection rounds that follow the plan's, the round shown is the
    plan's last, and ``rounds_done`` says it is done.
    """
    current, _, _ = str(live.get("round") or "").partition("/")
    under_way = int(current) - 1 if current.strip().isdigit() else 0
    done = live.get("rounds_done")
    return max(under_way, done if isinstance(done, int) else 0)


def _failing(failing: Mapping[str, str]) -> str:
    """``node-02 fail; node-05..07 could_not_run`` (failures first), or ``none``."""
    by_verdict: dict[str, list[str]] = {}
    for node, verdict in failing.items():
        by_verdict.setdefault(str(verdict), []).append(node)
    if not by_verdict:
        return "none"
    ordered = sorted(by_verdict.items(), key=lambda vn: (vn[0] != "fail", vn[0]))
    return "; ".join(f"{fold_names(nodes)} {verdict}" for verdict, nodes in ordered)


def print_detail(detail: dict[str, Any], out: TextIO, *, as_json: bool = False) -> int:
    """A run's table: each node, its verdict and what failed; then the blame; exit by verdict.

    Nodes whose lines read the same (their own name aside) share one line, named by
    :func:`fold_names`.
    """
    run_row = detail["run"]
    verdict = run_row["verdict"]
    if as_json:
        print(json.dumps(detail, indent=2), file=out)
        return exit_status(verdict)
    how_many = _plural(len(run_row["nodes"]), "node")
    print(
        f"pre-flight {run_row['id']} ({run_row['level']}, {how_many}): {verdict.upper()}",
        file=out,
    )
    bad: dict[str, list[dict[str, Any]]] = {}
    for r in detail.get("results", []):
        if r["verdict"] != "pass":
            bad.setdefault(r["node"], []).append(r)
    lines: dict[tuple[str, str, str], list[str]] = {}
    for node, info in sorted(detail.get("nodes", {}).items()):
        checks = info.get("checks", {})
        failing = [
            r for r in bad.get(node, []) if not r["component"].startswith(("nodes:", "rail:"))
        ]
        passed = sum(1 for v in checks.values() if v == "pass")
        what = _own(_what(failing, set(checks)), node)
        key = (info["verdict"], f"{passed}/{len(checks)} pass", what)
        lines.setdefault(key, []).append(node)
    rows = [["NODE", "VERDICT", "CHECKS", "WHAT"]]
    for (node_verdict, passed_of, what), nodes in lines.items():
        rows.append([fold_names(nodes), node_verdict, passed_of, _named(what, nodes) or "-"])
    table(rows, out)
    _print_across(bad, run_row, out)
    return exit_status(verdict)


def _what(failing: Sequence[dict[str, Any]], checks: set[str]) -> str:
    """What failed on a node, a reason shared by several of its checks said once."""
    items: list[str] = []
    errors: dict[str, list[dict[str, Any]]] = {}
    for r in failing:
        if r.get("error") or not r.get("reason"):
            errors.setdefault(str(r.get("error") or r["verdict"]), []).append(r)
        else:
            items.append(str(r["reason"]))
    for text, rs in errors.items():
        names = list(dict.fromkeys(r["check"] for r in rs))
        if len(rs) == 1:
            label = f"{rs[0]['check']} {rs[0]['component']}"
        elif len(names) > 1 and set(names) == checks:
            label = f"every check ({len(names)})"
        elif len(names) > _NAMED_CHECKS:
            label = f"{len(names)} checks"
        else:
            label = ", ".join(names)
        items.append(f"{label}: {text}")
    what = "; ".join(items[:_SHOWN_PER_NODE])
    if len(items) > _SHOWN_PER_NODE:
        what += f"; and {len(items) - _SHOWN_PER_NODE} more"
    return what


def _own(text: str, node: str) -> str:
    """``text`` with ``node``'s own name (whole, not part of another name) as a placeholder."""
    name = re.escape(node)
    text = re.sub(rf"(?<![\w-])node {name}(?![\w-])", _SELF_NODE, text)
    return re.sub(rf"(?<![\w-]){name}(?![\w-])", _SELF, text)


def _named(text: str, nodes: Sequence[str]) -> str:
    """The text :func:`_own` made, for the line of ``nodes``: their name, or "the node"."""
    if len(nodes) == 1:
        return text.replace(_SELF_NODE, f"node {nodes[0]}").replace(_SELF, nodes[0])
    return text.replace(_SELF_NODE, "the node").replace(_SELF, "the node")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _print_across(
    bad: dict[str, list[dict[str, Any]]], run_row: dict[str, Any], out: TextIO
) -> None:
    shared: dict[str, list[str]] = {}
    for node, rs in bad.items():
        for r in rs:
            if r["component"].startswith(("nodes:", "rail:")) and r["verdict"] in (
                "fail",
                "could_not_run",
            ):
                shared.setdefault(_why(r), []).append(node)
    if shared:
        print("across nodes:", file=out)
        for text, nodes in list(shared.items())[:_SHOWN_ACROSS]:
            print(f"  {fold_names(nodes)}: {text}", file=out)
        if len(shared) > _SHOWN_ACROSS:
            print(f"  and {len(shared) - _SHOWN_ACROSS} more (--json: all)", file=out)
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
        return f"{r['check']} {r['component']}: {r.get('error') or r['verdict']}"
    return str(r["reason"])


def _nodes(expression: str, named: list[str]) -> str:
    """``--nodes`` and every ``--node`` as one expression (``--node`` alone: only those)."""
    if not named:
        return expression
    return ",".join([*([] if expression == "all" else [expression]), *named])
