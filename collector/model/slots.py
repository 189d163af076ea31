"""Report samples into the fleet model: the collector's hottest loop.

A busy node sends a few dozen changed values a second, 4,096 nodes about 100,000 a second, and
they name the same few hundred targets and signals of each node again and again. So what a
sample's target resolves to (the dictionary its values live in, the rules' key for it) is worked
out once per node and target (:class:`TargetSlot`), and what its signal is (a counter, a value
the model keeps in a field of its own, one the rules watch) once per signal name; a sample then
costs two lookups and a store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from collector.model.target_keys import gpu_key, link_key, node_key, port_key
from fleetwatch.model import SampleValue, Target, TargetKey, TargetKind, target_from_key
from fleetwatch.signals import (
    GPU_PRESENT,
    IB_LINK_DOWNED,
    IB_PHYS_STATE,
    IB_STATE,
    NVLINK_ERROR_COUNTERS,
    NVLINK_UP,
    PCIE_REPLAY_COUNT,
)

if TYPE_CHECKING:
    from collector.model.state import NodeState

# Signals the model keeps in fields of their own (gpu.present, a port's state...): applied by
# the general path, which knows those fields.
MODEL_FIELDS: Final = frozenset(
    {
        GPU_PRESENT,
        NVLINK_UP,
        *NVLINK_ERROR_COUNTERS,  # they move the GPU's link_generation (see _apply_gpu)
        PCIE_REPLAY_COUNT,
        IB_STATE,
        IB_PHYS_STATE,
        IB_LINK_DOWNED,
    },
)
# A node declares a few hundred targets; past this many (made-up PCI addresses, say) a target's
# samples take the general path each time instead of growing the table.
MAX_SLOTS_PER_NODE: Final = 4096


# Where one target's samples go, and what the rules call it: (the target's wire key, the index
# of its own signals in its node's :class:`NodeSlots`, the rules' key (node, node/gpu/3,
# node/gpu/3/nvlink/5, node/ib/mlx5_0/1), and for an NVLink its GPU's key (nvlinks_down follows
# the link) or None). A tuple of strings and numbers only, which the garbage collector stops
# tracking: a collector holds hundreds per node, and every object it tracks lengthens each full
# collection, a pause of the whole event loop (bench/collector_ingest.py).
TargetSlot = tuple[TargetKey, int, str, str | None]
SLOT_KEY: Final = 2
SLOT_ALSO: Final = 3


class NodeSlots:
    """One node's slots by target key, and the signal dictionaries they point into."""

    __slots__ = ("by_key", "values")

    def __init__(self) -> None:
        """None yet: each is made at its target's first sample."""
        self.by_key: dict[TargetKey, TargetSlot] = {}
        # by a slot's index; None for the model's catch-all "other" signals (index 0)
        self.values: list[dict[str, SampleValue] | None] = [None]

    def add(self, node: NodeState, key: TargetKey) -> TargetSlot:
        """Resolve a (validated) target of ``node`` and remember it, within the limit."""
        values, slot = make_slot(node, key, len(self.values))
        if len(self.by_key) < MAX_SLOTS_PER_NODE:
            self.by_key[key] = slot
            if values is not None:
                self.values.append(values)
        elif values is not None:  # not remembered: its values are reached the long way
            return (key, 0, slot[SLOT_KEY], slot[SLOT_ALSO])
        return slot


def rules_key(node: NodeState, target: Target) -> str:
    """The rules' key of a wire target of ``node`` (its node's key if it names nothing known)."""
    kind = target.kind
    if kind in (TargetKind.GPU, TargetKind.NVLINK):
        gpu = node.gpus.get(target.gpu_uuid)
        if gpu is not None:
            if kind == TargetKind.NVLINK:
                return link_key(node.name, gpu.index, target.index)
            return gpu_key(node.name, gpu.index)
    if kind == TargetKind.IB_PORT:
        return port_key(node.name, target.device, target.index)
    return node_key(node.name)


def make_slot(
    node: NodeState, key: TargetKey, index: int
) -> tuple[dict[str, SampleValue] | None, TargetSlot]:
    """A target's own signals (None: "other") and its slot, at ``index`` if it has signals."""
    target = target_from_key(key)
    rules = rules_key(node, target)
    kind = target.kind
    if kind == TargetKind.NODE:
        return node.signals, (key, index, rules, None)
    if kind in (TargetKind.GPU, TargetKind.NVLINK):
        gpu = node.gpus.get(target.gpu_uuid)
        if gpu is not None and kind == TargetKind.GPU:
            return gpu.signals, (key, index, rules, None)
        if gpu is not None:
            values = gpu.link_signals.setdefault(target.index, {})
            return values, (key, index, rules, gpu_key(node.name, gpu.index))
    if kind == TargetKind.IB_PORT:
        port = node.ports.get((target.device, target.index))
        if port is not None:
            return port.signals, (key, index, rules, None)
    return None, (key, 0, rules, None)
