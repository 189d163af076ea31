"""Whom a hung or failed job's trouble is named on: rank, node, GPU, why, and the hardware there.

The suspects come in this order:

- the ranks of a node that stopped answering (a crashed node's ranks never say they are gone);
  beside them, the ranks that ended are not named: their end is what the silent node's did;
- the ranks whose own process stands out, and those the wait channels, Flight Recorders and
  stacks name (:func:`collector.jobs.liveness.suspects`); of the ranks gone, only those that
  went within ``culprit_window_s`` of the first;
- in a hang where every rank waits alike in a collective and none of that names anyone, the
  ranks still there whose GPU or node shows a fault that stops a collective (a GPU lost, an
  Xid, an NVLink or IB port down, NVML hung) now or since just before the last step (a few step
  times), when they are at most half the job's ranks (a fault everywhere is the fabric's, or
  nobody's).

Each is told with the hardware evidence on its node and GPU over the last hour; an Xid the
catalog classes as the application's is told apart and is not hardware evidence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from collector.jobs.diagnosis import Window, node_evidence
from collector.jobs.liveness import suspects
from collector.jobs.processes import GONE

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from collector.jobs.config import JobsConfig
    from collector.jobs.liveness import Liveness
    from collector.jobs.stacks import Localisation
    from collector.jobs.state import JobState
    from collector.model.history import History
    from collector.model.state import NodeState

EVIDENCE_S: Final = 3600.0  # the hardware evidence told beside a culprit
# A fault that stopped the collective came after the last finished step began (the agents may
# tell it later, not sooner): at most a few of its step times before, and at least 5 s.
HANG_LEAD_STEPS: Final = 3.0
HANG_LEAD_MIN_S: Final = 5.0
ALIKE: Final = "every rank waits alike, and its node or GPU shows faults"


class Culprits:
    """Names a job's culprits against the fleet and its history as they are now."""

    def __init__(
        self,
        nodes: Mapping[str, NodeState],
        history: History | None,
        config: JobsConfig,
        now: float,
        xid_class: Callable[[int], str] | None,
    ) -> None:
        """``now`` is monotonic; ``history`` None: no hardware evidence is told."""
        self._nodes, self._history, self._config = nodes, history, config
        self._now, self._xid_class = now, xid_class

    def name(
        self, job: JobState, liveness: Liveness, stacks: Localisation | None
    ) -> list[dict[str, str]]:
        """Each culprit: its node, its line, its rank, and whether its hardware shows faults."""
        out = []
        for rank, why in self._suspects(job, liveness, stacks):
            held = job.ranks.get(rank)
            if held is None:
                continue
            node = self._nodes.get(held.node)
            gpu = node.gpus.get(held.gpu_uuid) if node is not None else None
            where = f"{held.node} GPU {gpu.index}" if gpu is not None else held.node
            text = f"rank {rank} on {where}: {why}"
            lines: list[str] = []
            if self._history is not None and node is not None:
                window = Window(self._history, self._now - EVIDENCE_S, self._now)
                found = node_evidence(
                    node, _uuids(held.gpu_uuid), window, self._config, xid_class=self._xid_class
                )
                lines = found.lines
                if lines:
                    text += "; hardware: " + "; ".join(lines)
                if found.application:
                    text += "; the application's own errors: " + "; ".join(found.application)
            hardware = "yes" if lines else "no"
            out.append({"node": held.node, "text": text, "rank": str(rank), "hardware": hardware})
        return out

    def _suspects(
        self, job: JobState, liveness: Liveness, stacks: Localisation | None
    ) -> list[tuple[int, str]]:
        """(rank, why), in the order of the module's docstring."""
        silent = [
            (rank, f"its node {held.node} stopped answering (unreachable)")
            for rank, held in sorted(job.ranks.items())
            if (node := self._nodes.get(held.node)) is not None and not node.reachable
        ]
        named = {rank for rank, _ in silent}
        found = [
            (rank, why)
            for rank, why in suspects(job, liveness, stacks, self._config.culprit_window_s)
            if rank not in named and not (silent and _gone(job, rank))
        ]
        if not silent and not found and liveness.state == "hung" and _in_collectives(stacks):
            found = self._faulty(job)
        return silent + found

    def _faulty(self, job: JobState) -> list[tuple[int, str]]:
        """The ranks whose GPU or node shows a fault that stops a collective (at most half)."""
        if self._history is None or not job.steps:
            return []
        last = job.steps[-1]
        lead = max(HANG_LEAD_MIN_S, HANG_LEAD_STEPS * last.step_time_s)
        window = Window(self._history, last.at - lead, self._now)
        faulty = []
        for rank, held in sorted(job.ranks.items()):
            node = self._nodes.get(held.node)
            if node is None or _gone(job, rank):
                continue  # a rank gone before the hang (a restart left it out) holds nothing
            found = node_evidence(
                node, _uuids(held.gpu_uuid), window, self._config, xid_class=self._xid_class
            )
            if found.hard:
                faulty.append((rank, ALIKE))
        return faulty if 2 * len(faulty) <= len(job.ranks) else []


def _gone(job: JobState, rank: int) -> bool:
    """Whether the rank's process ended (beside a silent node's ranks, what their end did)."""
    process = job.processes.get(rank)
    return process is not None and process.state in GONE


def _uuids(gpu_uuid: str) -> set[str]:
    """The GPU to read evidence of (every GPU of the node when the rank named none)."""
    return {gpu_uuid} if gpu_uuid else set()


def _in_collectives(stacks: Localisation | None) -> bool:
    """Whether the ranks wait in collectives, as far as their stacks tell (none read: maybe)."""
    return stacks is None or all(group.collective for group in stacks.groups)
