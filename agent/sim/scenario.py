"""Fault timelines for simulated clusters: a YAML file format, its loader, and how faults apply.

The demo, the tests and the benchmarks play the same files. The format is documented in
``docs/scenarios.md``; ``builtin/demo.yaml`` next to this module is the demo's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

import yaml

from agent.sim import host_faults
from agent.sim.bmc import FANS as SIM_FANS
from agent.sim.bmc import PSUS as SIM_PSUS
from fleetwatch.config_file import read_data_file, short_repr

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from agent.sim.hardware import SimNode


# A simulated cluster this big, or a flap this long, is a typo, not a scenario; both would be
# expanded in memory (node names, the timeline's downs and ups).
MAX_NODES: Final = 100_000
MAX_FLAPS: Final = 100_000
MAX_NUMBER: Final = 1e15  # larger than any time, count or rate a scenario needs
# A driver version as nvidia-smi prints it (570.133.20); kept short and printable.
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]{0,31}")
# The simulated BMC (agent/sim/bmc.py): its fans and supplies, an inlet no room reaches, and
# what an SEL entry may say.
MAX_INLET_C: Final = 80.0
SEL_SEVERITIES: Final = ("OK", "Warning", "Critical")
_SEL_TEXT = re.compile(r"[ -~]{1,120}")
# The rates an NDR port can train down to (Gb/s; what the kernel's ``rate`` file names).
LOWER_IB_RATES: Final = (200, 100, 56, 40, 20, 10)
# NVML clocks-event reasons of power (SW power cap, HW power brake) and of heat, and the SM
# clock each holds an H100 at (thermal: what SimNode.thermal sets).
POWER_CAP_REASON: Final = 0x4
POWER_BRAKE_REASON: Final = 0x80
THERMAL_REASON_BITS: Final = 0x20 | 0x40
FULL_CLOCK_MHZ: Final = 1980
THERMAL_CLOCK_MHZ: Final = 1305
POWER_CLOCKS_MHZ: Final = {POWER_CAP_REASON: 1755, POWER_BRAKE_REASON: 1600}
NORMAL_POWER_MW: Final = 118_000
MIN_CAP_W, MAX_CAP_W = 100, 1000  # what nvidia-smi -pl accepts on data-centre GPUs, roughly


class ScenarioError(ValueError):
    """A scenario file is invalid; the message names the file, the fault and the key."""


class FaultKind(StrEnum):
    """What can go wrong on a simulated node."""

    XID = "xid"
    GPU_LOST = "gpu_lost"
    PCI_REMOVE = "pci_remove"
    NVLINK_DOWN = "nvlink_down"
    NVLINK_UP = "nvlink_up"
    NVLINK_ERRORS = "nvlink_errors"
    PCIE_REPLAYS = "pcie_replays"
    PCIE_DOWNGRADE = "pcie_downgrade"
    ECC_SBE = "ecc_sbe"
    ECC_DBE = "ecc_dbe"
    REMAP_PENDING = "remap_pending"
    REMAP_FAILURE = "remap_failure"
    THERMAL = "thermal"
    THERMAL_CLEAR = "thermal_clear"
    NVML_HANG = "nvml_hang"
    NVML_HANG_CLEAR = "nvml_hang_clear"
    IB_DOWN = "ib_down"
    IB_UP = "ib_up"
    IB_FLAP = "ib_flap"
    IB_SYMBOL_ERRORS = "ib_symbol_errors"
    IB_CONGESTION = "ib_congestion"
    SLOW_GPU = "slow_gpu"
    NODE_CRASH = "node_crash"
    # No error counter shows these; pre-flight measurements find them.
    P2P_LOW = "p2p_low"
    IB_RATE_LOW = "ib_rate_low"
    BAD_CABLE = "bad_cable"
    DRIVER_VERSION = "driver_version"
    # The kernel's other hardware lines, a NIC's PCIe link, a RoCE port's GIDs (host_faults.py).
    MCE = "mce"
    MCE_UNCORRECTED = "mce_uncorrected"
    FS_ERROR = "fs_error"
    FS_READ_ONLY = "fs_read_only"
    SXID = "sxid"
    SXID_FATAL = "sxid_fatal"
    AER_UNRECOVERED = "aer_unrecovered"
    NIC_PCIE_DOWNGRADE = "nic_pcie_downgrade"
    ROCE_GID_MISSING = "roce_gid_missing"
    GPU_UNKNOWN_ERROR = "gpu_unknown_error"
    # The node's BMC (agent/sim/bmc.py): what its Redfish service and SEL then say.
    FAN_FAILURE = "fan_failure"
    PSU_FAILURE = "psu_failure"
    PSU_REDUNDANCY_LOST = "psu_redundancy_lost"
    INLET_HOT = "inlet_hot"
    SEL_EVENT = "sel_event"
    # Power and resets (a GPU slowed less than by heat; a GPU the driver cannot reset), and a
    # node's agent cut off from its collector for a while (it keeps watching and holds events).
    POWER_BRAKE = "power_brake"
    POWER_CAP = "power_cap"
    POWER_CLEAR = "power_clear"
    RESET_FAILS = "reset_fails"
    AGENT_CUTOFF = "agent_cutoff"
    # A training rank's own hang, played by a simulated job whose ranks are processes
    # (agent/sim/training.py): stopped, exited, stuck before its collective, in another one; or
    # every rank on the node stalled outside any collective (a filesystem).
    RANK_STOP = "rank_stop"
    RANK_EXIT = "rank_exit"
    RANK_STUCK = "rank_stuck"
    RANK_DESYNC = "rank_desync"
    JOB_STALL = "job_stall"


# The parameters each kind takes (all required), with their type.
PARAMS: Final[dict[FaultKind, dict[str, type]]] = {
    FaultKind.XID: {"gpu": int, "xid": int},
    FaultKind.GPU_LOST: {"gpu": int},
    FaultKind.PCI_REMOVE: {"gpu": int},
    FaultKind.NVLINK_DOWN: {"gpu": int, "link": int},
    FaultKind.NVLINK_UP: {"gpu": int, "link": int},
    FaultKind.NVLINK_ERRORS: {"gpu": int, "link": int, "replay": int, "recovery": int, "crc": int},
    FaultKind.PCIE_REPLAYS: {"gpu": int, "count": int},
    FaultKind.PCIE_DOWNGRADE: {"gpu": int, "gen": int, "width": int},
    FaultKind.ECC_SBE: {"gpu": int, "count": int},
    FaultKind.ECC_DBE: {"gpu": int},
    FaultKind.REMAP_PENDING: {"gpu": int},
    FaultKind.REMAP_FAILURE: {"gpu": int},
    FaultKind.THERMAL: {"gpu": int, "temperature": int},
    FaultKind.THERMAL_CLEAR: {"gpu": int},
    FaultKind.NVML_HANG: {"gpu": int},
    FaultKind.NVML_HANG_CLEAR: {"gpu": int},
    FaultKind.IB_DOWN: {"port": int},
    FaultKind.IB_UP: {"port": int},
    FaultKind.IB_FLAP: {"port": int, "times": int, "every": float},
    FaultKind.IB_SYMBOL_ERRORS: {"port": int, "count": int},
    FaultKind.IB_CONGESTION: {"port": int, "xmit_wait_per_s": float},
    FaultKind.SLOW_GPU: {"gpu": int, "factor": float},
    FaultKind.NODE_CRASH: {},
    FaultKind.P2P_LOW: {"gpu": int, "peer": int, "factor": float},
    FaultKind.IB_RATE_LOW: {"port": int, "rate": int},
    FaultKind.BAD_CABLE: {"peer": str, "port": int, "factor": float},
    FaultKind.DRIVER_VERSION: {"version": str},
    FaultKind.MCE: {"cpu": int},
    FaultKind.MCE_UNCORRECTED: {"cpu": int},
    FaultKind.FS_ERROR: {"device": str},
    FaultKind.FS_READ_ONLY: {"device": str},
    FaultKind.SXID: {"switch": int, "sxid": int},
    FaultKind.SXID_FATAL: {"switch": int, "sxid": int},
    FaultKind.AER_UNRECOVERED: {"gpu": int},
    FaultKind.NIC_PCIE_DOWNGRADE: {"port": int, "gen": int, "width": int},
    FaultKind.ROCE_GID_MISSING: {"port": int},
    FaultKind.GPU_UNKNOWN_ERROR: {"gpu": int},
    FaultKind.FAN_FAILURE: {"fan": int},
    FaultKind.PSU_FAILURE: {"psu": int},
    FaultKind.PSU_REDUNDANCY_LOST: {},
    FaultKind.INLET_HOT: {"celsius": float},
    FaultKind.SEL_EVENT: {"severity": str, "sensor": str, "message": str},
    FaultKind.POWER_BRAKE: {"gpu": int},
    FaultKind.POWER_CAP: {"gpu": int, "watts": int},
    FaultKind.POWER_CLEAR: {"gpu": int},
    FaultKind.RESET_FAILS: {"gpu": int},
    FaultKind.AGENT_CUTOFF: {"seconds": float},
    FaultKind.RANK_STOP: {"gpu": int},
    FaultKind.RANK_EXIT: {"gpu": int},
    FaultKind.RANK_STUCK: {"gpu": int},
    FaultKind.RANK_DESYNC: {"gpu": int},
    FaultKind.JOB_STALL: {"seconds": float},
}
# The rank hangs, as the rank on the GPU plays them (SimGpu.rank_fault).
RANK_FAULTS: Final = {
    FaultKind.RANK_STOP: "stop",
    FaultKind.RANK_EXIT: "exit",
    FaultKind.RANK_STUCK: "stuck",
    FaultKind.RANK_DESYNC: "desync",
}
# Faults whose ``factor`` is a share of the healthy bandwidth, in (0, 1].
_SHARE_FACTORS: Final = frozenset({FaultKind.P2P_LOW, FaultKind.BAD_CABLE})


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault at ``at_s`` seconds into the scenario, with its parameters."""

    at_s: float
    node: str
    kind: FaultKind
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for people."""
        p = self.params
        details: dict[FaultKind, Callable[[], str]] = {
            FaultKind.XID: lambda: f"Xid {p['xid']} on GPU {p['gpu']}",
            FaultKind.GPU_LOST: lambda: f"GPU {p['gpu']} falls off the bus (Xid 79)",
            FaultKind.PCI_REMOVE: lambda: f"GPU {p['gpu']} removed from the PCI bus",
            FaultKind.NVLINK_DOWN: lambda: f"NVLink {p['link']} of GPU {p['gpu']} down",
            FaultKind.NVLINK_UP: lambda: f"NVLink {p['link']} of GPU {p['gpu']} up",
            FaultKind.PCIE_REPLAYS: lambda: f"{p['count']} PCIe replays on GPU {p['gpu']}",
            FaultKind.PCIE_DOWNGRADE: lambda: (
                f"GPU {p['gpu']} PCIe link down to Gen{p['gen']} x{p['width']}"
            ),
            FaultKind.IB_DOWN: lambda: f"IB port mlx5_{p['port']}/1 down",
            FaultKind.IB_UP: lambda: f"IB port mlx5_{p['port']}/1 up",
            FaultKind.IB_FLAP: lambda: f"IB port mlx5_{p['port']}/1 flaps {p['times']}x",
            FaultKind.NODE_CRASH: lambda: "node crashes (agent silent)",
            FaultKind.ECC_DBE: lambda: f"double-bit ECC error on GPU {p['gpu']}",
            FaultKind.THERMAL: lambda: f"GPU {p['gpu']} throttles at {p['temperature']} °C",
            FaultKind.NVML_HANG: lambda: f"NVML calls on GPU {p['gpu']} hang (driver wedged)",
            FaultKind.NVML_HANG_CLEAR: lambda: f"NVML calls on GPU {p['gpu']} return again",
            FaultKind.SLOW_GPU: lambda: (
                f"GPU {p['gpu']} computes {p['factor']:g}x slower (its training rank straggles)"
            ),
            FaultKind.IB_CONGESTION: lambda: (
                f"IB port mlx5_{p['port']}/1 congested ({p['xmit_wait_per_s']:g} waits/s)"
            ),
            FaultKind.P2P_LOW: lambda: (
                f"GPUs {p['gpu']} and {p['peer']} copy at {p['factor']:g} of their bandwidth"
                " (no NVLink error)"
            ),
            FaultKind.IB_RATE_LOW: lambda: (
                f"IB port mlx5_{p['port']}/1 trained at {p['rate']} Gb/s"
            ),
            FaultKind.BAD_CABLE: lambda: (
                f"bad cable to {p['peer']} on rail mlx5_{p['port']}/1"
                f" ({p['factor']:g} of the bandwidth)"
            ),
            FaultKind.DRIVER_VERSION: lambda: f"runs driver {p['version']}",
            FaultKind.MCE: lambda: f"CPU {p['cpu']} logs a machine check",
            FaultKind.MCE_UNCORRECTED: lambda: f"CPU {p['cpu']} logs an uncorrected machine check",
            FaultKind.FS_ERROR: lambda: f"ext4 errors on {p['device']}",
            FaultKind.FS_READ_ONLY: lambda: f"{p['device']} remounted read-only after errors",
            FaultKind.SXID: lambda: f"NVSwitch {p['switch']} logs non-fatal SXid {p['sxid']}",
            FaultKind.SXID_FATAL: lambda: f"NVSwitch {p['switch']} logs fatal SXid {p['sxid']}",
            FaultKind.AER_UNRECOVERED: lambda: f"GPU {p['gpu']} PCIe error recovery fails",
            FaultKind.NIC_PCIE_DOWNGRADE: lambda: (
                f"NIC of mlx5_{p['port']} PCIe link at Gen{p['gen']} x{p['width']}"
            ),
            FaultKind.ROCE_GID_MISSING: lambda: f"RoCE port mlx5_{p['port']}/1 has no RoCE v2 GID",
            FaultKind.GPU_UNKNOWN_ERROR: lambda: f"GPU {p['gpu']} answers NVML's Unknown Error",
            FaultKind.FAN_FAILURE: lambda: f"BMC: fan {p['fan']} stops",
            FaultKind.PSU_FAILURE: lambda: f"BMC: power supply {p['psu']} fails",
            FaultKind.PSU_REDUNDANCY_LOST: lambda: (
                "BMC: a power feed is lost (no spare supply left)"
            ),
            FaultKind.INLET_HOT: lambda: f"BMC: inlet air at {p['celsius']:g} °C",
            FaultKind.SEL_EVENT: lambda: (
                f"BMC: SEL {p['severity']} entry ({p['sensor']}): {p['message']}"
            ),
            FaultKind.POWER_BRAKE: lambda: f"GPU {p['gpu']} power brake (HW, clocks held down)",
            FaultKind.POWER_CAP: lambda: f"GPU {p['gpu']} capped at {p['watts']} W",
            FaultKind.POWER_CLEAR: lambda: f"GPU {p['gpu']} power back to normal",
            FaultKind.RESET_FAILS: lambda: f"GPU {p['gpu']} can no longer be reset",
            FaultKind.AGENT_CUTOFF: lambda: (
                f"agent cut off from the collector for {p['seconds']:g} s"
            ),
            FaultKind.RANK_STOP: lambda: f"the training rank on GPU {p['gpu']} is stopped",
            FaultKind.RANK_EXIT: lambda: f"the training rank on GPU {p['gpu']} dies",
            FaultKind.RANK_STUCK: lambda: (
                f"the training rank on GPU {p['gpu']} never enters its next collective"
            ),
            FaultKind.RANK_DESYNC: lambda: (
                f"the training rank on GPU {p['gpu']} enters another collective than its peers"
            ),
            FaultKind.JOB_STALL: lambda: (
                f"every training rank stalls outside its collectives for {p['seconds']:g} s"
            ),
        }
        text = details.get(self.kind)
        args = ", ".join(f"{k}={v}" for k, v in p.items())
        return f"{self.node}: {text() if text else f'{self.kind.value} {args}'}"


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named timeline of faults over ``duration_s`` for ``nodes``."""

    name: str
    duration_s: float
    nodes: tuple[str, ...]
    faults: tuple[Fault, ...]
    description: str = ""

    def scaled(self, duration_s: float) -> Scenario:
        """The same timeline stretched or shrunk to ``duration_s``."""
        factor = duration_s / self.duration_s
        faults = []
        for f in self.faults:
            params = dict(f.params)
            if f.kind == FaultKind.IB_FLAP:
                params["every"] = round(params["every"] * factor, 3)
            if f.kind in (FaultKind.AGENT_CUTOFF, FaultKind.JOB_STALL):
                params["seconds"] = round(params["seconds"] * factor, 3)
            faults.append(replace(f, at_s=round(f.at_s * factor, 3), params=params))
        return replace(self, duration_s=duration_s, faults=tuple(faults))

    def timeline(self) -> list[Fault]:
        """Every fault in time order, a flap expanded into its downs and ups."""
        out: list[Fault] = []
        for f in self.faults:
            if f.kind != FaultKind.IB_FLAP:
                out.append(f)
                continue
            port, every = f.params["port"], f.params["every"]
            for k in range(f.params["times"]):
                down_at = f.at_s + k * every
                out.append(Fault(down_at, f.node, FaultKind.IB_DOWN, {"port": port}))
                out.append(Fault(down_at + every / 2, f.node, FaultKind.IB_UP, {"port": port}))
        return sorted(out, key=lambda f: f.at_s)


def _number(where: str, key: str, value: object, kind: type) -> int | float:
    shown = short_repr(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        msg = f"{where}: {key} must be a number, got {shown}"
        raise ScenarioError(msg)
    if kind is int and isinstance(value, float) and not value.is_integer():
        msg = f"{where}: {key} must be a whole number, got {shown}"
        raise ScenarioError(msg)
    # Compared as given: a float() of a 400-digit integer would overflow.
    if value < 0 or value > MAX_NUMBER or (isinstance(value, float) and not math.isfinite(value)):
        msg = f"{where}: {key} must be finite, not negative and at most {MAX_NUMBER:g}, got {shown}"
        raise ScenarioError(msg)
    return int(value) if kind is int else float(value)


def _fault(where: str, raw: object, nodes: tuple[str, ...], duration: float) -> Fault:
    if not isinstance(raw, dict):
        msg = f"{where}: a fault is a mapping with at, node, fault and its parameters"
        raise ScenarioError(msg)
    raw = dict(raw)
    if "fault" not in raw:
        msg = f"{where}: 'fault' is missing"
        raise ScenarioError(msg)
    name = raw.pop("fault")
    if not isinstance(name, str) or name not in {k.value for k in FaultKind}:
        known = ", ".join(k.value for k in FaultKind)
        msg = f"{where}: unknown fault {short_repr(name)}; known: {known}"
        raise ScenarioError(msg)
    kind = FaultKind(name)
    at = _number(where, "at", raw.pop("at", None), float)
    if at > duration:
        msg = f"{where}: at {at} is after the scenario's duration {duration}"
        raise ScenarioError(msg)
    node = raw.pop("node", None)
    if node not in nodes:
        msg = f"{where}: node {short_repr(node)} is not one of the scenario's nodes"
        raise ScenarioError(msg)
    wanted = PARAMS[kind]
    missing = sorted(set(wanted) - raw.keys())
    extra = sorted(
        k[:64] if isinstance(k, str) else short_repr(k) for k in raw.keys() - set(wanted)
    )
    if missing or extra:
        msg = f"{where}: {kind.value} takes {', '.join(wanted) or 'no parameters'}"
        msg += f" (missing: {', '.join(missing)})" if missing else ""
        msg += f" (unknown: {', '.join(extra)})" if extra else ""
        raise ScenarioError(msg)
    params: dict[str, Any] = {
        k: _text(where, k, raw[k], kind) if t is str else _number(where, k, raw[k], t)
        for k, t in wanted.items()
    }
    if params.get("times", 0) > MAX_FLAPS:
        msg = f"{where}: times {params['times']} is more than {MAX_FLAPS} flaps"
        raise ScenarioError(msg)
    _check_new_kinds(where, kind, params, str(node), nodes)
    return Fault(at, str(node), kind, params)


def _text(where: str, key: str, value: object, kind: FaultKind | None = None) -> str:
    if kind == FaultKind.SEL_EVENT:
        return _sel_text(where, key, value)
    if not isinstance(value, str) or not _VERSION.fullmatch(value):
        msg = (
            f"{where}: {key} must be a short name of letters, digits, '.', '-' and '_',"
            f" got {short_repr(value)}"
        )
        raise ScenarioError(msg)
    return value


def _sel_text(where: str, key: str, value: object) -> str:
    """An SEL fault's severity (a Redfish one), sensor type or message (printable, bounded)."""
    if key == "severity":
        if value not in SEL_SEVERITIES:
            msg = f"{where}: severity must be one of {', '.join(SEL_SEVERITIES)}"
            raise ScenarioError(msg + f", got {short_repr(value)}")
        return str(value)
    if not isinstance(value, str) or not _SEL_TEXT.fullmatch(value):
        msg = f"{where}: {key} must be 1 to 120 printable characters, got {short_repr(value)}"
        raise ScenarioError(msg)
    return value


def _check_new_kinds(
    where: str, kind: FaultKind, params: dict[str, Any], node: str, nodes: tuple[str, ...]
) -> None:
    """The checks the faults without error counters need beyond their parameters' types."""
    if kind in _SHARE_FACTORS and not 0 < params["factor"] <= 1:
        msg = f"{where}: factor must be more than 0 and at most 1, got {params['factor']:g}"
        raise ScenarioError(msg)
    if kind == FaultKind.P2P_LOW and params["gpu"] == params["peer"]:
        msg = f"{where}: peer must be another GPU than gpu {params['gpu']}"
        raise ScenarioError(msg)
    if kind == FaultKind.IB_RATE_LOW and params["rate"] not in LOWER_IB_RATES:
        rates = ", ".join(map(str, LOWER_IB_RATES))
        msg = f"{where}: rate must be one an NDR port trains down to ({rates})"
        msg += f", got {params['rate']}"
        raise ScenarioError(msg)
    if kind == FaultKind.FAN_FAILURE and not 0 <= params["fan"] < SIM_FANS:
        msg = f"{where}: fan must be 0 to {SIM_FANS - 1} (a simulated node has {SIM_FANS})"
        raise ScenarioError(msg)
    if kind == FaultKind.PSU_FAILURE and not 0 <= params["psu"] < SIM_PSUS:
        msg = f"{where}: psu must be 0 to {SIM_PSUS - 1} (a simulated node has {SIM_PSUS})"
        raise ScenarioError(msg)
    if kind == FaultKind.INLET_HOT and not 0 < params["celsius"] <= MAX_INLET_C:
        msg = f"{where}: celsius must be above 0 and at most {MAX_INLET_C:g}"
        raise ScenarioError(msg + f", got {params['celsius']:g}")
    if kind == FaultKind.POWER_CAP and not MIN_CAP_W <= params["watts"] <= MAX_CAP_W:
        msg = f"{where}: watts must be {MIN_CAP_W} to {MAX_CAP_W}, got {params['watts']}"
        raise ScenarioError(msg)
    if kind in (FaultKind.AGENT_CUTOFF, FaultKind.JOB_STALL) and params["seconds"] <= 0:
        msg = f"{where}: seconds must be more than 0, got {params['seconds']:g}"
        raise ScenarioError(msg)
    if kind == FaultKind.BAD_CABLE and (params["peer"] not in nodes or params["peer"] == node):
        msg = f"{where}: peer {short_repr(params['peer'])} is not another of the scenario's nodes"
        raise ScenarioError(msg)


def parse_scenario(text: str, where: str = "<scenario>") -> Scenario:
    """Parse and check a scenario; every problem is a ScenarioError naming the fault and key."""
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        # ValueError: an integer of thousands of digits; RecursionError: absurd nesting
        msg = f"{where}: not valid YAML: {str(exc)[:300]}"
        raise ScenarioError(msg) from exc
    if not isinstance(data, dict) or data.get("version") != 1:
        msg = f"{where}: expected a mapping with 'version: 1'"
        raise ScenarioError(msg)
    duration = _number(where, "duration", data.get("duration"), float)
    if duration <= 0:
        msg = f"{where}: duration must be positive"
        raise ScenarioError(msg)
    raw_nodes = data.get("nodes")
    if (
        isinstance(raw_nodes, int)
        and not isinstance(raw_nodes, bool)
        and 0 < raw_nodes <= MAX_NODES
    ):
        nodes = tuple(f"node-{i:02d}" for i in range(1, raw_nodes + 1))
    elif (
        isinstance(raw_nodes, list)
        and 0 < len(raw_nodes) <= MAX_NODES
        and all(isinstance(n, str) for n in raw_nodes)
    ):
        nodes = tuple(raw_nodes)
    else:
        msg = f"{where}: nodes must be a count or a list of names (1 to {MAX_NODES})"
        raise ScenarioError(msg)
    raw_faults = data.get("faults") or []
    if not isinstance(raw_faults, list):
        msg = f"{where}: faults must be a list"
        raise ScenarioError(msg)
    faults = tuple(
        _fault(f"{where}: fault {i + 1}", raw, nodes, duration) for i, raw in enumerate(raw_faults)
    )
    return Scenario(
        name=str(data.get("name", where)),
        duration_s=duration,
        nodes=nodes,
        faults=faults,
        description=str(data.get("description", "")),
    )


def load_scenario(path: Path | None = None) -> Scenario:
    """Load a scenario file, or the built-in demo scenario when ``path`` is None."""
    text, where = read_data_file(
        path, ("agent.sim", "builtin/demo.yaml"), "scenario", ScenarioError
    )
    return parse_scenario(text, where)


def _rank_fault(what: str) -> Callable[[SimNode, dict[str, Any]], None]:
    """Apply a rank hang: the rank on the fault's GPU plays ``what`` next."""

    def apply(node: SimNode, params: dict[str, Any]) -> None:
        node.rank_fault(params["gpu"], what)

    return apply


_APPLY: Final[dict[FaultKind, Callable[[SimNode, dict[str, Any]], None]]] = {
    FaultKind.XID: lambda n, p: n.xid(p["gpu"], p["xid"]),
    FaultKind.GPU_LOST: lambda n, p: n.xid(p["gpu"], 79),
    FaultKind.PCI_REMOVE: lambda n, p: n.pci_remove(p["gpu"]),
    FaultKind.NVLINK_DOWN: lambda n, p: n.nvlink_down(p["gpu"], p["link"]),
    FaultKind.NVLINK_UP: lambda n, p: n.nvlink_up(p["gpu"], p["link"]),
    FaultKind.NVLINK_ERRORS: lambda n, p: n.nvlink_errors(
        p["gpu"],
        p["link"],
        replay=p["replay"],
        recovery=p["recovery"],
        crc=p["crc"],
    ),
    FaultKind.PCIE_REPLAYS: lambda n, p: n.pcie_replays(p["gpu"], p["count"]),
    FaultKind.PCIE_DOWNGRADE: lambda n, p: n.pcie_downgrade(
        p["gpu"], gen=p["gen"], width=p["width"]
    ),
    FaultKind.ECC_SBE: lambda n, p: n.ecc_errors(p["gpu"], sbe=p["count"]),
    FaultKind.ECC_DBE: lambda n, p: n.ecc_errors(p["gpu"], dbe=1),
    FaultKind.REMAP_PENDING: lambda n, p: n.remap(p["gpu"], pending=True),
    FaultKind.REMAP_FAILURE: lambda n, p: n.remap(p["gpu"], failure=True),
    FaultKind.THERMAL: lambda n, p: n.thermal(p["gpu"], p["temperature"]),
    FaultKind.THERMAL_CLEAR: lambda n, p: n.thermal(p["gpu"], None),
    FaultKind.NVML_HANG: lambda n, p: n.nvml_hang(p["gpu"]),
    FaultKind.NVML_HANG_CLEAR: lambda n, p: n.nvml_hang_clear(p["gpu"]),
    FaultKind.IB_DOWN: lambda n, p: n.ib_port_down(p["port"]),
    FaultKind.IB_UP: lambda n, p: n.ib_port_up(p["port"]),
    FaultKind.IB_SYMBOL_ERRORS: lambda n, p: n.ib_errors(p["port"], symbol_errors=p["count"]),
    FaultKind.IB_CONGESTION: lambda n, p: n.ib_congestion(p["port"], p["xmit_wait_per_s"]),
    FaultKind.SLOW_GPU: lambda n, p: n.slow(p["gpu"], p["factor"]),
    FaultKind.P2P_LOW: lambda n, p: n.p2p_low(p["gpu"], p["peer"], p["factor"]),
    FaultKind.IB_RATE_LOW: lambda n, p: n.ib_rate(p["port"], p["rate"]),
    FaultKind.BAD_CABLE: lambda n, p: n.bad_cable(p["peer"], p["port"], p["factor"]),
    FaultKind.DRIVER_VERSION: lambda n, p: n.driver_version(p["version"]),
    FaultKind.MCE: lambda n, p: host_faults.machine_check(n, p["cpu"]),
    FaultKind.MCE_UNCORRECTED: lambda n, p: host_faults.machine_check(
        n, p["cpu"], uncorrected=True
    ),
    FaultKind.FS_ERROR: lambda n, p: host_faults.fs_error(n, p["device"], read_only=False),
    FaultKind.FS_READ_ONLY: lambda n, p: host_faults.fs_error(n, p["device"], read_only=True),
    FaultKind.SXID: lambda n, p: host_faults.sxid(n, p["switch"], p["sxid"], fatal=False),
    FaultKind.SXID_FATAL: lambda n, p: host_faults.sxid(n, p["switch"], p["sxid"], fatal=True),
    FaultKind.AER_UNRECOVERED: lambda n, p: host_faults.aer_unrecovered(n, p["gpu"]),
    FaultKind.NIC_PCIE_DOWNGRADE: lambda n, p: host_faults.nic_pcie_downgrade(
        n, p["port"], gen=p["gen"], width=p["width"]
    ),
    FaultKind.ROCE_GID_MISSING: lambda n, p: host_faults.roce_gid_missing(n, p["port"]),
    FaultKind.GPU_UNKNOWN_ERROR: lambda n, p: host_faults.gpu_unknown_error(n, p["gpu"]),
    FaultKind.FAN_FAILURE: lambda n, p: n.bmc.fail_fan(p["fan"]),
    FaultKind.PSU_FAILURE: lambda n, p: n.bmc.fail_psu(p["psu"]),
    FaultKind.PSU_REDUNDANCY_LOST: lambda n, _: n.bmc.lose_feed(),
    FaultKind.INLET_HOT: lambda n, p: n.bmc.heat_inlet(p["celsius"]),
    FaultKind.SEL_EVENT: lambda n, p: n.bmc.log(p["severity"], p["sensor"], p["message"]),
    FaultKind.POWER_BRAKE: lambda n, p: _power(n, p["gpu"], POWER_BRAKE_REASON, None),
    FaultKind.POWER_CAP: lambda n, p: _power(n, p["gpu"], POWER_CAP_REASON, p["watts"]),
    FaultKind.POWER_CLEAR: lambda n, p: _power(n, p["gpu"], 0, None),
    FaultKind.RESET_FAILS: lambda n, p: setattr(n.gpus[p["gpu"]], "reset_fails", True),
    **{kind: _rank_fault(what) for kind, what in RANK_FAULTS.items()},
    FaultKind.JOB_STALL: lambda n, p: n.stall(p["seconds"]),
}


def _power(node: SimNode, index: int, reason: int, watts: int | None) -> None:
    """A power brake or cap on a GPU (``reason`` 0 ends both), as NVML then reports it.

    Both hold the SM clock down by less than thermal slowdown does (a simulated training rank
    computes in proportion): a cap to 1,755 MHz and the board's power at the cap, a brake to
    1,600 MHz. Heat still slows the GPU more while it lasts.
    """
    gpu = node.gpus[index]
    gpu.clock_event_reasons &= ~(POWER_BRAKE_REASON | POWER_CAP_REASON)
    gpu.clock_event_reasons |= reason
    clock = POWER_CLOCKS_MHZ.get(reason, FULL_CLOCK_MHZ)
    if gpu.clock_event_reasons & THERMAL_REASON_BITS:
        clock = min(clock, THERMAL_CLOCK_MHZ)
    gpu.sm_clock_mhz = clock
    if watts is not None:
        gpu.power_mw = watts * 1000
    elif reason == 0:
        gpu.power_mw = NORMAL_POWER_MW


def apply_fault(fault: Fault, node: SimNode) -> None:
    """Make ``fault`` happen on ``node``.

    A crash and a cut-off are the caller's to stage (they stop the agent, or its link); a flap
    is expanded by :meth:`Scenario.timeline` into downs and ups.
    """
    action = _APPLY.get(fault.kind)
    if action is None:
        if fault.kind in (FaultKind.NODE_CRASH, FaultKind.AGENT_CUTOFF, FaultKind.IB_FLAP):
            return
        msg = f"no simulator action for {fault.kind}"
        raise ScenarioError(msg)
    try:
        action(node, fault.params)
    except IndexError as exc:
        msg = f"{fault.describe()}: no such GPU, link or port on {node.name}"
        raise ScenarioError(msg) from exc
