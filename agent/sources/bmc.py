"""The node's BMC as the agent sees it, whichever protocol read it (Redfish or IPMI).

A reading is what the BMC says now about the node's fans, power supplies and temperature
sensors; the System Event Log (SEL) is read incrementally, after the last entry already seen.
Both protocols' sources (:mod:`agent.sources.bmc_redfish`, :mod:`agent.sources.bmc_ipmi`) and the
simulator's BMC answer :class:`BmcSource`; what a reading means (a failed fan, redundancy lost)
is decided here, once, so the two protocols cannot disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Protocol

from agent.exceptions import SourceError

_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_.-]+")


class BmcError(SourceError):
    """The BMC could not be read (unreachable, refused us, answered nonsense)."""

    def __init__(self, message: str) -> None:
        """Name the source ``bmc``."""
        super().__init__("bmc", message)


def component_name(name: str, fallback: str) -> str:
    """A component's name made safe for a wire target's device (``Fan 3`` -> ``Fan_3``)."""
    safe = _UNSAFE.sub("_", name.strip()).strip("_")[:64]
    return safe or fallback


class Health(StrEnum):
    """A component's health as the BMC rates it (Redfish's Status.Health; IPMI's state)."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    UNKNOWN = "unknown"


class Place(StrEnum):
    """Where a temperature sensor sits: the air coming in, going out, or on a component."""

    INLET = "inlet"
    OUTLET = "outlet"
    COMPONENT = "component"


@dataclass(frozen=True, slots=True)
class Fan:
    """One fan: its speed (RPM, or percent where the BMC gives only that) and its limits."""

    name: str
    health: Health = Health.OK
    present: bool = True
    rpm: float | None = None
    lower_critical: float | None = None  # at or below this speed the BMC calls it critical

    @property
    def failed(self) -> bool:
        """Critical health, or turning at or below its critical speed (a stopped fan: 0 RPM)."""
        if not self.present:
            return False
        if self.health == Health.CRITICAL:
            return True
        return (
            self.rpm is not None
            and self.lower_critical is not None
            and self.rpm <= self.lower_critical
        )

    def describe(self) -> str:
        """One line for an event's detail."""
        speed = "no reading" if self.rpm is None else f"{self.rpm:g} RPM"
        limit = "" if self.lower_critical is None else f", critical at {self.lower_critical:g}"
        return f"fan {self.name}: {speed}{limit}, health {self.health.value}"


@dataclass(frozen=True, slots=True)
class PowerSupply:
    """One power supply unit."""

    name: str
    health: Health = Health.OK
    present: bool = True
    input_lost: bool = False  # its AC (or DC) input is gone: it delivers nothing
    output_watts: float | None = None

    @property
    def failed(self) -> bool:
        """The supply itself failed (critical health): it needs replacing."""
        return self.present and self.health == Health.CRITICAL

    @property
    def working(self) -> bool:
        """Present, not failed, and fed: it carries its share of the node."""
        return self.present and not self.failed and not self.input_lost

    @property
    def down(self) -> bool:
        """Present but carrying nothing, failed or unfed (what its events report)."""
        return self.present and not self.working

    def describe(self) -> str:
        """One line for an event's detail."""
        parts = [f"power supply {self.name}: health {self.health.value}"]
        if not self.present:
            parts.append("absent")
        if self.input_lost:
            parts.append("input lost")
        if self.output_watts is not None:
            parts.append(f"{self.output_watts:g} W out")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Temperature:
    """One temperature sensor and its upper critical threshold."""

    name: str
    celsius: float | None
    place: Place = Place.COMPONENT
    upper_critical: float | None = None
    health: Health = Health.OK

    @property
    def critical(self) -> bool:
        """At or above its critical threshold, or rated critical by the BMC."""
        if self.health == Health.CRITICAL:
            return True
        return (
            self.celsius is not None
            and self.upper_critical is not None
            and self.celsius >= self.upper_critical
        )

    def describe(self) -> str:
        """One line for an event's detail."""
        now = "no reading" if self.celsius is None else f"{self.celsius:g} °C"
        limit = "" if self.upper_critical is None else f", critical at {self.upper_critical:g}"
        return f"{self.place.value} sensor {self.name}: {now}{limit}"


@dataclass(frozen=True, slots=True)
class BmcReading:
    """Everything one read of the BMC found (SEL entries apart).

    ``psus_needed``: how many working supplies the node needs, where the BMC says (Redfish's
    ``MinNumNeeded``); ``redundancy_ok``: the BMC's own verdict on power redundancy, where it
    gives one (None: it gives none).
    """

    fans: tuple[Fan, ...] = ()
    psus: tuple[PowerSupply, ...] = ()
    temperatures: tuple[Temperature, ...] = ()
    psus_needed: int | None = None
    redundancy_ok: bool | None = None
    power_watts: float | None = None  # what the node draws, where the BMC says


class Severity(StrEnum):
    """An SEL entry's severity (Redfish's; IPMI's derived from the event)."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class SelEntry:
    """One System Event Log entry. ``key`` orders entries (the record id, a number)."""

    key: int
    severity: Severity
    sensor: str  # the sensor or component it is about ("Fan #0x30", "Battery", "PSU2 Status")
    message: str
    created: str = ""  # the BMC's own time stamp, as text (BMC clocks are often wrong)
    sensor_type: str = ""  # IPMI sensor type or Redfish SensorType ("Fan", "Battery", ...)

    def describe(self) -> str:
        """One line for an event's detail."""
        kind = f" ({self.sensor_type})" if self.sensor_type not in ("", self.sensor) else ""
        when = f" at {self.created}" if self.created else ""
        return f"SEL {self.key} {self.severity.value}: {self.sensor}{kind}: {self.message}{when}"


@dataclass(slots=True)
class SelRead:
    """The entries after a position, and the position to read after next time."""

    entries: list[SelEntry] = field(default_factory=list)
    last_key: int = 0  # the newest entry's key (0: the log is empty)


class BmcSource(Protocol):
    """What the BMC poller reads.

    Every method blocks (network, a subprocess): call it off the event loop. Failures raise
    :class:`BmcError`.
    """

    @property
    def address(self) -> str:
        """Which BMC this is (host, or host:port), for logs and the SEL cursor."""

    def read(self) -> BmcReading:
        """Fans, power supplies and temperatures now."""

    def read_sel(self, after: int | None) -> SelRead:
        """SEL entries with a key above ``after`` (None: none are wanted, just the position).

        A log whose newest key is below ``after`` was cleared: every entry in it is new.
        """


def new_entries(entries: list[SelEntry], after: int | None) -> SelRead:
    """Pick what is new in a whole SEL listing (both protocols list it whole).

    The position is the newest key, 0 for an empty log, so a log cleared and empty reads as
    cleared, and what is added to it next is new.
    """
    last = max((e.key for e in entries), default=0)
    if after is None:
        return SelRead([], last)
    if last < after:  # cleared since: everything in it is new
        return SelRead(sorted(entries, key=lambda e: e.key), last)
    return SelRead(sorted((e for e in entries if e.key > after), key=lambda e: e.key), last)
