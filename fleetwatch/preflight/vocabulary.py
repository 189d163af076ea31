"""What a pre-flight run is made of: levels, checks, measurements and verdicts.

The collector plans a run (which checks, on which nodes and node pairs), the agents carry the
checks out and answer with measurements, and the collector judges each against its
gate (``rules/preflight_gates.yaml``). Both sides, the journal, the API and the CLI use the names
defined here; ``docs/preflight.md`` describes each check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class Level(StrEnum):
    """How deep a run goes; each level includes the ones before it."""

    QUICK = "quick"  # seconds: inventory and consistency, from what the agent reads anyway
    STANDARD = "standard"  # minutes: per-node bandwidths and a single-node all-reduce
    FULL = "full"  # inter-node: ib_write_bw per rail, multi-node all-reduce, scaling ladder


class Verdict(StrEnum):
    """A check's (or a node's, or a run's) outcome. Ordered from best to worst by :data:`RANK`."""

    PASS = "pass"  # noqa: S105 - a verdict, not a password
    WARN = "warn"  # within the gate but an outlier against the fleet, or under a warn bar
    FAIL = "fail"
    COULD_NOT_RUN = "could_not_run"  # a tool missing or crashed, a node that never answered


# Worst wins when verdicts are combined; a run with any check that could not run is never a pass.
RANK: Final[dict[Verdict, int]] = {
    Verdict.PASS: 0,
    Verdict.WARN: 1,
    Verdict.FAIL: 2,
    Verdict.COULD_NOT_RUN: 3,
}


def worst(verdicts: list[Verdict]) -> Verdict:
    """The worst of ``verdicts``; an empty list could not run (nothing was checked)."""
    if not verdicts:
        return Verdict.COULD_NOT_RUN
    return max(verdicts, key=RANK.__getitem__)


class Check(StrEnum):
    """Every check a run may hold. The comment says the unit and what ``component`` names."""

    # quick: one node, from NVML and sysfs
    GPU_COUNT = "gpu_count"  # count; component "node"
    GPU_MODEL = "gpu_model"  # text; "gpu:<index>"
    NVLINK_UP = "nvlink_up"  # links up (count); "gpu:<index>"
    GPU_PCIE_LINK = "gpu_pcie_link"  # width x gen as text "gen5 x16 (max gen5 x16)"; "gpu:<i>"
    NIC_PCIE_LINK = "nic_pcie_link"  # same; "nic:<hca>"
    IB_PORT = "ib_port"  # Gb/s at which the port is Active (0: not Active); "ib:<hca>/<port>"
    ECC_MODE = "ecc_mode"  # 1 on, 0 off; "gpu:<index>"
    ROW_REMAP = "row_remap"  # pending + failed remaps (count); "gpu:<index>"
    COMPUTE_PROCESSES = "compute_processes"  # count; "gpu:<index>"
    PERSISTENCE_MODE = "persistence_mode"  # 1 on, 0 off; "gpu:<index>"
    DRIVER_VERSION = "driver_version"  # text; "node"
    CUDA_VERSION = "cuda_version"  # text; "node"
    VBIOS_VERSION = "vbios_version"  # text; "gpu:<index>"
    NIC_FIRMWARE = "nic_firmware"  # text; "nic:<hca>"
    # standard: one node, measured
    P2P_BW = "p2p_bw"  # GB/s, one direction, copy engine read; "gpu:<i>-gpu:<j>" (ordered)
    P2P_BIDIR_BW = "p2p_bidir_bw"  # GB/s, both directions at once; "gpu:<i>-gpu:<j>" (i < j)
    H2D_BW = "h2d_bw"  # GB/s host to device; "gpu:<index>"
    D2H_BW = "d2h_bw"  # GB/s device to host; "gpu:<index>"
    ALLREDUCE_NODE = "allreduce_node"  # bus bandwidth GB/s (nccl-tests' busbw); "node"
    # full: across nodes, measured
    IB_WRITE_BW = "ib_write_bw"  # Gb/s; "rail:<hca>/<port>:<server node>-<client node>"
    ALLREDUCE_MULTI = "allreduce_multi"  # bus bandwidth GB/s; "nodes:<n>" on each member node
    LADDER_THROUGHPUT = "ladder_throughput"  # samples/s of one small training step; "nodes:<n>"
    LADDER_EFFICIENCY = "ladder_efficiency"  # throughput(n) / (n/m * throughput(m)); "nodes:<n>"
    GPU_UTILISATION = "gpu_utilisation"  # percent the agents sampled while the ladder ran


_QUICK: Final = (
    Check.GPU_COUNT,
    Check.GPU_MODEL,
    Check.NVLINK_UP,
    Check.GPU_PCIE_LINK,
    Check.NIC_PCIE_LINK,
    Check.IB_PORT,
    Check.ECC_MODE,
    Check.ROW_REMAP,
    Check.COMPUTE_PROCESSES,
    Check.PERSISTENCE_MODE,
    Check.DRIVER_VERSION,
    Check.CUDA_VERSION,
    Check.VBIOS_VERSION,
    Check.NIC_FIRMWARE,
)
_STANDARD: Final = (
    Check.P2P_BW,
    Check.P2P_BIDIR_BW,
    Check.H2D_BW,
    Check.D2H_BW,
    Check.ALLREDUCE_NODE,
)
_FULL: Final = (
    Check.IB_WRITE_BW,
    Check.ALLREDUCE_MULTI,
    Check.LADDER_THROUGHPUT,
    Check.LADDER_EFFICIENCY,
    Check.GPU_UTILISATION,
)
LEVEL_OF: Final[dict[Check, Level]] = {
    **dict.fromkeys(_QUICK, Level.QUICK),
    **dict.fromkeys(_STANDARD, Level.STANDARD),
    **dict.fromkeys(_FULL, Level.FULL),
}


@dataclass(frozen=True, slots=True)
class Measurement:
    """One value a check produced on one node, about one component of it.

    ``value`` is the number the gate judges (``None`` when the check could not run, and then
    ``error`` says why); ``text`` is for the checks whose result is a string (versions, models).
    ``evidence`` keeps a short excerpt of what the tool printed, for the journal and ``show``.
    """

    check: Check
    component: str
    value: float | None
    unit: str
    text: str = ""
    error: str = ""
    evidence: str = ""

    @property
    def ran(self) -> bool:
        """Whether the check produced a result at all (a number, or a text)."""
        return not self.error and (self.value is not None or bool(self.text))


# Exit status of `fleetwatch preflight run|show`, as a Slurm prolog / NHC / Nagios check reads it.
EXIT_PASS: Final = 0
EXIT_FAIL: Final = 1
EXIT_COULD_NOT_RUN: Final = 2


_RATE: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def parse_rate_gbps(text: str) -> float | None:
    """An IB port's sysfs ``rate`` (``400 Gb/sec (4X NDR)``) in Gb/s; None when it names none."""
    match = _RATE.match(text)
    return float(match.group(1)) if match else None


def rail_component(device: str, port: int, node: str, peer: str, *, server: bool) -> str:
    """``rail:<hca>/<port>:<server node>-<client node>``: one ``ib_write_bw`` test.

    Both ends name it so: ``node`` is the end naming it, the server when ``server``.
    """
    first, second = (node, peer) if server else (peer, node)
    return f"rail:{device}/{port}:{first}-{second}"
