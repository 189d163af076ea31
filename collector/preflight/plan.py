"""The planner: a level and a set of nodes become rounds of tasks, one task per node and round.

Every task of a round runs at once; a round ends when every node answered (or its time is up).

* ``quick``: one round, every node reads its own inventory (:data:`QUICK`).
* ``standard``: the quick round, then one round in which each node measures its GPU pairs, its
  host<->device copies and a one-node all-reduce (:data:`NODE_BANDWIDTH`).
* ``full``: both, then ``ib_write_bw`` on every rail the nodes share, between node pairs chosen
  in rounds of disjoint pairs, so every pair of a round runs at once and every rail of a pair too
  (each rail is its own HCA). The pairs are the edges of a ring over the nodes in name order
  (a-b, b-c, ..., z-a): two rounds for an even count, three for an odd one, and every node meets
  two partners, which is what tells a bad node (low with both) from a bad cable (low with one).
  The lower-named node of a pair serves, the other is the client. Then a multi-node all-reduce
  over every node, and the scaling ladder: one small training step on one node, every node at
  once in one round (each node's throughput is judged against the fleet's: a slow GPU), then on
  the first 2, 4, 8, 16 ... nodes (the powers of two up to the node count), one rung per round.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from fleetwatch.preflight.vocabulary import LEVEL_OF, Check, Level
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Sequence

QUICK: Final = tuple(c for c, level in LEVEL_OF.items() if level is Level.QUICK)
NODE_BANDWIDTH: Final = (
    Check.P2P_BW,
    Check.P2P_BIDIR_BW,
    Check.H2D_BW,
    Check.D2H_BW,
    Check.ALLREDUCE_NODE,
)
LADDER: Final = (Check.LADDER_THROUGHPUT, Check.GPU_UTILISATION)


@dataclass(frozen=True, slots=True)
class PlanTimes:
    """Each round's time, the ports the tools listen on, and the collectives' sizes."""

    quick_s: float = 60.0
    node_bandwidth_s: float = 900.0
    ib_s: float = 180.0
    allreduce_s: float = 600.0
    ladder_s: float = 900.0
    ib_base_port: int = 18515  # perftest's default; rail i uses base + i
    rendezvous_port: int = 29500  # torch.distributed's default; round k uses base + k
    allreduce_bytes: int = 1 << 30
    ladder_steps: int = 20


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the planner needs of a node: where it is and what it has (from its Hello)."""

    name: str
    address: str
    gpus: int
    gpu_model: str = ""
    rails: tuple[tuple[str, int], ...] = ()  # (HCA, port) of its InfiniBand ports
    ib_rate_gbps: float = 0.0  # the highest rate its ports declared (says the NIC generation)


@dataclass(frozen=True, slots=True)
class Round:
    """Tasks that run at once, one per node, and how long the round may take."""

    name: str
    timeout_s: float
    tasks: dict[str, pb.PreflightTask] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """What ``--dry-run`` prints."""
        nodes: dict[str, Any] = {}
        for node, task in self.tasks.items():
            entry: dict[str, Any] = {"checks": list(task.checks)}
            if task.groups:
                entry["groups"] = [
                    {
                        "check": g.check,
                        "nodes": list(g.nodes),
                        "rank": g.node_rank,
                        "rendezvous": f"{g.master_addr}:{g.master_port}",
                    }
                    for g in task.groups
                ]
            if task.ib_tests:
                entry["ib_write_bw"] = [
                    {
                        "rail": f"{t.device}/{t.port}",
                        "role": "server" if t.server else "client",
                        "peer": t.peer,
                        "port": t.tcp_port,
                    }
                    for t in task.ib_tests
                ]
            nodes[node] = entry
        return {"name": self.name, "timeout_s": self.timeout_s, "nodes": nodes}


@dataclass(frozen=True, slots=True)
class Plan:
    """A run's rounds, in order."""

    run_id: str
    level: Level
    nodes: tuple[str, ...]
    rounds: tuple[Round, ...]
    ib_pairs: tuple[tuple[tuple[str, str], ...], ...] = ()  # per ib round: (server, client)
    ladder: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """What ``--dry-run`` prints."""
        return {
            "run_id": self.run_id,
            "level": self.level.value,
            "nodes": list(self.nodes),
            "rounds": [r.to_json() for r in self.rounds],
            "ib_pairs": [[list(p) for p in pairs] for pairs in self.ib_pairs],
            "ladder": list(self.ladder),
        }


def ring_pair_rounds(names: Sequence[str]) -> list[list[tuple[str, str]]]:
    """The ring's edges over ``names`` (in their order), in rounds of disjoint pairs.

    Each pair is (lower name, higher name): the first serves. Two nodes make one pair; one
    node makes none.
    """
    n = len(names)
    if n < 2:  # noqa: PLR2004 - a pair needs two
        return []
    edges = [(names[0], names[1])] if n == 2 else [(names[i], names[(i + 1) % n]) for i in range(n)]  # noqa: PLR2004
    rounds: list[list[tuple[str, str]]] = []
    busy: list[set[str]] = []
    for a, b in edges:
        for index, taken in enumerate(busy):
            if a not in taken and b not in taken:
                rounds[index].append((a, b))
                taken.update((a, b))
                break
        else:
            rounds.append([(a, b)])
            busy.append({a, b})
    return [[(min(a, b), max(a, b)) for a, b in pairs] for pairs in rounds]


def ladder_rungs(count: int, largest: int = 16) -> list[int]:
    """1, 2, 4, 8, 16 ... up to ``count`` nodes (and at most ``largest``)."""
    return [k for k in (2**i for i in range(32)) if k <= min(count, largest)]


def _task(
    run_id: str, level: Level, name: str, checks: Sequence[Check], timeout_s: float
) -> pb.PreflightTask:
    return pb.PreflightTask(
        run_id=run_id,
        task_id=f"{run_id}.{name}",
        level=level.value,
        checks=[c.value for c in checks],
        timeout_s=timeout_s,
    )


def _group(
    check: Check,
    members: Sequence[NodeFacts],
    rank: int,
    port: int,
    times: PlanTimes,
) -> pb.PreflightGroup:
    return pb.PreflightGroup(
        check=check.value,
        nodes=[m.name for m in members],
        node_rank=rank,
        gpus_per_node=max(min(m.gpus for m in members), 1),
        master_addr=members[0].address,
        master_port=port,
        size_bytes=times.allreduce_bytes,
        steps=times.ladder_steps if check == Check.LADDER_THROUGHPUT else 0,
    )


def plan_run(
    run_id: str,
    level: Level,
    nodes: Sequence[NodeFacts],
    times: PlanTimes | None = None,
) -> Plan:
    """The rounds that qualify ``nodes`` at ``level`` (each level includes the ones before)."""
    times = times or PlanTimes()
    facts = sorted(nodes, key=lambda f: f.name)
    names = tuple(f.name for f in facts)
    rounds: list[Round] = []
    counter = itertools.count()

    def new_round(name: str, timeout_s: float) -> Round:
        r = Round(name=name, timeout_s=timeout_s)
        rounds.append(r)
        next(counter)
        return r

    quick = new_round("quick", times.quick_s)
    for f in facts:
        quick.tasks[f.name] = _task(run_id, level, f"{f.name}.quick", QUICK, times.quick_s)
    if level is Level.QUICK:
        return Plan(run_id, level, names, tuple(rounds))
    node_round = new_round("node bandwidth", times.node_bandwidth_s)
    for f in facts:
        task = _task(run_id, level, f"{f.name}.node", NODE_BANDWIDTH, times.node_bandwidth_s)
        # one node, its own rendezvous on itself
        one = _group(Check.ALLREDUCE_NODE, [f], 0, times.rendezvous_port, times)
        one.master_addr = "127.0.0.1"
        task.groups.append(one)
        node_round.tasks[f.name] = task
    if level is Level.STANDARD:
        return Plan(run_id, level, names, tuple(rounds))
    ib_pairs = _ib_rounds(run_id, level, facts, times, new_round)
    if len(facts) >= 2:  # noqa: PLR2004 - a multi-node collective needs two
        port = times.rendezvous_port + 1
        multi = new_round(f"all-reduce on {len(facts)} nodes", times.allreduce_s)
        for rank, f in enumerate(facts):
            task = _task(
                run_id, level, f"{f.name}.allreduce", (Check.ALLREDUCE_MULTI,), times.allreduce_s
            )
            task.groups.append(_group(Check.ALLREDUCE_MULTI, facts, rank, port, times))
            multi.tasks[f.name] = task
    rungs = ladder_rungs(len(facts))
    _ladder_rounds(
        run_id=run_id, level=level, facts=facts, rungs=rungs, times=times, new_round=new_round
    )
    return Plan(run_id, level, names, tuple(rounds), ib_pairs=ib_pairs, ladder=tuple(rungs))


def _ladder_rounds(  # noqa: PLR0913 - the planner's state, passed on
    *,
    run_id: str,
    level: Level,
    facts: Sequence[NodeFacts],
    rungs: Sequence[int],
    times: PlanTimes,
    new_round: Any,  # noqa: ANN401 - the planner's round factory
) -> None:
    """The ladder: the one-node rung on every node at once, then one round per larger rung.

    Each node's one-node rung is its own group (its rendezvous on itself), so every node's
    throughput is measured in one round and judged against the fleet's: a slow GPU slows its
    own node's step and nothing else. The larger rungs run on the first ``k`` nodes.
    """
    if not rungs:
        return
    one_node = new_round("ladder on 1 node, every node", times.ladder_s)
    for f in facts:
        task = _task(run_id, level, f"{f.name}.ladder1", LADDER, times.ladder_s)
        one = _group(Check.LADDER_THROUGHPUT, [f], 0, times.rendezvous_port + 3, times)
        one.master_addr = "127.0.0.1"
        task.groups.append(one)
        one_node.tasks[f.name] = task
    for k in rungs[1:]:
        members = facts[:k]
        rung = new_round(f"ladder on {k} nodes", times.ladder_s)
        port = times.rendezvous_port + 2 + k
        for rank, f in enumerate(members):
            task = _task(run_id, level, f"{f.name}.ladder{k}", LADDER, times.ladder_s)
            task.groups.append(_group(Check.LADDER_THROUGHPUT, members, rank, port, times))
            rung.tasks[f.name] = task


def collective_round(  # noqa: PLR0913 - one round of disjoint groups, named
    *,
    run_id: str,
    level: Level,
    name: str,
    groups: Sequence[Sequence[NodeFacts]],
    port: int,
    times: PlanTimes,
) -> Round:
    """A round of multi-node all-reduces, one per group, at once (group *i* on ``port + i``)."""
    r = Round(name=name, timeout_s=times.allreduce_s)
    slug = "".join(c if c.isalnum() or c in "._-" else "-" for c in name)
    for index, members in enumerate(groups):
        for rank, f in enumerate(members):
            task = _task(
                run_id, level, f"{f.name}.{slug}", (Check.ALLREDUCE_MULTI,), times.allreduce_s
            )
            task.groups.append(_group(Check.ALLREDUCE_MULTI, members, rank, port + index, times))
            r.tasks[f.name] = task
    return r


def shared_rails(facts: Sequence[NodeFacts]) -> list[tuple[str, int]]:
    """The rails (HCA, port) every node has, in order."""
    if not facts:
        return []
    common = set(facts[0].rails)
    for f in facts[1:]:
        common &= set(f.rails)
    return sorted(common)


def ib_tasks(  # noqa: PLR0913 - one round's pairs, named
    *,
    run_id: str,
    level: Level,
    name: str,
    pairs: Sequence[tuple[NodeFacts, NodeFacts]],
    rails: Sequence[tuple[str, int]],
    times: PlanTimes,
) -> Round:
    """A round of ``ib_write_bw`` on every rail between each (server, client) pair."""
    r = Round(name=name, timeout_s=times.ib_s)
    slug = "".join(c if c.isalnum() or c in "._-" else "-" for c in name)
    for server, client in pairs:
        for me, peer, serving in ((server, client, True), (client, server, False)):
            task = _task(run_id, level, f"{me.name}.{slug}", (Check.IB_WRITE_BW,), times.ib_s)
            for index, (device, port) in enumerate(rails):
                task.ib_tests.append(
                    pb.PreflightIbTest(
                        device=device,
                        port=port,
                        server=serving,
                        peer=peer.name,
                        server_addr="" if serving else server.address,
                        tcp_port=times.ib_base_port + index,
                    ),
                )
            r.tasks[me.name] = task
    return r


def _ib_rounds(
    run_id: str,
    level: Level,
    facts: Sequence[NodeFacts],
    times: PlanTimes,
    new_round: Any,  # noqa: ANN401 - the planner's round factory
) -> tuple[tuple[tuple[str, str], ...], ...]:
    rails = shared_rails(facts)
    if not rails:
        return ()
    by_name = {f.name: f for f in facts}
    out: list[tuple[tuple[str, str], ...]] = []
    pair_rounds = ring_pair_rounds([f.name for f in facts])
    for index, pairs in enumerate(pair_rounds, start=1):
        name = f"ib_write_bw {index}/{len(pair_rounds)}"
        made = ib_tasks(
            run_id=run_id,
            level=level,
            name=name,
            pairs=[(by_name[a], by_name[b]) for a, b in pairs],
            rails=rails,
            times=times,
        )
        r = new_round(name, times.ib_s)
        r.tasks.update(made.tasks)
        out.append(tuple(pairs))
    return tuple(out)
