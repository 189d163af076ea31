"""Fault timelines for simulated clusters (the demo, tests and benchmarks play the same ones)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agent.sim.hardware import SimNode


class FaultKind(StrEnum):
    """What can go wrong on a simulated node."""

    XID = "xid"
    PCI_REMOVE = "pci_remove"
    NVLINK_DOWN = "nvlink_down"
    NVLINK_UP = "nvlink_up"
    PCIE_REPLAYS = "pcie_replays"
    IB_PORT_DOWN = "ib_port_down"
    IB_PORT_UP = "ib_port_up"
    NODE_CRASH = "node_crash"


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault at ``at_s`` seconds into the scenario."""

    at_s: float
    node: str
    kind: FaultKind
    gpu: int = 0
    link: int = 0
    port: int = 0
    xid: int = 0
    count: int = 0

    def describe(self) -> str:
        """One line for people."""
        match self.kind:
            case FaultKind.XID:
                return f"{self.node}: Xid {self.xid} on GPU {self.gpu}"
            case FaultKind.PCI_REMOVE:
                return f"{self.node}: GPU {self.gpu} removed from the PCI bus"
            case FaultKind.NVLINK_DOWN | FaultKind.NVLINK_UP:
                state = "down" if self.kind == FaultKind.NVLINK_DOWN else "up"
                return f"{self.node}: NVLink {self.link} of GPU {self.gpu} {state}"
            case FaultKind.PCIE_REPLAYS:
                return f"{self.node}: {self.count} PCIe replays on GPU {self.gpu}"
            case FaultKind.IB_PORT_DOWN | FaultKind.IB_PORT_UP:
                state = "down" if self.kind == FaultKind.IB_PORT_DOWN else "up"
                return f"{self.node}: IB port mlx5_{self.port}/1 {state}"
            case FaultKind.NODE_CRASH:
                return f"{self.node}: node crashes (agent silent)"


def apply_fault(fault: Fault, node: SimNode) -> None:
    """Make ``fault`` happen on ``node`` (a crash is the caller's to stage: it stops the agent)."""
    match fault.kind:
        case FaultKind.XID:
            node.xid(fault.gpu, fault.xid)
        case FaultKind.PCI_REMOVE:
            node.pci_remove(fault.gpu)
        case FaultKind.NVLINK_DOWN:
            node.nvlink_down(fault.gpu, fault.link)
        case FaultKind.NVLINK_UP:
            node.nvlink_up(fault.gpu, fault.link)
        case FaultKind.PCIE_REPLAYS:
            node.pcie_replays(fault.gpu, fault.count)
        case FaultKind.IB_PORT_DOWN:
            node.ib_port_down(fault.port)
        case FaultKind.IB_PORT_UP:
            node.ib_port_up(fault.port)
        case FaultKind.NODE_CRASH:
            pass


def demo_scenario(nodes: Sequence[str], duration_s: float) -> list[Fault]:
    """The demo's faults, spread over ``duration_s`` and over the nodes there are."""

    def at(share: float) -> float:
        return round(duration_s * share, 1)

    def pick(i: int) -> str:
        return nodes[i % len(nodes)]

    faults = [
        Fault(at(0.12), pick(0), FaultKind.XID, gpu=3, xid=79),
        Fault(at(0.20), pick(1), FaultKind.NVLINK_DOWN, gpu=5, link=7),
        Fault(at(0.25), pick(1), FaultKind.PCIE_REPLAYS, gpu=5, count=48),
        Fault(at(0.30), pick(2), FaultKind.IB_PORT_DOWN, port=2),
        Fault(at(0.36), pick(2), FaultKind.IB_PORT_UP, port=2),
        Fault(at(0.42), pick(2), FaultKind.IB_PORT_DOWN, port=2),
        Fault(at(0.48), pick(2), FaultKind.IB_PORT_UP, port=2),
        Fault(at(0.52), pick(1), FaultKind.XID, gpu=0, xid=13),
    ]
    if len(nodes) >= 4:  # noqa: PLR2004 - keep at least three healthy-ish nodes talking
        faults.append(Fault(at(0.60), nodes[-1], FaultKind.NODE_CRASH))
    return faults
