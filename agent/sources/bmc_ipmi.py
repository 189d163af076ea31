"""The BMC over IPMI, for machines without Redfish: ``ipmitool -I lanplus``.

``ipmitool`` runs as an argument list (no shell) with a time limit, in a session of IPMI's User
privilege (it only reads). The password goes in a file (``-f``), never on the command line.
Three listings are read:

- ``sensor``: every threshold sensor, ``name | reading | unit | status | lnr | lcr | lnc | unc |
  ucr | unr``; fans are those read in RPM, temperatures those in degrees C;
- ``sdr type "Power Supply"``: the supplies' discrete states, ``name | id | status | entity |
  states`` (``Presence detected, Failure detected, Power Supply AC lost``), and the power unit's
  redundancy (``Redundancy Lost``, ``Fully Redundant``);
- ``sel elist``: the System Event Log, ``id | date | time | sensor | event | direction [|
  reading]``, whose record ids (hexadecimal) order the entries.

The parsers are pure functions over that text (tests feed them what ``ipmitool`` printed
against OpenIPMI's ``ipmi_sim``).
"""

from __future__ import annotations

import math
import re
import subprocess
from typing import TYPE_CHECKING, Final

from agent.sources.bmc import (
    BmcError,
    BmcReading,
    Fan,
    Health,
    Place,
    PowerSupply,
    SelEntry,
    SelRead,
    Severity,
    Temperature,
    component_name,
    new_entries,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

MAX_OUTPUT: Final = 4 << 20
_STATUS_HEALTH: Final = {
    "ok": Health.OK,
    "nc": Health.WARNING,
    "lnc": Health.WARNING,
    "unc": Health.WARNING,
    "cr": Health.CRITICAL,
    "lcr": Health.CRITICAL,
    "ucr": Health.CRITICAL,
    "nr": Health.CRITICAL,
    "lnr": Health.CRITICAL,
    "unr": Health.CRITICAL,
}
_INLET: Final = re.compile(r"inlet|intake|ambient|ambt|room", re.IGNORECASE)
_OUTLET: Final = re.compile(r"outlet|exhaust", re.IGNORECASE)
# SEL events by what they say: critical, then warning; anything else is informational.
_CRITICAL: Final = re.compile(
    r"critical|non-recoverable|failure|failed|fault|ac lost|input lost|redundancy lost|"
    r"uncorrectable|machine check|ierr|thermal trip|low battery|battery low",
    re.IGNORECASE,
)
_NOT_CRITICAL: Final = re.compile(r"non-critical", re.IGNORECASE)
_WARNING: Final = re.compile(
    r"non-critical|degraded|predictive|correctable|presence detected|device removed|absent|"
    r"unknown",
    re.IGNORECASE,
)


# IPMI's sensor type names as ``ipmitool sel elist`` prints them before a sensor's name (IPMI 2.0
# table 42-3), longest first so that "Power Supply" is not taken for "Power Unit"'s prefix.
SENSOR_TYPES: Final = tuple(
    sorted(
        (
            "Temperature",
            "Voltage",
            "Current",
            "Fan",
            "Physical Security",
            "Platform Security",
            "Processor",
            "Power Supply",
            "Power Unit",
            "Cooling Device",
            "Other",
            "Memory",
            "Drive Slot / Bay",
            "POST Memory Resize",
            "System Firmware",
            "Event Logging Disabled",
            "Watchdog1",
            "System Event",
            "Critical Interrupt",
            "Button",
            "Module / Board",
            "Microcontroller",
            "Add-in Card",
            "Chassis",
            "Chip Set",
            "Other FRU",
            "Cable / Interconnect",
            "Terminator",
            "System Boot Initiated",
            "Boot Error",
            "OS Boot",
            "OS Critical Stop",
            "Slot / Connector",
            "System ACPI Power State",
            "Watchdog2",
            "Platform Alert",
            "Entity Presence",
            "Monitor ASIC",
            "LAN",
            "Management Subsystem Health",
            "Battery",
            "Session Audit",
            "Version Change",
            "FRU State",
        ),
        key=len,
        reverse=True,
    )
)


def split_sensor(text: str) -> tuple[str, str]:
    """(sensor type, sensor) of an SEL entry's sensor column (``Power Supply PS2 Status``).

    Without an SDR for it ipmitool prints the number (``Fan #0x30``): the whole is the sensor.
    """
    for kind in SENSOR_TYPES:
        if text.startswith(kind + " "):
            rest = text[len(kind) + 1 :].strip()
            return kind, text if rest.startswith("#") else rest
    return (text.split(" #", 1)[0] if " #" in text else ""), text


def _float(text: str) -> float | None:
    """A finite reading; None for ``na``, ``inf``, ``nan`` and what is no number."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _columns(line: str) -> list[str]:
    return [c.strip() for c in line.split("|")]


def parse_sensor_list(text: str) -> tuple[list[Fan], list[Temperature]]:
    """Fans and temperature sensors from ``ipmitool sensor``."""
    fans: list[Fan] = []
    temps: list[Temperature] = []
    for line in text.splitlines():
        cols = _columns(line)
        if len(cols) < 10:  # noqa: PLR2004 - the listing's ten columns
            continue
        raw, value, unit, status = cols[0], cols[1], cols[2].lower(), cols[3].lower()
        reading = _float(value)
        health = _STATUS_HEALTH.get(status, Health.OK if status != "na" else Health.UNKNOWN)
        if unit == "rpm":
            present = status not in ("na", "ns") or reading is not None
            fans.append(
                Fan(
                    name=component_name(raw, f"fan{len(fans)}"),
                    health=health,
                    present=present,
                    rpm=reading,
                    lower_critical=_float(cols[5]),
                )
            )
        elif unit == "degrees c":
            place = (
                Place.INLET
                if _INLET.search(raw)
                else Place.OUTLET
                if _OUTLET.search(raw)
                else Place.COMPONENT
            )
            temps.append(
                Temperature(
                    name=component_name(raw, f"temp{len(temps)}"),
                    celsius=reading,
                    place=place,
                    upper_critical=_float(cols[8]),
                    health=health,
                )
            )
    return fans, temps


def parse_power_supplies(text: str) -> tuple[list[PowerSupply], bool | None]:
    """Supplies, and the power unit's redundancy verdict, from ``sdr type "Power Supply"``.

    A line whose states say ``Redundancy`` is the power unit's redundancy sensor, not a supply.
    """
    psus: list[PowerSupply] = []
    redundancy: bool | None = None
    for line in text.splitlines():
        cols = _columns(line)
        if len(cols) < 5:  # noqa: PLR2004 - the listing's five columns
            continue
        raw, status, states = cols[0], cols[2].lower(), cols[4].lower()
        if "redundan" in states or "redundan" in raw.lower():
            if "fully redundant" in states:
                redundancy = True
            elif "lost" in states or "degraded" in states or "insufficient" in states:
                redundancy = False
            continue
        if status == "ns":  # no reading: the slot is empty
            present = False
        else:
            present = "presence detected" in states or "absent" not in states
        failed = "failure detected" in states or "predictive failure" in states
        input_lost = "ac lost" in states or "input lost" in states or "out-of-range" in states
        health = Health.CRITICAL if failed or status in ("cr", "nr") else Health.OK
        psus.append(
            PowerSupply(
                name=component_name(raw, f"psu{len(psus)}"),
                health=health,
                present=present,
                input_lost=input_lost,
            )
        )
    return psus, redundancy


def sel_severity(event: str, direction: str, sensor_type: str = "") -> Severity:
    """How bad an SEL event is, from its text (IPMI carries no severity of its own).

    A battery's ``Low`` (IPMI: battery low, predictive failure) is a warning.
    """
    if direction.lower().startswith("deasserted"):
        return Severity.OK
    if sensor_type == "Battery" and event.strip().lower() == "low":
        return Severity.WARNING
    if _CRITICAL.search(event) and not _NOT_CRITICAL.search(event):
        return Severity.CRITICAL
    if _WARNING.search(event):
        return Severity.WARNING
    return Severity.OK


def parse_sel_list(text: str) -> list[SelEntry]:
    """Entries of ``ipmitool sel elist`` (record ids are hexadecimal)."""
    entries: list[SelEntry] = []
    for line in text.splitlines():
        cols = _columns(line)
        if len(cols) < 5:  # noqa: PLR2004 - id, date, time, sensor, event at least
            continue
        try:
            key = int(cols[0], 16) if len(cols[0]) <= 16 else -1  # noqa: PLR2004 - 64 bits
        except ValueError:
            continue
        if key < 0:
            continue
        sensor, event = cols[3], cols[4]
        direction = cols[5] if len(cols) > 5 else ""  # noqa: PLR2004
        extra = f" ({cols[6]})" if len(cols) > 6 and cols[6] else ""  # noqa: PLR2004
        sensor_type, name = split_sensor(sensor)
        entries.append(
            SelEntry(
                key=key,
                severity=sel_severity(event, direction, sensor_type),
                sensor=name[:64],
                message=f"{event} {direction}{extra}".strip()[:200],
                created=f"{cols[1]} {cols[2]}"[:40],
                sensor_type=sensor_type[:40],
            )
        )
    return entries


def run_ipmitool(argv: Sequence[str], timeout_s: float) -> str:
    """Run ``argv`` (no shell) and return what it printed; BmcError when it fails or hangs."""
    try:
        done = subprocess.run(  # noqa: S603 - a fixed program and options, no shell
            list(argv),
            capture_output=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        msg = f"{argv[0]} {argv[-1]}: no answer within {timeout_s:g} s"
        raise BmcError(msg) from exc
    except OSError as exc:
        msg = f"{argv[0]}: cannot run: {exc.strerror}"
        raise BmcError(msg) from exc
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        msg = f"{argv[0]} {argv[-1]}: exit status {done.returncode}: {why[-1] if why else ''}"
        raise BmcError(msg[:300])
    return done.stdout[:MAX_OUTPUT].decode(errors="replace")


class IpmiBmc:
    """A BMC read with ``ipmitool -I lanplus``; ``run`` runs one command (injected in tests)."""

    def __init__(  # noqa: PLR0913 - one BMC's address, credentials and the tool
        self,
        host: str,
        port: int,
        username: str,
        password_file: Path,
        *,
        program: str = "ipmitool",
        cipher_suite: int = 17,
        timeout_s: float = 10.0,
        run: Callable[[Sequence[str], float], str] = run_ipmitool,
    ) -> None:
        """Keep the command line's fixed part; nothing runs until :meth:`read`."""
        self._address = f"{host}:{port}" if port != 623 else host  # noqa: PLR2004 - RMCP's port
        self._base = [
            program,
            "-I",
            "lanplus",
            "-C",
            str(cipher_suite),
            "-L",  # the session's privilege: the User level reads sensors, the SDR and the SEL
            "USER",
            "-H",
            host,
            "-p",
            str(port),
            "-U",
            username,
            "-f",
            str(password_file),
            "-N",  # seconds per try, and one retry: our own deadline bounds the whole read
            str(max(1, int(timeout_s / 4))),
            "-R",
            "1",
        ]
        self._timeout_s = timeout_s
        self._run = run

    @property
    def address(self) -> str:
        """The BMC's address."""
        return self._address

    def read(self) -> BmcReading:
        """Fans and temperatures from ``sensor``, supplies from the SDR's power supply type."""
        fans, temps = parse_sensor_list(self._ipmitool("sensor"))
        psus, redundancy = parse_power_supplies(self._ipmitool("sdr", "type", "Power Supply"))
        return BmcReading(
            fans=tuple(fans),
            psus=tuple(psus),
            temperatures=tuple(temps),
            redundancy_ok=redundancy,
        )

    def read_sel(self, after: int | None) -> SelRead:
        """The SEL's entries past ``after``."""
        return new_entries(parse_sel_list(self._ipmitool("sel", "elist")), after)

    def _ipmitool(self, *args: str) -> str:
        return self._run([*self._base, *args], self._timeout_s)
