"""Pre-flight on a simulated 16-node cluster with planted problems: found, named, held out?

Run from the repository root: ``.venv/bin/python bench/preflight.py [--seeds N] [--nodes 16]``.
The last line of output is one JSON object (see the project's benchmark contract).

What runs, in this process, on loopback: a real collector (:class:`collector.main.CollectorService`
with the built-in gates, a SQLite journal and its drain action wired to a signed webhook receiver)
and a :class:`agent.sim.cluster.SimCluster` of 16 nodes, each with its real agent streaming over
gRPC. The agents measure with the simulator's runners (:mod:`agent.sim.preflight`), which read the
simulated hardware's bandwidth model (:mod:`agent.sim.bandwidth`) and answer in milliseconds.

Each seed is one case set on a fresh cluster: five problems planted on five different nodes,
kinds fixed and GPUs, ports, factors and nodes drawn from the seed:

* ``p2p_low``: one GPU pair of a node copies at 40-70% (no NVLink error): the pair is to blame;
* ``ib_rate_low``: one IB port of a node trained at 200 Gb/s (half): that port;
* ``slow_gpu``: one GPU computes 1.4-1.8 times slower (no counter shows it): that GPU of that
  node (the one-node ladder rung, which every node runs at once, is slow against the fleet's,
  and the GPU is the one its peers waited for);
* ``bad_cable``: rail r between two neighbouring nodes of the plan's ring runs at 30-60%: the
  cable (both ends test fine with their other partner), neither node held out;
* ``driver_version``: one node runs another driver: that node, the odd one out.

Then ``full`` pre-flight runs on every node, as ``fleetwatch preflight run --level full`` does,
through :meth:`collector.preflight.orchestrator.PreflightService.execute`.

* ``localised_share``: planted problems whose component the run named (a suspect of the right
  kind on the right node and component, or a failed result there), over all planted;
* ``false_holds``: nodes with nothing planted on them (the cable's two ends included) that the
  run failed, and so held out;
* ``qualify_s_16_nodes``: the plan's time as orchestrated (rounds one after the other, a round
  as long as its slowest node or pair), for ``standard`` and ``full``, with each tool's time as
  modelled (:data:`agent.sim.preflight.TOOL_SECONDS`; quick checks :data:`QUICK_S`), from the
  ledger of what the runners ran; ``serial_s_16_nodes`` the same work one node (or one pair) at a
  time, and their ratio. Collectives and ladder rungs take every node at once either way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import structlog

from agent.sim.cluster import SimCluster
from agent.sim.preflight import TOOL_SECONDS, SimFabric
from agent.sim.scenario import Fault, FaultKind, apply_fault
from cli.demo.preflight import UTIL_HOLD_S, address_by_name
from cli.demo.wiring import demo_actions, write_secret
from cli.dev.webhook_receiver import WebhookReceiver
from collector.config import CollectorConfig
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.preflight.vocabulary import Level

if TYPE_CHECKING:
    from agent.sim.preflight import Spent
    from collector.preflight.plan import Plan
    from collector.store.preflight import ResultRow, RunRow

NODES: Final = 16
SEEDS: Final = 12
QUICK_S: Final = 5.0  # the quick round: NVML and sysfs reads, seconds on a real node
CONNECT_TIMEOUT_S: Final = 60.0
RAILS: Final = 8
GPUS: Final = 8
OTHER_DRIVER: Final = "535.183.01"


@dataclass(frozen=True, slots=True)
class Planted:
    """One planted problem and what naming it means."""

    kind: str
    node: str
    component: str  # what must be named: "gpu:2-gpu:6", "ib:mlx5_3/1", "node", "rail:mlx5_3/1"
    faults: tuple[Fault, ...]
    peer: str = ""  # bad_cable: the other end
    held: bool = True  # whether the node itself should be held out

    def describe(self) -> str:
        """One line for people."""
        where = f"{self.node}-{self.peer}" if self.peer else self.node
        return f"{self.kind} on {where} ({self.component})"


def node_names(count: int) -> list[str]:
    return [f"node-{i:02d}" for i in range(1, count + 1)]


def plant(seed: int, names: list[str]) -> list[Planted]:
    """Five problems on five different nodes (the cable on two more), drawn from ``seed``."""
    rng = random.Random(seed)
    ring = list(names)
    # The cable between ring neighbours (the plan pairs them); its ends carry nothing else.
    k = rng.randrange(len(ring))
    cable_a, cable_b = sorted((ring[k], ring[(k + 1) % len(ring)]))
    free = [n for n in names if n not in (cable_a, cable_b)]
    pair_node, rate_node, slow_node, driver_node = rng.sample(free, 4)
    i, j = sorted(rng.sample(range(GPUS), 2))
    rate_port = rng.randrange(RAILS)
    cable_port = rng.randrange(RAILS)
    slow = rng.randrange(GPUS)

    def fault(node: str, kind: FaultKind, **params: Any) -> Fault:  # noqa: ANN401 - by kind
        return Fault(0.0, node, kind, params)

    return [
        Planted(
            "p2p_low",
            pair_node,
            f"gpu:{i}-gpu:{j}",
            (fault(pair_node, FaultKind.P2P_LOW, gpu=i, peer=j, factor=rng.uniform(0.4, 0.7)),),
        ),
        Planted(
            "ib_rate_low",
            rate_node,
            f"mlx5_{rate_port}/1",
            (fault(rate_node, FaultKind.IB_RATE_LOW, port=rate_port, rate=200),),
        ),
        Planted(
            "slow_gpu",
            slow_node,
            f"gpu:{slow}",
            (fault(slow_node, FaultKind.SLOW_GPU, gpu=slow, factor=rng.uniform(1.4, 1.8)),),
        ),
        Planted(
            "bad_cable",
            cable_a,
            f"mlx5_{cable_port}/1",
            (
                fault(
                    cable_a,
                    FaultKind.BAD_CABLE,
                    peer=cable_b,
                    port=cable_port,
                    factor=rng.uniform(0.3, 0.6),
                ),
            ),
            peer=cable_b,
            held=False,
        ),
        Planted(
            "driver_version",
            driver_node,
            "node",
            (fault(driver_node, FaultKind.DRIVER_VERSION, version=OTHER_DRIVER),),
        ),
    ]


def named(p: Planted, run: RunRow, results: list[ResultRow]) -> bool:
    """Whether the run named the planted problem's component."""
    suspects = run.suspects or []
    if p.kind == "bad_cable":
        return any(
            s.get("kind") == "cable"
            and set(s.get("nodes") or []) == {p.node, p.peer}
            and p.component in str(s.get("component", ""))
            for s in suspects
        )
    on_node = [s for s in suspects if s.get("node") == p.node or p.node in (s.get("nodes") or [])]
    failed = [r for r in results if r.node == p.node and r.verdict == "fail"]
    if p.kind == "p2p_low":
        i, j = p.component.replace("gpu:", "").split("-")
        pairs = {f"gpu:{i}-gpu:{j}", f"gpu:{j}-gpu:{i}"}
        return any(str(s.get("component")) in pairs for s in on_node) or any(
            r.component in pairs and r.check.startswith("p2p") for r in failed
        )
    if p.kind == "ib_rate_low":
        return any(p.component in str(s.get("component", "")) for s in on_node) or any(
            p.component in r.component for r in failed if r.check in ("ib_port", "ib_write_bw")
        )
    if p.kind == "driver_version":
        return any(r.check == "driver_version" for r in failed) or any(
            s.get("check") == "driver_version" for s in on_node
        )
    if p.kind == "slow_gpu":
        # the node fails (its one-node rung) and the GPU is named
        return (run.node_verdicts or {}).get(p.node) == "fail" and any(
            s.get("node") == p.node and s.get("component") == p.component for s in on_node
        )
    return False


@dataclass(slots=True)
class Case:
    """One seed's outcome."""

    seed: int
    planted: list[Planted]
    found: dict[str, bool] = field(default_factory=dict)
    false_holds: list[str] = field(default_factory=list)
    verdict: str = ""
    real_s: float = 0.0
    times: dict[str, dict[str, float]] = field(default_factory=dict)
    could_not_run: list[str] = field(default_factory=list)  # what could not run, and why
    why_held: list[str] = field(default_factory=list)  # a false hold's failed results


def plan_seconds(plan: Plan, ledger: list[Spent]) -> tuple[float, float]:
    """(orchestrated, one node or pair at a time) seconds of ``plan``'s rounds.

    A node's round costs what its runners spent (the ledger); an ``ib_write_bw`` round as long
    as its slowest pair (every rail of a pair at once), and one at a time the sum of its pairs;
    the one-node ladder rung, which every node runs at once, as long as its slowest node's, one
    at a time the sum; collectives and larger rungs take every member at once either way. Groups
    the orchestrator ran beyond the plan (a bisection) are rounds of their own, added to both.
    """
    spent: dict[tuple[str, str, tuple[str, ...]], float] = {}
    for s in ledger:
        key = (s.node, s.what, s.scope)
        spent[key] = max(spent.get(key, 0.0), s.seconds)
    together = alone = 0.0
    ib_round = 0
    planned_groups: set[tuple[str, tuple[str, ...]]] = set()
    for rnd in plan.rounds:
        nodes = list(rnd.tasks)
        for task in rnd.tasks.values():
            for g in task.groups:
                what = "ladder_rung" if g.check == "ladder_throughput" else g.check
                planned_groups.add((what, tuple(g.nodes)))
        if rnd.name == "quick":
            together += QUICK_S
            alone += QUICK_S * len(nodes)
        elif rnd.name == "node bandwidth":
            per_node = [
                sum(v for (n, what, _), v in spent.items() if n == node and what in _NODE_TOOLS)
                for node in nodes
            ]
            together += max(per_node, default=0.0)
            alone += sum(per_node)
        elif rnd.name == "ladder on 1 node, every node":
            per_node = [
                max(
                    (v for (n, what, scope), v in spent.items()
                     if n == node and what == "ladder_rung" and scope == (node,)),
                    default=0.0,
                )
                for node in nodes
            ]  # fmt: skip
            together += max(per_node, default=0.0)
            alone += sum(per_node)
        elif rnd.name.startswith("ib_write_bw"):
            pairs = plan.ib_pairs[ib_round] if ib_round < len(plan.ib_pairs) else ()
            ib_round += 1
            per_pair = [
                max(
                    (v for (_, what, scope), v in spent.items()
                     if what == "ib_write_bw" and tuple(scope) == tuple(pair)),
                    default=0.0,
                )
                for pair in pairs
            ]  # fmt: skip
            together += max(per_pair, default=0.0)
            alone += sum(per_pair)
        else:  # an all-reduce across the nodes, a ladder rung: its members at once
            members = tuple(nodes)
            kind = "allreduce_multi" if rnd.name.startswith("all-reduce") else "ladder_rung"
            took = max(
                (v for (_, what, scope), v in spent.items() if scope == members and what == kind),
                default=0.0,
            )
            together += took
            alone += took
    if plan.level is Level.FULL:
        more_together, more_alone = _unplanned_groups(ledger, planned_groups)
        together += more_together
        alone += more_alone
    return together, alone


def _unplanned_groups(
    ledger: list[Spent], planned: set[tuple[str, tuple[str, ...]]]
) -> tuple[float, float]:
    """Groups run beyond the plan (a bisection's halves, run at once), in rounds.

    A round is the groups that started within a second of each other, as long as its longest.
    """
    extra: dict[tuple[str, tuple[str, ...]], tuple[float, float]] = {}
    for e in ledger:
        key = (e.what, e.scope)
        if e.what in _GROUP and key not in planned:
            began, took = extra.get(key, (e.started, 0.0))
            extra[key] = (min(began, e.started), max(took, e.seconds))
    rounds: list[tuple[float, float]] = []  # (first start, longest)
    for began, took in sorted(extra.values()):
        if rounds and began - rounds[-1][0] < 1.0:
            rounds[-1] = (rounds[-1][0], max(rounds[-1][1], took))
        else:
            rounds.append((began, took))
    return sum(took for _, took in rounds), sum(took for _, took in extra.values())


_NODE_TOOLS: Final = frozenset({"p2p", "host", "allreduce_node"})
_GROUP: Final = frozenset({"allreduce_multi", "ladder_rung"})


async def run_case(seed: int, count: int, workdir: Path, clock: SystemClock) -> Case:
    """Plant the seed's problems on a fresh cluster, run ``full``, score what it named."""
    names = node_names(count)
    case = Case(seed, plant(seed, names))
    secret, secret_file = write_secret(workdir)
    with WebhookReceiver(clock=clock, secret=secret) as receiver:
        cfg = CollectorConfig(
            listen="127.0.0.1:0",
            http="127.0.0.1:0",
            journal=workdir / "journal.db",
            heartbeat_interval=1.0,
            actions=demo_actions(receiver.url, secret_file),
        )
        collector = CollectorService(cfg, clock)
        await collector.start()
        sockets = tempfile.TemporaryDirectory(prefix="fwpf-")
        fabric = SimFabric({}, seed=seed, util_hold_s=UTIL_HOLD_S)
        cluster = SimCluster(
            names,
            workdir / "nodes",
            clock,
            f"127.0.0.1:{collector.grpc_port}",
            poll_interval=1.0,
            heartbeat_interval=1.0,
            job_socket_dir=Path(sockets.name),
            preflight=fabric.runners_for,
        )
        for p in case.planted:
            for f in p.faults:
                apply_fault(f, cluster.nodes[f.node])
        cluster.start()
        try:
            await _connected(collector, names)
            service = collector.preflight
            began = time.monotonic()
            plans = {lvl: service.plan(lvl, "all") for lvl in (Level.STANDARD, Level.FULL)}
            full = plans[Level.FULL]
            address_by_name(full)  # every simulated agent is 127.0.0.1 to the collector
            run = await service.execute(full)
            case.real_s = time.monotonic() - began
            results = list(service.latest_results)
            ledger = list(fabric.ledger)
            for lvl, plan in plans.items():
                together, alone = plan_seconds(plan, ledger)
                case.times[lvl.value] = {"orchestrated_s": together, "serial_s": alone}
        finally:
            await cluster.stop()
            await collector.stop(grace=None)
            sockets.cleanup()
    case.verdict = run.verdict
    case.could_not_run = [
        f"{r.node} {r.check} {r.component}: {r.reason or r.error}"
        for r in results
        if r.verdict == "could_not_run"
    ]
    for p in case.planted:
        case.found[p.describe()] = named(p, run, results)
    faulty = {p.node for p in case.planted if p.held}
    case.false_holds = sorted(
        n for n, v in (run.node_verdicts or {}).items() if v == "fail" and n not in faulty
    )
    case.why_held = [
        f"{r.node} {r.check} {r.component}: {r.reason}"
        for r in results
        if r.node in case.false_holds and r.verdict == "fail"
    ]
    return case


async def _connected(collector: CollectorService, names: list[str]) -> None:
    """Until every node's stream is up and its Hello in the model."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    registry = collector.grpc.registry
    while time.monotonic() < deadline:
        view = collector.fleet.snapshot()
        if all(n in view and view[n].gpus and registry.session(n) is not None for n in names):
            await asyncio.sleep(1.0)  # each stream past its Hello and first report
            return
        await asyncio.sleep(0.1)
    msg = "the simulated nodes did not all connect"
    raise TimeoutError(msg)


def summarise(cases: list[Case], count: int) -> dict[str, Any]:
    """The JSON line."""
    planted = [ok for c in cases for ok in c.found.values()]
    by_kind: dict[str, list[bool]] = {}
    for c in cases:
        for p in c.planted:
            by_kind.setdefault(p.kind, []).append(c.found[p.describe()])
    out: dict[str, Any] = {
        "cases": len(planted),
        "seeds": len(cases),
        "nodes": count,
        "localised_share": round(sum(planted) / len(planted), 4) if planted else None,
        "localised_by_kind": {k: f"{sum(v)}/{len(v)}" for k, v in sorted(by_kind.items())},
        "false_holds": sum(len(c.false_holds) for c in cases),
        "results_could_not_run": sum(len(c.could_not_run) for c in cases),
        "real_s_per_full_run_median": round(statistics.median(c.real_s for c in cases), 2)
        if cases
        else None,
    }
    if not planted:
        out["why"] = "no case ran"
    times: dict[str, Any] = {}
    for lvl in ("standard", "full"):
        got = [c.times[lvl] for c in cases if lvl in c.times]
        if not got:
            times[lvl] = None
            continue
        together = statistics.median(t["orchestrated_s"] for t in got)
        alone = statistics.median(t["serial_s"] for t in got)
        times[lvl] = {
            "orchestrated_s": round(together, 1),
            "serial_s": round(alone, 1),
            "ratio": round(alone / together, 2) if together else None,
        }
    out["qualify_s_16_nodes"] = {
        lvl: (t["orchestrated_s"] if t else None) for lvl, t in times.items()
    }
    out["serial_s_16_nodes"] = {lvl: (t["serial_s"] if t else None) for lvl, t in times.items()}
    out["serial_over_orchestrated"] = {lvl: (t["ratio"] if t else None) for lvl, t in times.items()}
    out["tool_seconds_modelled"] = {**TOOL_SECONDS, "quick": QUICK_S}
    missed = sorted(k for k, v in by_kind.items() if not all(v))
    if missed:
        out["missed_kinds"] = missed
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    clock = SystemClock()
    cases: list[Case] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fw-bench-preflight-") as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            workdir = Path(tmp) / f"seed-{seed}"
            workdir.mkdir()
            case = await run_case(seed, args.nodes, workdir, clock)
            cases.append(case)
            missed = [k for k, ok in case.found.items() if not ok]
            print(
                f"seed {seed}: verdict {case.verdict}, named {sum(case.found.values())}"
                f"/{len(case.found)}, false holds {case.false_holds or 0}, "
                f"{case.real_s:.1f} s real" + (f"; missed: {'; '.join(missed)}" if missed else ""),
                flush=True,
            )
            for line in case.could_not_run[:3]:
                print(f"  could not run: {line[:200]}", flush=True)
            for line in case.why_held[:3]:
                print(f"  held: {line[:300]}", flush=True)
    result = summarise(cases, args.nodes)
    result["wall_s"] = round(time.monotonic() - began, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=SEEDS, help="cases sets (one cluster each)")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=NODES)
    args = parser.parse_args()
    if args.nodes < 7:  # noqa: PLR2004 - five problems on seven nodes (the cable on two)
        parser.error("--nodes must be at least 7")
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(40),  # errors only
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    with contextlib.suppress(KeyboardInterrupt):
        result = asyncio.run(main_async(args))
        print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
