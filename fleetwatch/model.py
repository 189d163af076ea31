"""Domain types both sides share, and their mapping to and from the wire messages.

The wire uses protobuf enums; the journal, the JSON API and the logs use these readable names.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from fleetwatch.wire.v1 import fleetwatch_pb2 as pb


class TargetKind(StrEnum):
    """What a sample or an event is about."""

    NODE = "node"
    GPU = "gpu"
    NVLINK = "nvlink"
    IB_PORT = "ib_port"
    PCI = "pci"


class EventKind(StrEnum):
    """Kinds of event. The last two are raised by the collector, never by an agent."""

    XID = "xid"
    GPU_LOST = "gpu_lost"
    NVLINK_DOWN = "nvlink_down"
    NVLINK_UP = "nvlink_up"
    IB_PORT_DOWN = "ib_port_down"
    IB_PORT_UP = "ib_port_up"
    PCI_REMOVED = "pci_removed"
    NODE_UNREACHABLE = "node_unreachable"
    NODE_REACHABLE = "node_reachable"


_TARGET_TO_PB: Final[dict[TargetKind, pb.TargetKind]] = {
    TargetKind.NODE: pb.TARGET_KIND_NODE,
    TargetKind.GPU: pb.TARGET_KIND_GPU,
    TargetKind.NVLINK: pb.TARGET_KIND_NVLINK,
    TargetKind.IB_PORT: pb.TARGET_KIND_IB_PORT,
    TargetKind.PCI: pb.TARGET_KIND_PCI,
}
_TARGET_FROM_PB: Final = {v: k for k, v in _TARGET_TO_PB.items()}

_EVENT_TO_PB: Final[dict[EventKind, pb.EventKind]] = {
    EventKind.XID: pb.EVENT_KIND_XID,
    EventKind.GPU_LOST: pb.EVENT_KIND_GPU_LOST,
    EventKind.NVLINK_DOWN: pb.EVENT_KIND_NVLINK_DOWN,
    EventKind.NVLINK_UP: pb.EVENT_KIND_NVLINK_UP,
    EventKind.IB_PORT_DOWN: pb.EVENT_KIND_IB_PORT_DOWN,
    EventKind.IB_PORT_UP: pb.EVENT_KIND_IB_PORT_UP,
    EventKind.PCI_REMOVED: pb.EVENT_KIND_PCI_REMOVED,
    EventKind.NODE_UNREACHABLE: pb.EVENT_KIND_NODE_UNREACHABLE,
    EventKind.NODE_REACHABLE: pb.EVENT_KIND_NODE_REACHABLE,
}
_EVENT_FROM_PB: Final = {v: k for k, v in _EVENT_TO_PB.items()}


@dataclass(frozen=True, slots=True)
class Target:
    """A node, a GPU (by UUID), one NVLink of a GPU, an IB port, or a PCI function."""

    kind: TargetKind
    gpu_uuid: str = ""
    index: int = 0
    device: str = ""

    @classmethod
    def node(cls) -> Target:
        """The node as a whole."""
        return cls(TargetKind.NODE)

    @classmethod
    def gpu(cls, uuid: str) -> Target:
        """One GPU."""
        return cls(TargetKind.GPU, gpu_uuid=uuid)

    @classmethod
    def nvlink(cls, uuid: str, link: int) -> Target:
        """One NVLink of one GPU."""
        return cls(TargetKind.NVLINK, gpu_uuid=uuid, index=link)

    @classmethod
    def ib_port(cls, device: str, port: int) -> Target:
        """One InfiniBand port."""
        return cls(TargetKind.IB_PORT, device=device, index=port)

    @classmethod
    def pci(cls, bus_id: str) -> Target:
        """One PCI function, by normalised bus id."""
        return cls(TargetKind.PCI, device=bus_id)

    def label(self) -> str:
        """Short human-readable name, e.g. ``GPU-1234/nvlink3`` or ``mlx5_0/1``."""
        match self.kind:
            case TargetKind.NODE:
                return "node"
            case TargetKind.GPU:
                return self.gpu_uuid
            case TargetKind.NVLINK:
                return f"{self.gpu_uuid}/nvlink{self.index}"
            case TargetKind.IB_PORT:
                return f"{self.device}/{self.index}"
            case TargetKind.PCI:
                return self.device

    def to_pb(self) -> pb.Target:
        """Convert to the wire message."""
        return pb.Target(
            kind=_TARGET_TO_PB[self.kind],
            gpu_uuid=self.gpu_uuid,
            index=self.index,
            device=self.device,
        )

    @classmethod
    def from_pb(cls, msg: pb.Target) -> Target:
        """Convert from a validated wire message."""
        return cls(
            kind=_TARGET_FROM_PB[msg.kind],
            gpu_uuid=msg.gpu_uuid,
            index=msg.index,
            device=msg.device,
        )


def event_kind_to_pb(kind: EventKind) -> pb.EventKind:
    """Map a readable kind to its wire enum."""
    return _EVENT_TO_PB[kind]


def event_kind_from_pb(kind: pb.EventKind) -> EventKind:
    """Map a (validated) wire enum to its readable kind."""
    return _EVENT_FROM_PB[kind]


SampleValue = int | float | str
SampleKey = tuple[Target, str]


def sample_to_pb(target: Target, signal: str, value: SampleValue) -> pb.Sample:
    """Build a wire sample; bool counts as int, like the rest of Python."""
    msg = pb.Sample(target=target.to_pb(), signal=signal)
    if isinstance(value, str):
        msg.text_value = value
    elif isinstance(value, int):
        msg.int_value = value
    else:
        msg.real_value = value
    return msg


def sample_value_from_pb(msg: pb.Sample) -> SampleValue:
    """Read the value of a validated wire sample."""
    which = msg.WhichOneof("value")
    if which == "int_value":
        return msg.int_value
    if which == "real_value":
        return msg.real_value
    return msg.text_value
