"""A simulated BMC: an HGX-class node's fans, power supplies, temperatures and SEL, in Redfish.

The simulated node's BMC holds the state its faults change (a fan stopped, a supply failed or
off its feed, a hot inlet, an SEL entry) and serves it as the Redfish documents a real BMC
serves (service root, chassis, ``Thermal``, ``Power``, a manager's ``SEL`` log service).
:class:`SimRedfishService` hands them to the agent's own Redfish reader
(:class:`agent.sources.bmc_redfish.RedfishBmc`) as its transport, so the demo and the tests run
the real parsing; :func:`write_mockup` writes the same documents as a mockup tree for the
``sushy-static`` Redfish emulator (tests/integration/test_bmc_redfish.py).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from agent.sources.bmc import BmcError

if TYPE_CHECKING:
    from pathlib import Path

Json = dict[str, Any]
ROOT: Final = "/redfish/v1"
CHASSIS: Final = f"{ROOT}/Chassis/1"
MANAGER: Final = f"{ROOT}/Managers/BMC"
SEL_ENTRIES: Final = f"{MANAGER}/LogServices/SEL/Entries"
FAN_RPM: Final = 9800.0  # an HGX fan module at a loaded node's speed
FAN_CRITICAL_RPM: Final = 1000.0
INLET_C: Final = 24.0
INLET_CRITICAL_C: Final = 42.0
OUTLET_C: Final = 46.0
PSU_WATTS: Final = 1650.0
FANS: Final = 10
PSUS: Final = 6  # HGX H100: six 3.3 kW supplies, four carry the node (4+2)


@dataclass(slots=True)
class SimFan:
    """One fan module."""

    name: str
    rpm: float = FAN_RPM
    failed: bool = False


@dataclass(slots=True)
class SimPsu:
    """One power supply."""

    name: str
    failed: bool = False
    input_lost: bool = False


@dataclass(slots=True)
class SimSelEntry:
    """One SEL record."""

    key: int
    severity: str  # OK, Warning, Critical
    sensor_type: str
    message: str
    created: str


@dataclass(slots=True)
class SimBmc:
    """The BMC's model; faults change it from the scenario's thread, reads from the agent's."""

    fans: list[SimFan] = field(default_factory=lambda: [SimFan(f"Fan_{i}") for i in range(FANS)])
    psus: list[SimPsu] = field(default_factory=lambda: [SimPsu(f"PSU{i}") for i in range(PSUS)])
    psus_needed: int = 4
    inlet_c: float = INLET_C
    sel: list[SimSelEntry] = field(default_factory=list)
    hang: bool = False  # every read blocks until cleared (a wedged BMC)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _unhung: threading.Event = field(default_factory=threading.Event)

    def fail_fan(self, index: int) -> None:
        """The fan stops: 0 RPM, critical."""
        with self.lock:
            self.fans[index].rpm, self.fans[index].failed = 0.0, True
        self.log("Critical", "Fan", f"Fan {self.fans[index].name} lower critical going low")

    def fail_psu(self, index: int) -> None:
        """The supply fails."""
        with self.lock:
            self.psus[index].failed = True
        self.log("Critical", "Power Supply", f"Power supply {self.psus[index].name} failure")

    def unplug_psu(self, index: int) -> None:
        """The supply's feed is lost (a PDU or a cord): it delivers nothing, nothing broke."""
        with self.lock:
            self.psus[index].input_lost = True
        self.log("Warning", "Power Supply", f"Power supply {self.psus[index].name} AC lost")

    def lose_feed(self) -> None:
        """One power feed is lost: supplies go unfed until only those needed still work.

        What a tripped PDU breaker on the A side does to a node whose spare supplies hang on it:
        nothing broke, and no spare is left.
        """
        working = [i for i, p in enumerate(self.psus) if not p.failed and not p.input_lost]
        for index in working[self.psus_needed :]:
            self.unplug_psu(index)

    def heat_inlet(self, celsius: float) -> None:
        """The air coming in is this warm (the SEL says so when it crosses the critical line)."""
        with self.lock:
            crossed = self.inlet_c < INLET_CRITICAL_C <= celsius
            self.inlet_c = celsius
        if crossed:
            self.log("Critical", "Temperature", "Inlet Temp upper critical going high")

    def log(self, severity: str, sensor_type: str, message: str) -> None:
        """Append an SEL record."""
        with self.lock:
            key = (self.sel[-1].key if self.sel else 0) + 1
            self.sel.append(
                SimSelEntry(key, severity, sensor_type, message, "2026-11-25T00:00:00+00:00")
            )

    def set_hang(self, *, hang: bool) -> None:
        """Make every read block (or let it go on)."""
        self.hang = hang
        if hang:
            self._unhung.clear()
        else:
            self._unhung.set()

    def documents(self) -> dict[str, Json]:
        """Every Redfish document the BMC serves, by path."""
        with self.lock:
            return _documents(self)

    def wait_if_hung(self) -> None:
        """Block while the BMC is hung (called on the agent's read thread)."""
        if self.hang:
            self._unhung.wait()


def _member(path: str) -> Json:
    return {"@odata.id": path}


def _status(*, ok: bool = True, absent: bool = False, warning: bool = False) -> Json:
    health = "OK" if ok else ("Warning" if warning else "Critical")
    return {"State": "Absent" if absent else "Enabled", "Health": health}


def _collection(path: str, members: list[str]) -> Json:
    return {
        "@odata.id": path,
        "Members": [_member(m) for m in members],
        "Members@odata.count": len(members),
    }


def _documents(bmc: SimBmc) -> dict[str, Json]:
    fans = [
        {
            "MemberId": str(i),
            "Name": fan.name,
            "Reading": fan.rpm,
            "ReadingUnits": "RPM",
            "LowerThresholdCritical": FAN_CRITICAL_RPM,
            "Status": _status(ok=not fan.failed),
        }
        for i, fan in enumerate(bmc.fans)
    ]
    temps = [
        {
            "MemberId": "0",
            "Name": "Inlet Temp",
            "PhysicalContext": "Intake",
            "ReadingCelsius": bmc.inlet_c,
            "UpperThresholdNonCritical": 35.0,
            "UpperThresholdCritical": INLET_CRITICAL_C,
            "Status": _status(ok=bmc.inlet_c < INLET_CRITICAL_C),
        },
        {
            "MemberId": "1",
            "Name": "Exhaust Temp",
            "PhysicalContext": "Exhaust",
            "ReadingCelsius": OUTLET_C + (bmc.inlet_c - INLET_C),
            "UpperThresholdCritical": 75.0,
            "Status": _status(),
        },
    ]
    working = sum(not p.failed and not p.input_lost for p in bmc.psus)
    psus = [
        {
            "MemberId": str(i),
            "Name": psu.name,
            "LineInputVoltage": 0 if psu.input_lost else 230,
            "LastPowerOutputWatts": 0 if psu.failed or psu.input_lost else PSU_WATTS,
            "Status": _status(ok=not psu.failed, warning=psu.input_lost and not psu.failed),
        }
        for i, psu in enumerate(bmc.psus)
    ]
    redundant = working > bmc.psus_needed
    sel = [
        {
            "@odata.id": f"{SEL_ENTRIES}/{e.key}",
            "Id": str(e.key),
            "EntryType": "SEL",
            "Severity": e.severity,
            "SensorType": e.sensor_type,
            "Message": e.message,
            "Created": e.created,
        }
        for e in bmc.sel
    ]
    return {
        ROOT: {
            "@odata.id": f"{ROOT}/",
            "RedfishVersion": "1.15.0",
            "Chassis": _member(f"{ROOT}/Chassis"),
            "Managers": _member(f"{ROOT}/Managers"),
        },
        f"{ROOT}/Chassis": _collection(f"{ROOT}/Chassis", [CHASSIS]),
        CHASSIS: {
            "@odata.id": CHASSIS,
            "Id": "1",
            "ChassisType": "RackMount",
            "Thermal": _member(f"{CHASSIS}/Thermal"),
            "Power": _member(f"{CHASSIS}/Power"),
        },
        f"{CHASSIS}/Thermal": {
            "@odata.id": f"{CHASSIS}/Thermal",
            "Fans": fans,
            "Temperatures": temps,
        },
        f"{CHASSIS}/Power": {
            "@odata.id": f"{CHASSIS}/Power",
            "PowerSupplies": psus,
            "PowerControl": [{"PowerConsumedWatts": PSU_WATTS * 0.6 * working}],
            "Redundancy": [
                {
                    "Name": "PSU redundancy",
                    "Mode": "N+m",
                    "MinNumNeeded": bmc.psus_needed,
                    "MaxNumSupported": len(bmc.psus),
                    "Status": _status(ok=redundant, warning=True),
                }
            ],
        },
        f"{ROOT}/Managers": _collection(f"{ROOT}/Managers", [MANAGER]),
        MANAGER: {"@odata.id": MANAGER, "LogServices": _member(f"{MANAGER}/LogServices")},
        f"{MANAGER}/LogServices": _collection(
            f"{MANAGER}/LogServices", [f"{MANAGER}/LogServices/SEL"]
        ),
        f"{MANAGER}/LogServices/SEL": {
            "@odata.id": f"{MANAGER}/LogServices/SEL",
            "Id": "SEL",
            "LogEntryType": "SEL",
            "Entries": _member(SEL_ENTRIES),
        },
        SEL_ENTRIES: {"@odata.id": SEL_ENTRIES, "Members": sel, "Members@odata.count": len(sel)},
    }


class SimRedfishService:
    """The simulated BMC's Redfish service, as a transport for the agent's Redfish reader."""

    def __init__(self, bmc: SimBmc) -> None:
        """Serve ``bmc``."""
        self.bmc = bmc
        self.gets = 0

    def get(self, path: str) -> Json:
        """The document at ``path`` (a trailing slash ignored); BmcError (404) for none."""
        self.bmc.wait_if_hung()
        self.gets += 1
        doc = self.bmc.documents().get(path.rstrip("/"))
        if doc is None:
            msg = f"GET {path}: HTTP 404"
            raise BmcError(msg)
        return doc


def write_mockup(bmc: SimBmc, root: Path) -> None:
    """Write the documents as a Redfish mockup tree (``<path>/index.json``) under ``root``.

    ``root`` is what ``sushy-static --mockup-files`` serves as ``/redfish/v1``.
    """
    for path, doc in bmc.documents().items():
        folder = root / path.removeprefix(ROOT).strip("/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "index.json").write_text(json.dumps(doc, indent=1), "utf-8")
