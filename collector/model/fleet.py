"""The fleet model: what the collector knows now about every node, GPU, NVLink and IB port.

Written by stream sessions and the liveness monitor on the event loop; read by the HTTP thread
(``/metrics`` and the JSON API) through :meth:`FleetModel.snapshot`, which copies under a lock.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from typing import TYPE_CHECKING, Protocol, TypeVar

from collector.model.slots import MODEL_FIELDS, NodeSlots, TargetSlot
from collector.model.state import MAX_XIDS_PER_GPU, OTHER_XIDS, GpuState, NodeState, PortState
from fleetwatch.model import (
    IB_PHYS_STATES,
    IB_PORT_STATES,
    EventKind,
    SampleValue,
    Target,
    TargetKey,
    TargetKind,
    known_ib_state,
    target_from_key,
)
from fleetwatch.signals import (
    GPU_PRESENT,
    IB_LINK_DOWNED,
    IB_PHYS_STATE,
    IB_STATE,
    NVLINK_UP,
    PCIE_REPLAY_COUNT,
)
from fleetwatch.wire.grouped import keyed_sample, keyed_samples
from fleetwatch.wire.plausible import is_counter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

T = TypeVar("T")

# (target key, signal, value): a sample as the wire screen hands it on.
KeyedSample = tuple[TargetKey, str, SampleValue]
# More signal names than this (an agent making them up) and the table of what each is starts over.
MAX_SIGNAL_TRAITS = 4096

# Signals this collector does not model yet are kept as-is for the JSON API, up to this many per
# node, so a misbehaving agent cannot grow the model without bound.
MAX_OTHER_SIGNALS = 10_000
MAX_SIGNALS_PER_TARGET = 256


class FleetObserver(Protocol):
    """Told of every change, to decide what to look at again (the rules evaluator)."""

    def note_event(self, node: str, kind: EventKind, target: Target, xid: int) -> None:
        """A new event was applied."""
        ...

    def note_samples(self, node: str, noted: list[tuple[TargetSlot, str, SampleValue]]) -> None:
        """Samples of signals it :meth:`wants` were applied (the fast path's way to say it)."""
        ...

    def wants(self, signal: str) -> bool:
        """Whether samples of ``signal`` can matter to it (asked once per signal name)."""
        ...

    def note_node(self, node: str) -> None:
        """The node's reachability changed."""
        ...

    def note_inventory(self, node: str) -> None:
        """The node's state was made anew (a Hello): everything about it may read otherwise."""
        ...


class FleetModel:
    """Nodes by name. Every method is safe to call from any thread."""

    def __init__(self) -> None:
        """Start with no nodes and no observer."""
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeState] = {}
        self._observer: FleetObserver | None = None
        # Per node, where each target's samples go; per signal name, what it is (see
        # collector.model.slots). A node's slots are made again with its state, at its Hello.
        self._slots: dict[str, NodeSlots] = {}
        self._traits: dict[str, tuple[bool, bool, bool]] = {}
        # For the exposition's cache (collector.export.exposition): per node, the tick of its
        # last change of any kind (samples, a message's time) and of its last change that must
        # show at once (identity, events, reachability, its stream).
        self._ticks = itertools.count(1)
        self._changed: dict[str, int] = {}
        self._urgent: dict[str, int] = {}
        self._membership = 0  # grows when a node comes or goes
        # Told (node, old boot id, new boot id) when a known node says Hello from a new boot
        # (it was rebooted: re-qualification starts there), after the lock is let go.
        self.rebooted: list[Callable[[str, str, str], None]] = []

    @property
    def observer(self) -> FleetObserver | None:
        """Who is told of changes (the rules' evaluator; a rule reload brings a new one)."""
        return self._observer

    @observer.setter
    def observer(self, observer: FleetObserver | None) -> None:
        self._observer = observer
        self._traits = {}  # what the new one wants is asked again

    def snapshot(self) -> dict[str, NodeState]:
        """Return a deep copy of every node, for readers on other threads.

        Every scrape and API read takes one, under the lock the sessions write under: it is
        built by the state classes' ``copy`` (about a sixth of what ``copy.deepcopy`` costs).
        """
        with self._lock:
            return {name: node.copy() for name, node in self._nodes.items()}

    def view(self) -> dict[str, NodeState]:
        """The live nodes, uncopied: only for code on the event loop, which is the only writer."""
        return self._nodes

    def connected(self) -> int:
        """How many nodes have a stream open now (on the event loop; a walk of the nodes)."""
        return sum(1 for node in self._nodes.values() if node.connected)

    def read_node(self, name: str, read: Callable[[NodeState, int, int], T]) -> T | None:
        """``read(node, changed, urgent)`` under the lock, or None for an unknown node.

        ``changed`` and ``urgent`` are the ticks of the node's last change and last change that
        must show at once (both grow). ``read`` must not keep the node: it is the live one.
        """
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                return None
            return read(node, self._changed.get(name, 0), self._urgent.get(name, 0))

    @property
    def membership(self) -> int:
        """A number that grows whenever a node is added to the model or leaves it."""
        return self._membership

    def _urgent_change(self, name: str) -> None:
        """Note a change that must show at once (call with the lock held)."""
        tick = next(self._ticks)
        self._changed[name] = self._urgent[name] = tick

    def node_names(self) -> list[str]:
        """Return the names of every known node."""
        with self._lock:
            return sorted(self._nodes)

    def on_hello(self, hello: pb.Hello, mono: float, unix: float) -> bool:
        """Take a node's (validated) Hello; return True if the node was unreachable before."""
        with self._lock:
            old = self._nodes.get(hello.node)
            node = NodeState(
                name=hello.node,
                boot_id=hello.boot_id,
                agent_version=hello.agent_version,
                driver_version=hello.driver_version,
                connected=True,
                reachable=True,
                last_seen_mono=mono,
                last_seen_unix=unix,
                events=old.events if old else Counter(),
                # A restart's grace outlives the Hello: a node back in a storm can go unread
                # for longer than the silence limit while the collector takes the fleet's first
                # Reports, and that silence is the collector's, not the node's.
                grace_until_mono=old.grace_until_mono if old else 0.0,
            )
            for g in hello.gpus:
                gpu = GpuState(g.index, g.uuid, g.pci_bus_id, g.model, g.nvlink_count)
                if old and g.uuid in old.gpus:
                    gpu.xid_counts = old.gpus[g.uuid].xid_counts
                    gpu.last_xid = old.gpus[g.uuid].last_xid
                node.gpus[g.uuid] = gpu
            for p in hello.ib_ports:
                port = PortState(p.device, p.port, p.rate, p.link_layer)
                if old and (p.device, p.port) in old.ports:
                    port.down_events = old.ports[p.device, p.port].down_events
                node.ports[p.device, p.port] = port
            self._nodes[hello.node] = node
            self._slots[hello.node] = NodeSlots()
            self._urgent_change(hello.node)
            if old is None:
                self._membership += 1
        if self.observer is not None:
            self.observer.note_inventory(hello.node)
        if old is not None and old.boot_id and old.boot_id != hello.boot_id:
            for told in self.rebooted:
                told(hello.node, old.boot_id, hello.boot_id)
        return old is not None and not old.reachable

    def restore(
        self, hello: pb.Hello, *, reachable: bool, mono: float, unix: float, grace_s: float = 0.0
    ) -> None:
        """Re-create a node remembered from the journal, not connected until it says Hello.

        It is not judged silent for ``grace_s`` from ``mono``: its agent is still backing off
        from the collector's absence (``collector.restart_grace``).
        """
        self.on_hello(hello, mono, unix)
        with self._lock:
            node = self._nodes[hello.node]
            node.connected = False
            node.reachable = reachable
            node.grace_until_mono = mono + grace_s
            self._urgent_change(hello.node)

    def touch(self, name: str, mono: float, unix: float) -> bool:
        """Note a message from ``name``; return True if it was unreachable until now."""
        with self._lock:
            node = self._nodes[name]
            node.last_seen_mono, node.last_seen_unix = mono, unix
            was_unreachable = not node.reachable
            node.reachable = True
            if was_unreachable:
                self._urgent_change(name)
            else:
                self._changed[name] = next(self._ticks)
        if was_unreachable and self.observer is not None:
            self.observer.note_node(name)
        return was_unreachable

    def on_disconnect(self, name: str) -> None:
        """The node's stream ended."""
        with self._lock:
            if name in self._nodes:
                self._nodes[name].connected = False
                self._urgent_change(name)

    def overdue(self, now_mono: float, silence_s: float) -> list[str]:
        """Names of reachable nodes silent for longer than ``silence_s`` (and out of grace)."""
        with self._lock:
            return [
                n.name
                for n in self._nodes.values()
                if n.reachable
                and now_mono - n.last_seen_mono > silence_s
                and now_mono >= n.grace_until_mono
            ]

    def mark_unreachable(self, name: str) -> float:
        """Mark a node unreachable; return its last-seen wall time."""
        with self._lock:
            node = self._nodes[name]
            node.reachable = False
            self._urgent_change(name)
        if self.observer is not None:
            self.observer.note_node(name)
        return node.last_seen_unix

    def forget(self, name: str) -> bool:
        """Drop a node another collector has taken over; False when it was not here."""
        with self._lock:
            gone = self._nodes.pop(name, None) is not None
            self._slots.pop(name, None)
            self._changed.pop(name, None)
            self._urgent.pop(name, None)
            self._membership += gone
        if gone and self.observer is not None:
            self.observer.note_node(name)
        return gone

    def apply_report(self, name: str, report: pb.Report) -> int:
        """Apply a (validated) Report's samples, both forms; return how many counters went down."""
        return self.apply_keyed(name, list(keyed_samples(report)))

    def apply_samples(self, name: str, samples: Iterable[pb.Sample]) -> int:
        """Apply (validated) wire samples; return how many counters went down."""
        return self.apply_keyed(name, [keyed_sample(s) for s in samples])

    def apply_keyed(self, name: str, samples: Iterable[KeyedSample]) -> int:
        """Apply (validated) samples; return how many counters went down.

        A counter lower than its previous value is taken as it is: a driver reload or an HCA
        reset starts counting again, and the rules' ``increase()`` counts from the new value.
        The observer hears, once per call, of the samples of the signals it wants.
        """
        noted: list[tuple[TargetSlot, str, SampleValue]] = []
        resets = 0
        with self._lock:
            node = self._nodes[name]
            node.reported = True
            slots = self._slots[name]
            by_key, all_values = slots.by_key, slots.values
            traits = self._traits
            self._changed[name] = next(self._ticks)
            # A grouped Report's samples of one target come in a run under one key object:
            # its slot and target are resolved once for the run.
            last_key: TargetKey | None = None
            target: Target | None = None
            for key, signal, value in samples:
                if key is not last_key:
                    last_key, target = key, None
                    slot = by_key.get(key) or slots.add(node, key)
                    values = all_values[slot[1]]
                trait = traits.get(signal) or self._trait(signal)
                if values is None or trait[1]:
                    if target is None:
                        target = target_from_key(key)
                    resets += _apply_value(node, target, signal, value)
                else:
                    old = values.get(signal)
                    if old is not None:
                        values[signal] = value
                        if (
                            trait[0]
                            and not isinstance(value, str)
                            and not isinstance(old, str)
                            and value < old
                        ):
                            resets += 1
                    elif len(values) < MAX_SIGNALS_PER_TARGET:
                        values[signal] = value
                if trait[2]:
                    noted.append((slot, signal, value))
        if noted and self._observer is not None:
            self._observer.note_samples(name, noted)
        return resets

    def _trait(self, signal: str) -> tuple[bool, bool, bool]:
        """(a counter, kept in a model field, wanted by the observer) of a signal name."""
        if len(self._traits) >= MAX_SIGNAL_TRAITS:
            self._traits = {}
        observer = self._observer
        trait = (
            is_counter(signal),
            signal in MODEL_FIELDS,
            observer is not None and observer.wants(signal),
        )
        self._traits[signal] = trait
        return trait

    def apply_event(
        self,
        name: str,
        kind: EventKind,
        target: Target,
        xid: int,
        count: int = 1,
    ) -> None:
        """Count a newly journaled event against its node and target.

        ``count``: the occurrences the event stands for (more than 1 for a coalesced storm, see
        :mod:`fleetwatch.wire.repeats`); the rules' observer is told once.
        """
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                return
            node.events[kind.value] += count
            self._urgent_change(name)
            gpu = node.gpus.get(target.gpu_uuid)
            if gpu is not None and kind in (EventKind.XID, EventKind.GPU_LOST) and xid:
                counts = gpu.xid_counts
                known = xid in counts or len(counts) - (OTHER_XIDS in counts) < MAX_XIDS_PER_GPU
                counts[xid if known else OTHER_XIDS] += count
                gpu.last_xid = xid
            if gpu is not None and kind in (EventKind.GPU_LOST, EventKind.PCI_REMOVED):
                gpu.present = False
            port = node.ports.get((target.device, target.index))
            if port is not None and kind == EventKind.IB_PORT_DOWN:
                port.down_events += count
        if self.observer is not None:
            self.observer.note_event(name, kind, target, xid)


def _bounded_set(
    values: dict[str, SampleValue],
    key: str,
    value: SampleValue,
    *,
    signal: str = "",
    limit: int = MAX_SIGNALS_PER_TARGET,
) -> int:
    """Set ``key`` (within ``limit`` keys); return 1 when a counter went down, else 0."""
    old = values.get(key)
    if old is not None or len(values) < limit:
        values[key] = value
    if old is None or isinstance(old, str) or isinstance(value, str) or value >= old:
        return 0
    return int(is_counter(signal or key))


def _apply_gpu(gpu: GpuState, target: Target, signal: str, value: SampleValue) -> int:
    if target.kind == TargetKind.NVLINK:
        gpu.link_generation += 1
        if signal == NVLINK_UP:
            gpu.nvlink_up[target.index] = bool(value)
        return _bounded_set(gpu.link_signals.setdefault(target.index, {}), signal, value)
    if signal == GPU_PRESENT:
        gpu.present = bool(value)
    elif signal == PCIE_REPLAY_COUNT:
        gpu.pcie_replay_count = int(value)
    return _bounded_set(gpu.signals, signal, value)


def _apply_value(node: NodeState, target: Target, signal: str, value: SampleValue) -> int:
    """Apply one sample's value; return 1 when it was a counter that went down, else 0."""
    kind = target.kind
    gpu = node.gpus.get(target.gpu_uuid) if kind in (TargetKind.GPU, TargetKind.NVLINK) else None
    port = node.ports.get((target.device, target.index)) if kind == TargetKind.IB_PORT else None
    if kind == TargetKind.NODE:
        return _bounded_set(node.signals, signal, value)
    if gpu is not None:
        return _apply_gpu(gpu, target, signal, value)
    if port is not None:
        if signal == IB_STATE:
            value = port.state = known_ib_state(value, IB_PORT_STATES)
        elif signal == IB_PHYS_STATE:
            value = port.phys_state = known_ib_state(value, IB_PHYS_STATES)
        elif signal == IB_LINK_DOWNED:
            port.link_downed = int(value)
        return _bounded_set(port.signals, signal, value)
    key = f"{target.label()}:{signal}"
    return _bounded_set(node.other, key, value, signal=signal, limit=MAX_OTHER_SIGNALS)
