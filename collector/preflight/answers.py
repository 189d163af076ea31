"""What a node may answer in a pre-flight round: what its plan asked of it, each once.

A node's results are its own word, and a compromised node's word may be a weapon: an
``ib_write_bw`` result for a rail between two other nodes, or for a rail it was never planned
on, blames a healthy neighbour; three hundred copies of one figure move the fleet's median. So
a measurement is kept only when its check was asked of the node and its component is one the
collector planned for it (derived from the task and the node's own Hello, never from the strings
the node sent), and only the first of each (check, component). The rest is refused, counted by
reason, and the node that sent it is suspect itself (:class:`Misfit`); its neighbours are not.

Components by check (:mod:`fleetwatch.preflight.vocabulary`): ``node``; ``gpu:<i>`` for each of
its GPUs; ``gpu:<i>-gpu:<j>`` for each ordered pair (``p2p_bidir_bw``: ``i < j``);
``nic:<hca>`` and ``ib:<hca>/<port>`` for its ports; ``rail:...`` for each of its task's
``ib_tests``; ``nodes:<n>`` for each of its task's groups of that check. A check that could not
run may say so on ``node``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from fleetwatch.preflight.vocabulary import Check, rail_component

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from collector.preflight.plan import NodeFacts
    from fleetwatch.preflight.vocabulary import Measurement
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

_NODE: Final = frozenset({Check.GPU_COUNT, Check.DRIVER_VERSION, Check.CUDA_VERSION})
_PER_GPU: Final = frozenset(
    {
        Check.GPU_MODEL,
        Check.NVLINK_UP,
        Check.GPU_PCIE_LINK,
        Check.ECC_MODE,
        Check.ROW_REMAP,
        Check.COMPUTE_PROCESSES,
        Check.PERSISTENCE_MODE,
        Check.VBIOS_VERSION,
        Check.H2D_BW,
        Check.D2H_BW,
    }
)
_PER_NIC: Final = frozenset({Check.NIC_PCIE_LINK, Check.NIC_FIRMWARE})
_GROUPED: Final = frozenset({Check.ALLREDUCE_NODE, Check.ALLREDUCE_MULTI, Check.LADDER_THROUGHPUT})
MAX_SHOWN: Final = 3  # refused results a misfit's reason quotes


@dataclass(frozen=True, slots=True)
class Misfit:
    """A node's answer that did not fit its plan: what was refused, and why."""

    node: str
    refused: tuple[tuple[Measurement, str], ...]

    @property
    def reason(self) -> str:
        """One line for the run's detail and the node's drain reason."""
        shown = "; ".join(
            f"{m.check} {m.component[:80]!r}: {why}" for m, why in self.refused[:MAX_SHOWN]
        )
        more = len(self.refused) - MAX_SHOWN
        tail = f" and {more} more" if more > 0 else ""
        return (
            f"{self.node} answered {len(self.refused)} result(s) its plan did not ask for, "
            f"none used ({shown}{tail})"
        )


@dataclass(slots=True)
class Screened:
    """The results kept, and those refused with why."""

    kept: list[Measurement] = field(default_factory=list)
    refused: list[tuple[Measurement, str]] = field(default_factory=list)

    def reasons(self) -> Counter[str]:
        """Refusals by reason, for ``fleetwatch_preflight_results_refused_total``."""
        return Counter(why.split(":", 1)[0] for _, why in self.refused)


def _groups(check: Check, task: pb.PreflightTask) -> frozenset[str]:
    wanted = Check.LADDER_THROUGHPUT if check == Check.GPU_UTILISATION else check
    return frozenset(
        "node" if check == Check.ALLREDUCE_NODE else f"nodes:{len(g.nodes)}"
        for g in task.groups
        if g.check == wanted
    )


def planned_components(
    check: Check, task: pb.PreflightTask, facts: NodeFacts, node: str
) -> frozenset[str]:
    """The components of ``check`` the collector planned for ``node`` in ``task``."""
    gpus = range(facts.gpus)
    by_kind: dict[frozenset[Check], Callable[[], Iterable[str]]] = {
        _NODE: lambda: ("node",),
        _PER_GPU: lambda: (f"gpu:{i}" for i in gpus),
        _PER_NIC: lambda: (f"nic:{hca}" for hca, _ in facts.rails),
        frozenset({Check.IB_PORT}): lambda: (f"ib:{hca}/{port}" for hca, port in facts.rails),
        frozenset({Check.P2P_BW}): lambda: (
            f"gpu:{i}-gpu:{j}" for i, j in itertools.permutations(gpus, 2)
        ),
        frozenset({Check.P2P_BIDIR_BW}): lambda: (
            f"gpu:{i}-gpu:{j}" for i, j in itertools.combinations(gpus, 2)
        ),
        frozenset({Check.IB_WRITE_BW}): lambda: (
            rail_component(t.device, t.port, node, t.peer, server=t.server) for t in task.ib_tests
        ),
        _GROUPED | {Check.GPU_UTILISATION}: lambda: _groups(check, task),
    }
    for checks, components in by_kind.items():
        if check in checks:
            return frozenset(components())
    return frozenset()  # ladder_efficiency and the like: the collector's own, never a node's


def screen_answer(
    node: str, task: pb.PreflightTask, facts: NodeFacts, measurements: Iterable[Measurement]
) -> Screened:
    """Keep what ``node`` was asked for, each (check, component) once; refuse the rest."""
    asked = {Check(c) for c in task.checks}
    if Check.LADDER_THROUGHPUT in asked:
        asked.add(Check.GPU_UTILISATION)  # sampled while the rung ran
    planned: dict[Check, frozenset[str]] = {}
    seen: set[tuple[Check, str]] = set()
    out = Screened()
    for m in measurements:
        if m.check not in asked:
            out.refused.append((m, f"not_asked: {m.check} was not asked of {node}"))
            continue
        if m.check not in planned:
            planned[m.check] = planned_components(m.check, task, facts, node)
        could_not_run_here = m.component == "node" and not m.ran
        if m.component not in planned[m.check] and not could_not_run_here:
            out.refused.append((m, f"not_planned: no such {m.check} was planned for {node}"))
            continue
        if (m.check, m.component) in seen:
            out.refused.append((m, f"duplicate: a second {m.check} of the same component"))
            continue
        seen.add((m.check, m.component))
        out.kept.append(m)
    return out
