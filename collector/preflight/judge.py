"""The judge: each measurement against its gate, the versions across nodes, the fleet's outliers.

Three passes over a run's measurements:

1. :meth:`GateBook.judge <rules.gates.GateBook.judge>` for every measurement,
   with the node's GPU model and NIC generation (from its Hello); no result is never a pass.
2. Consistency: driver, CUDA, VBIOS and HCA firmware must be the same on every node qualified;
   the odd one out fails, named (:func:`~rules.gates.odd_ones_out`).
3. Outliers: each measured check's values across the run (every node, every component) by a
   robust z-score (:meth:`GateBook.outliers`); an outlier's verdict is at least the gates file's
   outlier verdict (warn, or fail with ``fail_z``), whatever its fixed gate said.

Group results (a multi-node all-reduce, a ladder rung: component ``nodes:<n>``) and the rails
between two nodes (``rail:...``) belong to no one node (a one-node rung, ``nodes:1``, is its
node's own: its throughput is compared with every other node's): they make the run's verdict, and
:mod:`collector.preflight.localise` says which node, GPU pair or rail they point at.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from fleetwatch.preflight.vocabulary import RANK, Check, Measurement, Verdict, worst
from rules.gates import odd_ones_out

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rules.gates import GateBook

VERSIONS: Final = (
    Check.DRIVER_VERSION,
    Check.CUDA_VERSION,
    Check.VBIOS_VERSION,
    Check.NIC_FIRMWARE,
)
SHARED_PREFIXES: Final = ("nodes:", "rail:")
ONE_NODE: Final = "nodes:1"  # a one-node group's component: that node's own result


@dataclass(frozen=True, slots=True)
class NodeKind:
    """What a node's measurements are judged as: its GPU model's and NIC's gates."""

    gpu_model: str
    nic: str


@dataclass(frozen=True, slots=True)
class Judged:
    """One measurement of one node, judged."""

    node: str
    m: Measurement
    verdict: Verdict
    gate: str  # "<scope>: <bar>", "" when none applied
    reason: str

    @property
    def shared(self) -> bool:
        """A result of a group of nodes or a rail, not of this node alone.

        A group of one node (the ladder's one-node rung, ``nodes:1``) is the node's own.
        """
        return self.m.component.startswith(SHARED_PREFIXES) and self.m.component != ONE_NODE


def _gate_text(judgement: object) -> str:
    gate = getattr(judgement, "gate", None)
    if gate is None:
        return ""
    return f"{gate.scope}: {gate.bar} ({gate.source})"[:500]


def ladder_efficiency(throughputs: Mapping[int, float]) -> dict[int, tuple[float, str]]:
    """Efficiency of each rung against the one before: t(n) / (n/m * t(m)), with the working."""
    out: dict[int, tuple[float, str]] = {}
    rungs = sorted(k for k, v in throughputs.items() if v > 0 and math.isfinite(v))
    for m, n in itertools.pairwise(rungs):
        eff = throughputs[n] / (n / m * throughputs[m])
        working = (
            f"{throughputs[n]:.4g} samples/s on {n} nodes against {throughputs[m]:.4g} on {m}: "
            f"{throughputs[n] / throughputs[m]:.2f}x for {n / m:g}x the nodes"
        )
        out[n] = (round(eff, 4), working)
    return out


def add_ladder_efficiency(results: dict[str, list[Measurement]]) -> None:
    """Append ``ladder_efficiency`` to the node that measured the rungs' throughputs."""
    for ms in results.values():
        thr = {
            int(m.component.split(":", 1)[1]): m.value
            for m in ms
            if m.check == Check.LADDER_THROUGHPUT and m.value is not None and m.ran
        }
        for n, (eff, working) in ladder_efficiency(thr).items():
            ms.append(
                Measurement(Check.LADDER_EFFICIENCY, f"nodes:{n}", eff, "ratio", evidence=working)
            )


def judge_run(
    results: Mapping[str, Sequence[Measurement]],
    kinds: Mapping[str, NodeKind],
    book: GateBook,
) -> list[Judged]:
    """Every measurement judged: gates, then consistency, then outliers."""
    judged: list[Judged] = []
    for node, ms in results.items():
        kind = kinds.get(node, NodeKind("", ""))
        for m in ms:
            j = book.judge(m, kind.gpu_model, kind.nic)
            judged.append(Judged(node, m, j.verdict, _gate_text(j), j.reason))
    judged = _consistency(judged)
    return _outliers(judged, kinds, book)


def _consistency(judged: list[Judged]) -> list[Judged]:
    out = list(judged)
    for check in VERSIONS:
        texts: dict[str, set[str]] = defaultdict(set)
        for j in out:
            if j.m.check == check and j.m.ran and j.m.text:
                texts[j.node].add(j.m.text)
        per_node = {node: ", ".join(sorted(values)) for node, values in texts.items()}
        odd = odd_ones_out(per_node)
        if not odd:
            continue
        for i, j in enumerate(out):
            if j.m.check == check and j.node in odd and j.m.ran:
                reason = f"{check} differs on {j.node}: {odd[j.node]}"
                out[i] = replace(j, verdict=worst([j.verdict, Verdict.FAIL]), reason=reason)
    return out


def _outliers(judged: list[Judged], kinds: Mapping[str, NodeKind], book: GateBook) -> list[Judged]:
    out = list(judged)
    # A group's figure is compared only with groups of the same size (a ladder rung's
    # throughput grows with its nodes): the one-node rung of every node, say.
    by_check: dict[tuple[Check, str], list[int]] = defaultdict(list)
    for i, j in enumerate(out):
        if j.m.value is not None and j.m.ran:
            size = j.m.component if j.m.component.startswith("nodes:") else ""
            by_check[j.m.check, size].append(i)
    for (check, _), indexes in by_check.items():
        first = out[indexes[0]]
        kind = kinds.get(first.node, NodeKind("", ""))
        values: list[float | None] = [out[i].m.value for i in indexes]
        for found in book.outliers(check, values, kind.gpu_model, kind.nic):
            i = indexes[found.index]
            j = out[i]
            if RANK[found.verdict] <= RANK[j.verdict]:
                continue
            reason = f"{j.reason}; outlier: {found.reason}"
            out[i] = replace(j, verdict=found.verdict, reason=reason[:1000])
    return out


def node_verdicts(judged: Sequence[Judged], nodes: Sequence[str]) -> dict[str, Verdict]:
    """Each node's verdict from its own results (not the groups' and rails' it took part in)."""
    mine: dict[str, list[Verdict]] = {node: [] for node in nodes}
    for j in judged:
        if not j.shared and j.node in mine:
            mine[j.node].append(j.verdict)
    return {node: worst(v) for node, v in mine.items()}
