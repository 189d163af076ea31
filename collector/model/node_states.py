"""A node's state in one word, for dashboards: healthy, degraded, draining, drained, unreachable.

The first that holds wins: ``unreachable`` (the collector gave up on it), ``drained`` (fleetwatch
drained it and has not resumed or released it), ``draining`` (a drain request is running now),
``degraded`` (a firing incident on the node or one of its GPUs or ports, a lost GPU, an NVLink or
IB port down), else ``healthy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collector.model.state import NodeState


@dataclass(frozen=True, slots=True)
class NodeFlags:
    """What the rules and actions know of nodes at one moment."""

    drained: frozenset[str] = frozenset()
    draining: frozenset[str] = frozenset()
    firing: frozenset[str] = frozenset()  # nodes with a firing incident on them or their parts


def node_state(node: NodeState, flags: NodeFlags) -> str:
    """The node's state (see the module docstring for the order)."""
    if not node.reachable:
        return "unreachable"
    if node.name in flags.drained:
        return "drained"
    if node.name in flags.draining:
        return "draining"
    if node.name in flags.firing or _hardware_down(node):
        return "degraded"
    return "healthy"


def _hardware_down(node: NodeState) -> bool:
    # A port whose state has not arrived yet ("") is not down.
    return any(not g.present or g.nvlinks_down for g in node.gpus.values()) or any(
        p.state and not p.up for p in node.ports.values()
    )
