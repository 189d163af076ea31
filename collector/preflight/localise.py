"""Localisation: narrow a failed result to the node, GPU, GPU pair, IB port or cable to blame.

From the results the plan already gathered, no extra round where they suffice:

* ``ib_write_bw`` (rails): the ring pairing gives every node two partners per rail. A pair that
  fails where one end fails with every partner blames that end's port (``ib_port``); where both
  ends pass with their other partners it blames the link between the two (``cable``: neither
  node is held out, the cable is); where neither end has another partner (two nodes) it stays a
  ``pair``. A port the quick check found below its rate explains its rail's failures.
* GPU pairs (``p2p_bw``/``p2p_bidir_bw``) inside a node: a GPU in most of its failing pairs (and
  at least two) is the ``gpu`` to blame (its NVLinks); otherwise each failing pair is a
  ``gpu_pair`` (low peer-to-peer bandwidth with no NVLink down, say).
* A node whose one-node ladder rung is slow against the fleet's (its ``ladder_throughput``
  ``nodes:1`` failed): the GPU its peers waited for (the busiest in the utilisation the agent
  sampled while the rung ran, ``gpu``), or the node when none stands out (``node``).
* A failed multi-node all-reduce or ladder rung is ``explained`` only by a node of that group
  that failed on its own (or a cable or pair between two of its nodes); the groups are runs of
  the nodes in name order from the node that reported the figure (its rank 0), as the planner
  and the bisection make them; the first unexplained ladder rung that fails names the nodes it
  added (``ladder_rung``); a multi-node all-reduce left is ``unexplained``, naming every node
  of the run, and the orchestrator then bisects it with rounds of its own
  (:meth:`PreflightService._bisect <collector.preflight.orchestrator.PreflightService._bisect>`).
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from fleetwatch.preflight.vocabulary import Check, Verdict, worst

if TYPE_CHECKING:
    from collections.abc import Sequence

    from collector.preflight.judge import Judged

_RAIL: Final = re.compile(r"rail:(?P<rail>[^:]+):(?P<pair>.+)$")
_GPU_PAIR: Final = re.compile(r"gpu:(\d+)-gpu:(\d+)")
_BAD: Final = frozenset({Verdict.FAIL})
_GPU_UTIL: Final = re.compile(r"gpu:(\d+) (\d+(?:\.\d+)?)%")
# A slow node's busiest GPU is named when it was busy at least this many points more than the
# median of its peers (they wait for it at every step); otherwise the node is named.
SLOW_GPU_GAP: Final = 10.0


@dataclass(frozen=True, slots=True)
class Suspect:
    """What localisation blames, with the evidence; ``node`` "" when no one node is to blame."""

    kind: str  # node, gpu, gpu_pair, ib_port, cable, pair, ladder_rung, unexplained
    node: str
    component: str
    check: str
    verdict: Verdict
    reason: str
    nodes: tuple[str, ...] = ()
    evidence: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The journal's and the API's form."""
        return {
            "kind": self.kind,
            "node": self.node,
            "nodes": list(self.nodes or ((self.node,) if self.node else ())),
            "component": self.component,
            "check": self.check,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "evidence": self.evidence[:16],
        }


def localise(judged: Sequence[Judged], nodes: Sequence[str]) -> list[Suspect]:
    """Every suspect the results point at."""
    found = _rails(judged) + _gpu_pairs(judged) + _slow_nodes(judged)
    found += _groups(judged, nodes, {s.node for s in found if s.node})
    return found


def rail_parts(component: str, node: str) -> tuple[str, str, str] | None:
    """(rail, server, client) of ``rail:<hca>/<port>:<server>-<client>`` as ``node`` named it.

    Node names hold dashes themselves (``gpu-01``), so the end that reported the result tells
    where the pair splits; None when ``node`` is neither end.
    """
    match = _RAIL.fullmatch(component)
    if match is None:
        return None
    pair = match["pair"]
    if pair.startswith(f"{node}-"):
        return match["rail"], node, pair[len(node) + 1 :]
    if pair.endswith(f"-{node}"):
        return match["rail"], pair[: -len(node) - 1], node
    return None


def _shown(j: Judged) -> str:
    value = "no value" if j.m.value is None else f"{j.m.value:.4g} {j.m.unit}".strip()
    return f"{j.m.component} on {j.node}: {value} ({j.verdict})"


def _rails(judged: Sequence[Judged]) -> list[Suspect]:  # noqa: C901 - one pass per kind of blame
    # (rail, server, client) -> the worst verdict both ends reported, and the evidence
    pairs: dict[tuple[str, str, str], list[Judged]] = defaultdict(list)
    for j in judged:
        if j.m.check == Check.IB_WRITE_BW:
            parts = rail_parts(j.m.component, j.node)
            if parts is not None:
                pairs[parts].append(j)
    low_ports = {
        (j.node, j.m.component.removeprefix("ib:"))
        for j in judged
        if j.m.check == Check.IB_PORT and j.verdict in _BAD
    }
    bad_pair = {key: worst([j.verdict for j in js]) in _BAD for key, js in pairs.items()}
    partners: dict[tuple[str, str], list[tuple[str, bool]]] = defaultdict(list)
    for (rail, server, client), bad in bad_pair.items():
        partners[server, rail].append((client, bad))
        partners[client, rail].append((server, bad))

    def bad_everywhere(node: str, rail: str) -> bool:
        mine = partners[node, rail]
        return len(mine) >= 2 and all(bad for _, bad in mine)  # noqa: PLR2004 - two partners

    def alone(node: str, rail: str) -> bool:
        return len(partners[node, rail]) < 2  # noqa: PLR2004

    out: list[Suspect] = []
    blamed: set[tuple[str, str]] = set()
    for (rail, server, client), bad in sorted(bad_pair.items()):
        if not bad:
            continue
        evidence = [_shown(j) for j in pairs[rail, server, client]]
        ends = [n for n in (server, client) if (n, rail) in low_ports or bad_everywhere(n, rail)]
        for node in ends:
            if (node, rail) in blamed:
                continue
            blamed.add((node, rail))
            others = [f"with {p}: {'low' if b else 'fine'}" for p, b in partners[node, rail]]
            why = (
                f"IB port {rail} of {node} is below its rate"
                if (node, rail) in low_ports
                else f"ib_write_bw on {rail} of {node} is low with every partner"
            )
            out.append(
                Suspect(
                    "ib_port", node, f"ib:{rail}", Check.IB_WRITE_BW.value, Verdict.FAIL, why,
                    evidence=evidence + others,
                ),
            )  # fmt: skip
        if ends:
            continue
        if alone(server, rail) or alone(client, rail):
            why = (
                f"ib_write_bw on {rail} between {server} and {client} is low; with no other "
                "partner on this rail, the run cannot tell which end"
            )
            out.append(
                Suspect(
                    "pair", "", f"rail:{rail}:{server}-{client}", Check.IB_WRITE_BW.value,
                    Verdict.FAIL, why, nodes=(server, client), evidence=evidence,
                ),
            )  # fmt: skip
            continue
        why = (
            f"ib_write_bw on {rail} between {server} and {client} is low while both test fine "
            "with other partners: the link between them (cable, transceiver or switch port)"
        )
        out.append(
            Suspect(
                "cable", "", f"rail:{rail}:{server}-{client}", Check.IB_WRITE_BW.value,
                Verdict.FAIL, why, nodes=(server, client), evidence=evidence,
            ),
        )  # fmt: skip
    return out


def _gpu_pairs(judged: Sequence[Judged]) -> list[Suspect]:
    bad: dict[str, dict[tuple[int, int], list[Judged]]] = defaultdict(lambda: defaultdict(list))
    gpus: dict[str, set[int]] = defaultdict(set)
    for j in judged:
        if j.m.check not in (Check.P2P_BW, Check.P2P_BIDIR_BW):
            continue
        match = _GPU_PAIR.fullmatch(j.m.component)
        if match is None:
            continue
        a, b = sorted((int(match[1]), int(match[2])))
        gpus[j.node].update((a, b))
        if j.verdict in _BAD:
            bad[j.node][a, b].append(j)
    out: list[Suspect] = []
    for node, pairs in sorted(bad.items()):
        count = len(gpus[node])
        in_bad: dict[int, int] = defaultdict(int)
        for a, b in pairs:
            in_bad[a] += 1
            in_bad[b] += 1
        culprits = {g for g, k in in_bad.items() if k >= 2 and k * 2 > count - 1}  # noqa: PLR2004
        for gpu in sorted(culprits):
            evidence = [_shown(j) for (a, b), js in pairs.items() if gpu in (a, b) for j in js]
            why = f"GPU {gpu} of {node} is low with {in_bad[gpu]} of its {count - 1} peers"
            out.append(
                Suspect(
                    "gpu", node, f"gpu:{gpu}", Check.P2P_BW.value, Verdict.FAIL, why,
                    evidence=evidence,
                ),
            )  # fmt: skip
        for (a, b), js in sorted(pairs.items()):
            if a in culprits or b in culprits:
                continue
            why = f"GPUs {a} and {b} of {node} are low together and fine with every other peer"
            out.append(
                Suspect(
                    "gpu_pair", node, f"gpu:{a}-gpu:{b}", js[0].m.check.value, Verdict.FAIL, why,
                    evidence=[_shown(j) for j in js],
                ),
            )  # fmt: skip
    return out


def _slow_nodes(judged: Sequence[Judged]) -> list[Suspect]:
    util = {
        j.node: j
        for j in judged
        if j.m.check == Check.GPU_UTILISATION and j.m.component == "nodes:1" and j.m.ran
    }
    out: list[Suspect] = []
    for j in judged:
        if not (
            j.m.check == Check.LADDER_THROUGHPUT
            and j.m.component == "nodes:1"
            and j.verdict in _BAD
        ):
            continue
        evidence = [_shown(j), j.reason]
        sampled = util.get(j.node)
        per_gpu = (
            {int(g): float(p) for g, p in _GPU_UTIL.findall(sampled.m.evidence)}
            if sampled is not None
            else {}
        )
        if sampled is not None:
            evidence.append(f"GPU utilisation on {j.node}: {sampled.m.evidence}")
        busiest = max(per_gpu, key=lambda g: (per_gpu[g], -g), default=None)
        if busiest is not None and len(per_gpu) >= 2:  # noqa: PLR2004 - a GPU and a peer
            peers = statistics.median(p for g, p in per_gpu.items() if g != busiest)
            if per_gpu[busiest] - peers >= SLOW_GPU_GAP:
                why = (
                    f"{j.node}'s one-node training step is slow against the fleet's, and GPU "
                    f"{busiest} was busy {per_gpu[busiest]:g}% while its peers waited "
                    f"(median {peers:g}%): the step waits for GPU {busiest}"
                )
                out.append(
                    Suspect(
                        "gpu", j.node, f"gpu:{busiest}", Check.LADDER_THROUGHPUT.value,
                        Verdict.FAIL, why, evidence=evidence,
                    ),
                )  # fmt: skip
                continue
        why = (
            f"{j.node}'s one-node training step is slow against the fleet's and no one GPU "
            "stands out in the utilisation sampled while it ran"
        )
        out.append(
            Suspect(
                "node", j.node, "node", Check.LADDER_THROUGHPUT.value, Verdict.FAIL, why,
                evidence=evidence,
            ),
        )  # fmt: skip
    return out


def group_members(j: Judged, order: Sequence[str]) -> tuple[str, ...]:
    """The nodes of the group whose figure ``j`` is (``nodes:<k>`` reported by its rank 0).

    The planner's and the bisection's groups are runs of the nodes in name order, and rank 0
    reports the group's figure: ``k`` nodes from the reporter on. A figure that does not fit
    (an unknown reporter, a run past the end) is taken as every node's.
    """
    try:
        k = int(j.m.component.split(":", 1)[1])
        first = list(order).index(j.node)
    except (IndexError, ValueError):
        return tuple(order)
    members = tuple(order[first : first + k])
    return members if len(members) == k else tuple(order)


def _groups(judged: Sequence[Judged], nodes: Sequence[str], blamed: set[str]) -> list[Suspect]:
    out: list[Suspect] = []
    order = sorted(nodes)
    own_fails = {j.node for j in judged if not j.shared and j.verdict in _BAD} | blamed
    # a cable or pair between two nodes explains a group holding both
    links = [set(s.nodes) for s in _rails(judged) if s.kind in ("cable", "pair")]
    group_fails = [
        j
        for j in judged
        if j.m.check in (Check.ALLREDUCE_MULTI, Check.LADDER_EFFICIENCY) and j.verdict in _BAD
    ]
    unexplained: list[Judged] = []
    for j in group_fails:
        members = group_members(j, order)
        by = sorted(own_fails & set(members))
        by_link = [sorted(link) for link in links if link <= set(members)]
        if not by and not by_link:
            unexplained.append(j)
            continue
        named = by + [f"the link {a}-{b}" for a, b in by_link]
        why = (
            f"{j.m.check} {j.m.component} (from {j.node}) is explained by what failed on its own "
            f"among its nodes: {', '.join(named)}"
        )
        out.append(
            Suspect(
                "explained", "", j.m.component, j.m.check.value, Verdict.FAIL, why,
                nodes=tuple(by), evidence=[_shown(j)],
            ),
        )  # fmt: skip
    failing_rungs = sorted(
        (int(j.m.component.split(":", 1)[1]), j)
        for j in unexplained
        if j.m.check == Check.LADDER_EFFICIENCY
    )
    if failing_rungs:
        k = failing_rungs[0][0]
        previous = max((r for r in (2**i for i in range(32)) if r < k), default=1)
        added = tuple(order[previous:k])
        why = (
            f"scaling first falls short going from {previous} to {k} nodes: the nodes added "
            f"there ({', '.join(added)}) or the fabric between them"
        )
        out.append(
            Suspect(
                "ladder_rung", "", f"nodes:{k}", Check.LADDER_EFFICIENCY.value, Verdict.FAIL, why,
                nodes=added, evidence=[_shown(j) for _, j in failing_rungs],
            ),
        )  # fmt: skip
    collectives = [j for j in unexplained if j.m.check == Check.ALLREDUCE_MULTI]
    if collectives:
        why = "a multi-node all-reduce failed and no node, GPU or rail of it failed on its own"
        out.append(
            Suspect(
                "unexplained", "", "nodes", Check.ALLREDUCE_MULTI.value, Verdict.FAIL, why,
                nodes=tuple(order), evidence=[_shown(j) for j in collectives],
            ),
        )  # fmt: skip
    return out
