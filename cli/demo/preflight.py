"""The demo's pre-flight phase: qualify the simulated cluster before the job starts.

``fleetwatch demo --preflight`` plants the problems of ``agent/sim/builtin/preflight.yaml`` (a GPU
pair with low peer-to-peer bandwidth, an IB port trained at half rate, a bad cable between two
nodes: none of them moves an error counter) on the simulated hardware before the agents start,
runs ``full`` pre-flight through the collector's own orchestration, prints what a person wants
to know (each node's verdict, what was found and with what evidence, what was done about it),
and places the training job (:func:`place_job`): on the nodes that passed, never across a link
pre-flight blamed (a bad cable's two ends both pass; the job runs on one of them only).

A node that failed is "held out" only when its drain succeeded; a drain the drain cap
deferred has not happened yet, and the table says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Final

from agent.preflight.executor import UTIL_EVERY_S
from agent.sim.scenario import Fault, parse_scenario
from cli.preflight import fold_names
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
# Suspects that blame the link between two nodes (both ends pass): the job must not span it.
LINK_KINDS: Final = frozenset({"cable", "pair"})
CAP_DEFERRAL: Final = "drain cap reached"  # how the dispatcher words a drain the cap deferred


@dataclass(frozen=True, slots=True)
class JobPlacement:
    """Where the demo's job runs after pre-flight, and why it does not run on each other node."""

    nodes: tuple[str, ...]  # the job runs here, in the run's order
    held_out: tuple[str, ...] = ()  # failed, and drained
    deferred: tuple[str, ...] = ()  # failed; the drain waits for room under the drain cap
    not_drained: tuple[tuple[str, str], ...] = ()  # failed, no drain holds it: (node, why)
    left_out: tuple[tuple[str, str], ...] = ()  # passed, one end of a blamed link: (node, why)

    @property
    def skip(self) -> set[str]:
        """Every node the job does not run on."""
        return {
            *self.held_out,
            *self.deferred,
            *(n for n, _ in self.not_drained),
            *(n for n, _ in self.left_out),
        }

    def lines(self) -> list[str]:
        """Where the job starts, then each node it avoids (by name) and why."""
        why = [(n, "failed, held out (drained)") for n in self.held_out]
        why += [(n, "failed; drain deferred by the cap (not drained yet)") for n in self.deferred]
        why += [(n, f"failed, not drained ({text})") for n, text in self.not_drained]
        why += [(n, f"passed, but {text}") for n, text in self.left_out]
        first = f"the job starts on {fold_names(self.nodes) or 'no node'}" + (":" if why else "")
        return [first] + [f"  not on {n}: {text}" for n, text in sorted(why)]


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


async def qualify(collector: CollectorService, out: TextIO) -> JobPlacement:
    """Run ``full`` pre-flight on every node, print the table; where the job is to run."""
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
    return place_job(run, actions)


def place_job(run: RunRow, actions: Sequence[ActionRow]) -> JobPlacement:
    """The job's nodes: those that passed, less one end of each link pre-flight blamed.

    A node that failed (or that a suspect names) is avoided, whatever became of its drain: held
    out when its drain succeeded, deferred when the drain cap holds the drain back, not drained
    otherwise (a drain skipped, failed or still running, or none). A cable (or a pair two nodes
    could not tell apart) blames the link between two nodes that both passed: the job keeps
    the end named first in the run and leaves the other out; a node on several blamed links
    goes first, so the fewest nodes are left out.
    """
    verdicts = run.node_verdicts or {}
    suspects = run.suspects or []
    failed = {n for n, v in verdicts.items() if v == "fail"}
    failed |= {str(s["node"]) for s in suspects if s.get("node") and s["node"] in run.nodes}
    held, deferred, not_drained = [], [], []
    for node in (n for n in run.nodes if n in failed):
        drains = [a for a in actions if a.node == node and a.action == "drain_node"]
        holding = _holding(drains) if drains else None
        if holding is not None and holding.state == "succeeded":
            held.append(node)
        elif holding is not None and holding.state == "deferred" and CAP_DEFERRAL in holding.detail:
            deferred.append(node)
        else:
            why = "no drain" if holding is None else f"drain {holding.state}: {holding.detail}"
            not_drained.append((node, why))
    job = [n for n in run.nodes if n not in failed]
    links = [
        (str(s["nodes"][0]), str(s["nodes"][1]), f"the {s['kind']} {s['component']}")
        for s in suspects
        if s.get("kind") in LINK_KINDS and len(s.get("nodes") or ()) == 2  # noqa: PLR2004
    ]
    left_out: list[tuple[str, str]] = []
    while spanned := [(a, b, w) for a, b, w in links if a in job and b in job]:
        ends = [n for a, b, _ in spanned for n in (a, b)]
        # the node on most blamed links; of equals, the one named last in the run
        node = max(job, key=lambda n: (ends.count(n), job.index(n)))
        why = "; ".join(
            f"{w} joins it to {b if a == node else a}" for a, b, w in spanned if node in (a, b)
        )
        job.remove(node)
        left_out.append((node, why))
    return JobPlacement(
        tuple(job), tuple(held), tuple(deferred), tuple(not_drained), tuple(left_out)
    )


def table(
    run: RunRow, results: Sequence[ResultRow], actions: Sequence[ActionRow], took_s: float
) -> list[str]:
    """The table a person wants: each node's verdict, what was done and found, and why.

    Then the links named (no node held out for them) and where the job runs. What was found
    is printed whole.
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
            action = f"drain {holding.state}" + (f": {holding.detail}" if holding.detail else "")
        shown = verdict.upper() if verdict == "fail" else verdict
        lines.append(f"  {node:<10} {shown:<8} {action}")
        if verdict != "fail":
            continue
        lines += [f"  {'':<10} {'':<8} {text}" for text in _findings(node, suspects, results)]
    shared = [s for s in suspects if not s.get("node") and s.get("kind") != "explained"]
    for s in shared:
        nodes = ", ".join(s.get("nodes") or [])
        lines.append(f"  named, no node held out: {s['kind']} {s['component']} ({nodes})")
        lines.append(f"    {s.get('reason', '')}")
        lines += [f"    {e}" for e in list(s.get("evidence") or [])[:2]]
    return lines + place_job(run, actions).lines()


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
