"""Domain types both sides share, and their mapping to and from the wire messages.

The wire uses protobuf enums; the journal, the JSON API and the logs use these readable names.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Final, NamedTuple, cast

from fleetwatch.wire.v1 import fleetwatch_pb2 as pb


class TargetKind:
    """What a sample or an event is about: plain strings, not an Enum.

    Targets are hashed thousands of times a poll, and an Enum member hashes through a Python
    function; a str hashes in C and caches its hash.
    """

    NODE: Final = "node"
    GPU: Final = "gpu"
    NVLINK: Final = "nvlink"
    IB_PORT: Final = "ib_port"
    PCI: Final = "pci"
    ALL: Final = frozenset({NODE, GPU, NVLINK, IB_PORT, PCI})


class EventKind(StrEnum):
    """Kinds of event. The last two are raised by the collector, never by an agent."""

    XID = "xid"
    GPU_LOST = "gpu_lost"
    NVLINK_DOWN = "nvlink_down"
    NVLINK_UP = "nvlink_up"
    IB_PORT_DOWN = "ib_port_down"
    IB_PORT_UP = "ib_port_up"
    PCI_REMOVED = "pci_removed"
    PCIE_AER = "pcie_aer"
    PCI_RECOVERY = "pci_recovery"
    IB_DEVICE_ADDED = "ib_device_added"
    IB_DEVICE_REMOVED = "ib_device_removed"
    # The kernel's other hardware lines, and links that trained below their rate.
    MACHINE_CHECK = "machine_check"
    MACHINE_CHECK_UNCORRECTED = "machine_check_uncorrected"
    FS_ERROR = "fs_error"
    FS_READ_ONLY = "fs_read_only"
    SXID = "sxid"
    SXID_FATAL = "sxid_fatal"
    PCIE_AER_UNRECOVERED = "pcie_aer_unrecovered"
    IB_RATE_LOW = "ib_rate_low"
    ROCE_GID_MISSING = "roce_gid_missing"
    PCIE_LINK_DEGRADED = "pcie_link_degraded"
    # The node's BMC: the component (fan, power supply, sensor) is the target's device.
    FAN_FAILED = "fan_failed"
    FAN_RECOVERED = "fan_recovered"
    PSU_FAILED = "psu_failed"
    PSU_RECOVERED = "psu_recovered"
    PSU_REDUNDANCY_LOST = "psu_redundancy_lost"
    PSU_REDUNDANCY_RESTORED = "psu_redundancy_restored"
    TEMPERATURE_CRITICAL = "temperature_critical"
    TEMPERATURE_NORMAL = "temperature_normal"
    BMC_SEL_ENTRY = "bmc_sel_entry"
    BMC_SEL_CRITICAL = "bmc_sel_critical"
    NODE_UNREACHABLE = "node_unreachable"
    NODE_REACHABLE = "node_reachable"


_TARGET_TO_PB: Final[dict[str, pb.TargetKind]] = {
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
    EventKind.PCIE_AER: pb.EVENT_KIND_PCIE_AER,
    EventKind.PCI_RECOVERY: pb.EVENT_KIND_PCI_RECOVERY,
    EventKind.IB_DEVICE_ADDED: pb.EVENT_KIND_IB_DEVICE_ADDED,
    EventKind.IB_DEVICE_REMOVED: pb.EVENT_KIND_IB_DEVICE_REMOVED,
    EventKind.MACHINE_CHECK: pb.EVENT_KIND_MACHINE_CHECK,
    EventKind.MACHINE_CHECK_UNCORRECTED: pb.EVENT_KIND_MACHINE_CHECK_UNCORRECTED,
    EventKind.FS_ERROR: pb.EVENT_KIND_FS_ERROR,
    EventKind.FS_READ_ONLY: pb.EVENT_KIND_FS_READ_ONLY,
    EventKind.SXID: pb.EVENT_KIND_SXID,
    EventKind.SXID_FATAL: pb.EVENT_KIND_SXID_FATAL,
    EventKind.PCIE_AER_UNRECOVERED: pb.EVENT_KIND_PCIE_AER_UNRECOVERED,
    EventKind.IB_RATE_LOW: pb.EVENT_KIND_IB_RATE_LOW,
    EventKind.ROCE_GID_MISSING: pb.EVENT_KIND_ROCE_GID_MISSING,
    EventKind.PCIE_LINK_DEGRADED: pb.EVENT_KIND_PCIE_LINK_DEGRADED,
    EventKind.FAN_FAILED: pb.EVENT_KIND_FAN_FAILED,
    EventKind.FAN_RECOVERED: pb.EVENT_KIND_FAN_RECOVERED,
    EventKind.PSU_FAILED: pb.EVENT_KIND_PSU_FAILED,
    EventKind.PSU_RECOVERED: pb.EVENT_KIND_PSU_RECOVERED,
    EventKind.PSU_REDUNDANCY_LOST: pb.EVENT_KIND_PSU_REDUNDANCY_LOST,
    EventKind.PSU_REDUNDANCY_RESTORED: pb.EVENT_KIND_PSU_REDUNDANCY_RESTORED,
    EventKind.TEMPERATURE_CRITICAL: pb.EVENT_KIND_TEMPERATURE_CRITICAL,
    EventKind.TEMPERATURE_NORMAL: pb.EVENT_KIND_TEMPERATURE_NORMAL,
    EventKind.BMC_SEL_ENTRY: pb.EVENT_KIND_BMC_SEL_ENTRY,
    EventKind.BMC_SEL_CRITICAL: pb.EVENT_KIND_BMC_SEL_CRITICAL,
    EventKind.NODE_UNREACHABLE: pb.EVENT_KIND_NODE_UNREACHABLE,
    EventKind.NODE_REACHABLE: pb.EVENT_KIND_NODE_REACHABLE,
}
_EVENT_FROM_PB: Final = {v: k for k, v in _EVENT_TO_PB.items()}
_tuple_new: Final = tuple.__new__


class Target(NamedTuple):
    """A node, a GPU (by UUID), one NVLink of a GPU, an IB port, or a PCI function.

    A NamedTuple rather than a dataclass: targets are dictionary keys on the agent's hot path
    (thousands of samples a poll), and tuple hashing runs in C.
    """

    kind: str  # one of TargetKind
    gpu_uuid: str = ""
    index: int = 0  # type: ignore[assignment]  # shadows tuple.index, which nothing here uses
    device: str = ""

    @classmethod
    def node(cls) -> Target:
        """The node as a whole."""
        return cls(TargetKind.NODE)

    @classmethod
    def node_device(cls, device: str) -> Target:
        """The node, naming one of its devices (e.g. an HCA that came or went)."""
        return cls(TargetKind.NODE, device=device)

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
                return self.device or "node"
            case TargetKind.GPU:
                return self.gpu_uuid
            case TargetKind.NVLINK:
                return f"{self.gpu_uuid}/nvlink{self.index}"
            case TargetKind.IB_PORT:
                return f"{self.device}/{self.index}"
            case _:
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
        """Convert from a validated wire message.

        Built with ``tuple.__new__`` (what the generated ``__new__`` calls, minus a Python
        frame and keyword handling): the collector converts every sample's target.
        """
        return _tuple_new(cls, (_TARGET_FROM_PB[msg.kind], msg.gpu_uuid, msg.index, msg.device))


# A wire target as the collector keys a stream's samples: (kind, gpu_uuid, index, device), the
# kind as its wire number. Read from a message in four field reads, no object built.
TargetKey = tuple[int, str, int, str]


def target_key_of(msg: pb.Target) -> TargetKey:
    """The key of a wire target."""
    return (msg.kind, msg.gpu_uuid, msg.index, msg.device)


def target_from_key(key: TargetKey) -> Target:
    """The target a (validated) key names."""
    kind, uuid, index, device = key
    wire_kind = cast("pb.TargetKind", kind)
    return _tuple_new(Target, (_TARGET_FROM_PB[wire_kind], uuid, index, device))


def event_kind_to_pb(kind: EventKind) -> pb.EventKind:
    """Map a readable kind to its wire enum."""
    return _EVENT_TO_PB[kind]


def event_kind_from_pb(kind: pb.EventKind) -> EventKind:
    """Map a (validated) wire enum to its readable kind."""
    return _EVENT_FROM_PB[kind]


SampleValue = int | float | str
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_FLOAT_MAX_INT: Final = int(sys.float_info.max)
SampleKey = tuple[Target, str]


def wire_value(value: SampleValue) -> int | float | str:
    """A sample's value as it goes on the wire; bool counts as int, like the rest of Python.

    An int beyond int64 (a 64-bit counter near its top, times 4 for IB data counters) goes as
    a real value rather than fail the whole report.
    """
    if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
        return float(max(-_FLOAT_MAX_INT, min(value, _FLOAT_MAX_INT)))
    return value


def sample_to_pb(target: Target, signal: str, value: SampleValue) -> pb.Sample:
    """Build a wire sample (the value as :func:`wire_value` puts it)."""
    msg = pb.Sample(target=target.to_pb(), signal=signal)
    value = wire_value(value)
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


# What the kernel writes in an IB port's sysfs ``state`` and ``phys_state`` (after the number:
# ``4: ACTIVE``); drivers/infiniband/core/sysfs.c. Anything else a node sends is ``unknown``:
# each new string would be a new label value, a new series.
IB_PORT_STATES: Final = frozenset({"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"})
IB_PHYS_STATES: Final = frozenset(
    {
        "Sleep",
        "Polling",
        "Disabled",
        "PortConfigurationTraining",
        "LinkUp",
        "LinkErrorRecovery",
        "Phy Test",
        "<unknown>",
    }
)
UNKNOWN_STATE: Final = "unknown"


def known_ib_state(value: object, known: frozenset[str]) -> str:
    """``value`` if it is one of the kernel's ``known`` names, or "" (not read); else unknown."""
    if isinstance(value, str) and (not value or value in known):
        return value
    return UNKNOWN_STATE
