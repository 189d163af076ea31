"""The demo's pre-flight phase: qualify the simulated cluster before the job starts.

``fleetwatch demo --preflight`` plants the problems of ``agent/sim/builtin/preflight.yaml`` (a GPU
pair with low peer-to-peer bandwidth, an IB port trained at half rate, a bad cable between two
nodes: none of them moves an error counter) on the simulated hardware before the agents start,
runs ``full`` pre-flight through the collector's own orchestration, prints what a person wants
to know (each node's verdict, what was found and with what evidence, what was done about it),
and starts the training job only on the nodes that passed.
"""

from __future__ import annotations

import time
from importlib import resources
from typing import TYPE_CHECKING, Final

from agent.preflight.executor import UTIL_EVERY_S
from agent.sim.scenario import Fault, parse_scenario
from fleetwatch.preflight.vocabulary import Level

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TextIO

    from collector.main import CollectorService
    from collector.preflight.plan import Plan
    from collector.store.incidents import ActionRow
    from collector.store.preflight import ResultRow, RunRow

PLANTED: Final = ("agent.sim", "builtin/preflight.yaml")
# How long a simulated ladder rung keeps its GPUs busy (real seconds): the executor reads
# utilisation once a second while a rung runs; two reads leave room for a loaded machine.
UTIL_HOLD_S: Final = 2 * UTIL_EVERY_S + 0.5
_SHOWN: Final = 110  # characters of a line of the table


def planted(names: Sequence[str]) -> tuple[Fault, ...]:
    """The built-in pre-flight problems that fall on ``names``."""
    text = resources.files(PLANTED[0]).joinpath(PLANTED[1]).read_text("utf-8")
    scenario = parse_scenario(text, PLANTED[1])
    return tuple(f for f in scenario.faults if f.node in names)


def address_by_name(plan: Plan) -> None:
    """Address each ``ib_write_bw`` server by its node's name, as a cluster's DNS would.

    Every simulated agent reaches the collector from 127.0.0.1, so the addresses the collector
    saw are all the same; the simulated fabric knows the nodes by name.
    """
    for rnd in plan.rounds:
        for task in rnd.tasks.values():
            for test in task.ib_tests:
                if not test.server:
                    test.server_addr = test.peer


async def qualify(collector: CollectorService, out: TextIO) -> set[str]:
    """Run ``full`` pre-flight on every node, print the table; the nodes held out."""
    service = collector.preflight
    plan = service.plan(Level.FULL, "all")
    print(
        f"\n=== pre-flight: qualifying {len(plan.nodes)} nodes (level full, "
        f"{len(plan.rounds)} rounds) before the job starts ===",
        file=out,
    )
    out.flush()
    address_by_name(plan)
    began = time.monotonic()
    run = await service.execute(plan)
    took = time.monotonic() - began
    actions = await collector.journal.do(lambda s: s.incidents.actions(limit=10_000))
    for line in table(run, service.latest_results, actions, took):
        print(line, file=out)
    out.flush()
    return {n for n, v in (run.node_verdicts or {}).items() if v == "fail"}


def table(
    run: RunRow, results: Sequence[ResultRow], actions: Sequence[ActionRow], took_s: float
) -> list[str]:
    """The table a person wants: each node's verdict, what was done and found, and why.

    Then the links named (no node held out for them) and where the job runs.
    """
    verdicts = run.node_verdicts or {}
    suspects = run.suspects or []
    lines = [
        f"run {run.id}: {run.verdict} in {took_s:.1f} s ({len(results)} results judged)",
        f"  {'node':<10} {'verdict':<8} action",
    ]
    for node in run.nodes:
        verdict = verdicts.get(node, "?")
        drains = [a for a in actions if a.node == node and a.action == "drain_node"]
        action = "-"
        if drains:
            holding = _holding(drains)
            action = f"drain {holding.state}" + (
                f": {holding.detail[:70]}" if holding.detail else ""
            )
        shown = verdict.upper() if verdict == "fail" else verdict
        lines.append(f"  {node:<10} {shown:<8} {action}")
        if verdict != "fail":
            continue
        lines += [
            f"  {'':<10} {'':<8} {text[:_SHOWN]}" for text in _findings(node, suspects, results)
        ]
    shared = [s for s in suspects if not s.get("node") and s.get("kind") != "explained"]
    for s in shared:
        nodes = ", ".join(s.get("nodes") or [])
        lines.append(f"  named, no node held out: {s['kind']} {s['component']} ({nodes})")
        lines.append(f"    {str(s.get('reason', ''))[:_SHOWN]}")
        lines += [f"    {e}"[:_SHOWN] for e in list(s.get("evidence") or [])[:2]]
    held = sorted(n for n, v in verdicts.items() if v == "fail")
    fit = [n for n in run.nodes if n not in held]
    lines.append(
        f"the job starts on {', '.join(fit) or 'no node'}"
        + (f"; held out: {', '.join(held)}" if held else "")
    )
    return lines


def _holding(drains: Sequence[ActionRow]) -> ActionRow:
    """The drain that holds the node out: the latest one not skipped, else the latest.

    A built-in rule may drain a node for the same fault pre-flight found (a port below its
    rate), before or after pre-flight's own drain; the one of the two that ran (or waits for
    room under the cap) is what the node's line should show, not the other's skip ("already
    drained", or a rule's waiting drain dropped once its fault cleared).
    """
    ordered = sorted(drains, key=lambda a: (a.created_ms, a.id))
    ran = [a for a in ordered if a.state != "skipped"]
    return (ran or ordered)[-1]


def _findings(
    node: str, suspects: Sequence[dict[str, object]], results: Sequence[ResultRow]
) -> list[str]:
    """What the run blames on ``node``: its suspects, else its failed results."""
    mine = [s for s in suspects if s.get("node") == node]
    if mine:
        out = []
        for s in mine:
            out.append(f"{s['kind']} {s['component']}: {s.get('reason', '')}")
            out += [f"  {e}" for e in list(s.get("evidence") or [])[:2]]  # type: ignore[call-overload]
        return out
    failed = [r for r in results if r.node == node and r.verdict == "fail"]
    return [r.reason for r in failed[:3]]
