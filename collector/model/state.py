"""What the fleet model holds of one node, its GPUs and its InfiniBand ports.

Identity comes from the node's Hello, current values from its reports, counts from journaled
events. :class:`collector.model.fleet.FleetModel` owns them; readers get copies.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from fleetwatch.model import SampleValue


# Distinct Xids counted per GPU (each is a series of fleetwatch_gpu_xid_errors_total): a real
# GPU shows a handful; a node sending thousands of made-up ones must not make thousands of series.
MAX_XIDS_PER_GPU: Final = 16
OTHER_XIDS: Final = 0  # the key the rest count under (no Xid is 0); exported as xid="other"


@dataclass(slots=True)
class GpuState:
    """One GPU: identity from the Hello, state from samples, counts from journaled events."""

    index: int
    uuid: str
    pci_bus_id: str
    model: str
    nvlink_count: int
    present: bool = True
    nvlink_up: dict[int, bool] = field(default_factory=dict)
    pcie_replay_count: int | None = None
    # Xid -> occurrences; past MAX_XIDS_PER_GPU distinct Xids the rest count under OTHER_XIDS
    xid_counts: Counter[int] = field(default_factory=Counter)
    last_xid: int = 0
    signals: dict[str, SampleValue] = field(default_factory=dict)
    link_signals: dict[int, dict[str, SampleValue]] = field(default_factory=dict)
    # Moves whenever a link's state or error counter is set: what is derived from the links
    # (links down, error sums) is computed again only when it moved (the exposition keeps it).
    link_generation: int = 0

    @property
    def nvlinks_down(self) -> int:
        """How many of this GPU's NVLinks are reported down."""
        return sum(1 for up in self.nvlink_up.values() if not up)

    def number(self, signal: str) -> float | None:
        """A numeric signal of the GPU, or None when not reported."""
        value = self.signals.get(signal)
        return None if value is None or isinstance(value, str) else float(value)

    def copy(self) -> GpuState:
        """A copy sharing nothing mutable with this one (values are immutable scalars)."""
        return GpuState(
            self.index,
            self.uuid,
            self.pci_bus_id,
            self.model,
            self.nvlink_count,
            self.present,
            dict(self.nvlink_up),
            self.pcie_replay_count,
            Counter(self.xid_counts),
            self.last_xid,
            dict(self.signals),
            {link: dict(values) for link, values in self.link_signals.items()},
            self.link_generation,
        )

    def link_total(self, signal: str) -> float | None:
        """A per-link numeric signal summed over the GPU's links (None when none reported)."""
        values = [
            v
            for link in self.link_signals.values()
            if (v := link.get(signal)) is not None and not isinstance(v, str)
        ]
        return float(sum(values)) if values else None


@dataclass(slots=True)
class PortState:
    """One InfiniBand port."""

    device: str
    port: int
    rate: str
    link_layer: str
    state: str = ""
    phys_state: str = ""
    link_downed: int | None = None
    down_events: int = 0
    signals: dict[str, SampleValue] = field(default_factory=dict)

    def copy(self) -> PortState:
        """A copy sharing nothing mutable with this one."""
        return PortState(
            self.device,
            self.port,
            self.rate,
            self.link_layer,
            self.state,
            self.phys_state,
            self.link_downed,
            self.down_events,
            dict(self.signals),
        )

    def number(self, signal: str) -> float | None:
        """A numeric signal of the port, or None when not reported."""
        value = self.signals.get(signal)
        return None if value is None or isinstance(value, str) else float(value)

    @property
    def up(self) -> bool:
        """True when the port is ACTIVE."""
        return self.state == "ACTIVE"


@dataclass(slots=True)
class NodeState:
    """One node."""

    name: str
    boot_id: str
    agent_version: str = ""
    driver_version: str = ""
    gpus: dict[str, GpuState] = field(default_factory=dict)
    ports: dict[tuple[str, int], PortState] = field(default_factory=dict)
    connected: bool = False
    reachable: bool = True
    reported: bool = False  # a Report since its Hello (or its restore from the journal)
    last_seen_mono: float = 0.0
    last_seen_unix: float = 0.0
    events: Counter[str] = field(default_factory=Counter)
    signals: dict[str, SampleValue] = field(default_factory=dict)
    other: dict[str, SampleValue] = field(default_factory=dict)
    # Restored from the journal at a collector's start: not judged silent before this
    # (monotonic) time, so that a fleet reconnecting after the restart is not paged as lost.
    grace_until_mono: float = 0.0

    def copy(self) -> NodeState:
        """A copy sharing nothing mutable with this one: what ``copy.deepcopy`` gives, faster.

        Every value held is an immutable scalar (or a tuple key of them), so copying the
        containers is enough; a field added to a state class must be added to its ``copy``
        (a unit test compares the copies with ``copy.deepcopy``).
        """
        return NodeState(
            self.name,
            self.boot_id,
            self.agent_version,
            self.driver_version,
            {uuid: gpu.copy() for uuid, gpu in self.gpus.items()},
            {key: port.copy() for key, port in self.ports.items()},
            self.connected,
            self.reachable,
            self.reported,
            self.last_seen_mono,
            self.last_seen_unix,
            Counter(self.events),
            dict(self.signals),
            dict(self.other),
            self.grace_until_mono,
        )
