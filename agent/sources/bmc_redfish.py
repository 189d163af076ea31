"""The BMC over Redfish (DMTF): chassis Thermal and Power, and the SEL through LogServices.

Our own small client over ``http.client`` rather than DMTF's ``redfish`` or OpenStack's
``sushy`` (docs/signals.md#the-nodes-bmc says why): the agent reads a handful of documents every
30 s with Basic authentication, a deadline on every socket operation and TLS that verifies.

What is read: the service root, its ``Chassis`` collection, and per chassis the legacy
``Thermal`` (``Fans``, ``Temperatures``) and ``Power`` (``PowerSupplies``, ``Redundancy``,
``PowerControl``) resources, which every current BMC still serves beside the newer
``ThermalSubsystem``/``PowerSubsystem``. Where a chassis has only the newer ones, its
``ThermalSubsystem/Fans`` and ``PowerSubsystem/PowerSupplies`` collections and its ``Sensors``
are read instead. The SEL is the first log service named ``SEL`` (or of ``LogEntryType`` SEL)
under the managers, else the systems.

The transport is injected: :class:`HttpsTransport` speaks to a real BMC; the simulator serves
the same documents from its model (:mod:`agent.sim.bmc`), so this parsing runs in the demo too.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import re
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

import structlog

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
    from pathlib import Path

log = structlog.get_logger("agent.bmc")

MAX_BODY: Final = 8 << 20  # a Redfish document is kilobytes; a BMC sending more is broken
MAX_SEL_ID_CHARS: Final = 20  # a 64-bit number in decimal; a longer Id is no entry of a log
MAX_PAGES: Final = 50  # a collection's pages followed (Members@odata.nextLink) per read
ROOT: Final = "/redfish/v1/"
Json = dict[str, Any]

_HEALTH: Final = {"OK": Health.OK, "Warning": Health.WARNING, "Critical": Health.CRITICAL}
_SEVERITY: Final = {"OK": Severity.OK, "Warning": Severity.WARNING, "Critical": Severity.CRITICAL}
_SURROGATE: Final = re.compile(r"[\ud800-\udfff]")
_INLET: Final = ("Intake", "Inlet", "Ambient", "Room")
_OUTLET: Final = ("Exhaust", "Outlet")


class RedfishTransport(Protocol):
    """GETs a Redfish path and gives its JSON object; BmcError when it cannot."""

    def get(self, path: str) -> Json:
        """The document at ``path`` (an ``@odata.id``)."""


class HttpsTransport:
    """A Redfish service over HTTPS with Basic authentication, one kept-alive connection.

    TLS verifies the BMC's certificate against ``ca_file`` (a BMC's own self-signed certificate
    works as its CA file) or the system's CAs, and its host name; ``insecure`` turns both off
    and must be asked for. Every socket operation waits at most ``timeout_s``.
    """

    def __init__(  # noqa: PLR0913 - one BMC's address, credentials and TLS choices
        self,
        host: str,
        port: int,
        username: str,
        password: str,
        *,
        ca_file: Path | None = None,
        insecure: bool = False,
        timeout_s: float = 10.0,
    ) -> None:
        """Nothing is opened until the first GET."""
        self._host, self._port, self._timeout = host, port, timeout_s
        if insecure:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        self._context = context
        token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
        self._headers = {
            "Authorization": f"Basic {token}",
            "Accept": "application/json",
            "OData-Version": "4.0",
        }
        self._conn: http.client.HTTPSConnection | None = None

    def get(self, path: str) -> Json:
        """GET ``path``; one retry on a fresh connection when a kept-alive one was closed."""
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request("GET", path, headers=self._headers)
                response = conn.getresponse()
                body = response.read(MAX_BODY + 1)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                if attempt == 1:
                    continue
                msg = f"GET {path}: connection closed: {exc}"
                raise BmcError(msg) from exc
            except ssl.SSLError as exc:
                self.close()
                msg = f"GET {path}: TLS: {exc.reason or exc}"
                raise BmcError(msg) from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                msg = f"GET {path}: {str(exc) or type(exc).__name__}"
                raise BmcError(msg) from exc
            return decode_answer(path, response.status, body)
        raise AssertionError  # pragma: no cover - the loop returns or raises

    def close(self) -> None:
        """Drop the connection (the next GET opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> http.client.HTTPSConnection:
        if self._conn is None:
            self._conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._context
            )
        return self._conn


def decode_answer(path: str, status: int, body: bytes) -> Json:
    """The JSON object of one answer.

    BmcError for an HTTP error, a body too long or nested too deep, NaN or Infinity, or
    anything but an object.
    """
    if status == http.HTTPStatus.UNAUTHORIZED:
        msg = f"GET {path}: 401: the BMC refused the credentials"
        raise BmcError(msg)
    if status != http.HTTPStatus.OK:
        msg = f"GET {path}: HTTP {status}"
        raise BmcError(msg)
    if len(body) > MAX_BODY:
        msg = f"GET {path}: answer longer than {MAX_BODY} bytes"
        raise BmcError(msg)
    try:
        doc = json.loads(body, parse_constant=_no_constant)
    except ValueError as exc:
        msg = f"GET {path}: not JSON: {str(exc)[:200]}"
        raise BmcError(msg) from exc
    except RecursionError as exc:
        msg = f"GET {path}: JSON nested too deep"
        raise BmcError(msg) from exc
    if not isinstance(doc, dict):
        msg = f"GET {path}: not a JSON object"
        raise BmcError(msg)
    return doc


def _link(doc: Json, key: str) -> str | None:
    value = doc.get(key)
    if isinstance(value, dict):
        target = value.get("@odata.id")
        return target if isinstance(target, str) and target.startswith("/") else None
    return None


def _no_constant(name: str) -> object:
    """``NaN``, ``Infinity`` and ``-Infinity``, which Python's json takes and JSON has not."""
    msg = f"{name} is not a JSON number"
    raise ValueError(msg)


def _number(value: object) -> float | None:
    """A finite number, or None (a string, a boolean, an integer too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _status(item: Json) -> tuple[Health, bool]:
    """(health, present) from a Redfish ``Status``; a missing Health reads as OK."""
    status = item.get("Status")
    status = status if isinstance(status, dict) else {}
    health = _HEALTH.get(str(status.get("Health") or "OK"), Health.UNKNOWN)
    present = status.get("State") != "Absent"
    return health, present


def parse_fan(item: Json, index: int) -> Fan:
    """A fan from ``Thermal.Fans[]`` or ``ThermalSubsystem/Fans`` (``SpeedPercent``)."""
    health, present = _status(item)
    name = component_name(str(item.get("Name") or item.get("FanName") or ""), f"fan{index}")
    rpm = _number(item.get("Reading"))
    speed = item.get("SpeedPercent")
    if rpm is None and isinstance(speed, dict):
        rpm = _number(speed.get("SpeedRPM"))
        if rpm is None:
            rpm = _number(speed.get("Reading"))
    low = _number(item.get("LowerThresholdCritical"))
    if low is None:
        low = _number(item.get("LowerThresholdFatal"))
    return Fan(name=name, health=health, present=present, rpm=rpm, lower_critical=low)


def parse_psu(item: Json, index: int) -> PowerSupply:
    """A power supply from ``Power.PowerSupplies[]`` or ``PowerSubsystem/PowerSupplies``."""
    health, present = _status(item)
    name = component_name(str(item.get("Name") or item.get("MemberId") or ""), f"psu{index}")
    volts = _number(item.get("LineInputVoltage"))
    state = item.get("Status", {}).get("State") if isinstance(item.get("Status"), dict) else None
    input_lost = (volts is not None and volts == 0) or state == "UnavailableOffline"
    watts = _number(item.get("LastPowerOutputWatts"))
    return PowerSupply(
        name=name, health=health, present=present, input_lost=input_lost, output_watts=watts
    )


def _place(name: str, context: str) -> Place:
    for word in _INLET:
        if word in context or word.lower() in name.lower():
            return Place.INLET
    for word in _OUTLET:
        if word in context or word.lower() in name.lower():
            return Place.OUTLET
    return Place.COMPONENT


def parse_temperature(item: Json, index: int) -> Temperature:
    """A sensor from ``Thermal.Temperatures[]`` or a ``Sensors`` member of type Temperature."""
    health, _ = _status(item)
    raw_name = str(item.get("Name") or "")
    name = component_name(raw_name, f"temp{index}")
    celsius = _number(item.get("ReadingCelsius"))
    if celsius is None:
        celsius = _number(item.get("Reading"))
    upper = _number(item.get("UpperThresholdCritical"))
    thresholds = item.get("Thresholds")
    if upper is None and isinstance(thresholds, dict):
        critical = thresholds.get("UpperCritical")
        if isinstance(critical, dict):
            upper = _number(critical.get("Reading"))
    return Temperature(
        name=name,
        celsius=celsius,
        place=_place(raw_name, str(item.get("PhysicalContext") or "")),
        upper_critical=upper,
        health=health,
    )


def _items(doc: Json, key: str) -> list[Json]:
    value = doc.get(key)
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


@dataclass(slots=True)
class _Power:
    """What the chassis's Power resources add up to."""

    psus: list[PowerSupply] = field(default_factory=list)
    needed: int | None = None
    redundancy_ok: bool | None = None
    watts: float | None = None


class RedfishBmc:
    """A BMC read over Redfish through ``transport``."""

    def __init__(self, transport: RedfishTransport, address: str) -> None:
        """Nothing is read until :meth:`read`; the chassis and the SEL are found once."""
        self._transport = transport
        self._address = address
        self._chassis: list[str] | None = None
        self._sel: str | None = None
        self._no_sel = False  # the service has no SEL log service: not looked for again

    @property
    def address(self) -> str:
        """The BMC's address."""
        return self._address

    def read(self) -> BmcReading:
        """Every chassis's fans, supplies and temperatures, and the power redundancy."""
        get = self._transport.get
        if self._chassis is None:
            root = get(ROOT)
            collection = _link(root, "Chassis")
            if collection is None:
                msg = "the service root has no Chassis"
                raise BmcError(msg)
            self._chassis = self._members(collection)
        fans: list[Fan] = []
        temps: list[Temperature] = []
        power = _Power()
        for path in self._chassis:
            chassis = get(path)
            self._thermal(chassis, fans, temps)
            self._power(chassis, power)
        return BmcReading(
            fans=tuple(fans),
            psus=tuple(power.psus),
            temperatures=tuple(temps),
            psus_needed=power.needed,
            redundancy_ok=power.redundancy_ok,
            power_watts=power.watts,
        )

    def _power(self, chassis: Json, into: _Power) -> None:
        get = self._transport.get
        power_path = _link(chassis, "Power")
        if power_path is None:
            sub = _link(chassis, "PowerSubsystem")
            supplies = _link(get(sub), "PowerSupplies") if sub is not None else None
            for member in self._members(supplies) if supplies else []:
                into.psus.append(parse_psu(get(member), len(into.psus)))
            return
        power = get(power_path)
        into.psus.extend(parse_psu(p, len(into.psus)) for p in _items(power, "PowerSupplies"))
        for group in _items(power, "Redundancy"):
            health, _ = _status(group)
            ok = health == Health.OK
            into.redundancy_ok = ok if into.redundancy_ok is None else into.redundancy_ok and ok
            low = _number(group.get("MinNumNeeded"))
            if low is not None:
                into.needed = int(low) + (into.needed or 0)
        for control in _items(power, "PowerControl"):
            used = _number(control.get("PowerConsumedWatts"))
            if used is not None:
                into.watts = used + (into.watts or 0.0)

    def _thermal(self, chassis: Json, fans: list[Fan], temps: list[Temperature]) -> None:
        get = self._transport.get
        thermal = _link(chassis, "Thermal")
        if thermal is not None:
            doc = get(thermal)
            fans.extend(parse_fan(f, len(fans)) for f in _items(doc, "Fans"))
            temps.extend(parse_temperature(t, len(temps)) for t in _items(doc, "Temperatures"))
            return
        sub = _link(chassis, "ThermalSubsystem")
        if sub is not None:
            collection = _link(get(sub), "Fans")
            for member in self._members(collection) if collection else []:
                fans.append(parse_fan(get(member), len(fans)))
        sensors = _link(chassis, "Sensors")
        for member in self._members(sensors) if sensors else []:
            sensor = get(member)
            if sensor.get("ReadingType") == "Temperature":
                temps.append(parse_temperature(sensor, len(temps)))

    def read_sel(self, after: int | None) -> SelRead:
        """The SEL's entries past ``after`` (none, for a service that has no SEL)."""
        if self._no_sel:
            return SelRead([], 0)
        if self._sel is None:
            self._sel = self._find_sel()
            if not self._sel:
                self._no_sel = True
                log.info("bmc_has_no_sel", bmc=self._address)
                return SelRead([], 0)
        entries: list[SelEntry] = []
        for doc in self._pages(self._sel):
            entries.extend(entry for entry in map(parse_sel_entry, _items(doc, "Members")) if entry)
        return new_entries(entries, after)

    def _find_sel(self) -> str:
        """The SEL's ``Entries`` path; "" when the service has none (it answered, without one)."""
        get = self._transport.get
        root = get(ROOT)
        for owner in ("Managers", "Systems"):
            collection = _link(root, owner)
            for member in self._members(collection) if collection else []:
                services = _link(get(member), "LogServices")
                for service_path in self._members(services) if services else []:
                    service = get(service_path)
                    is_sel = service.get("Id") == "SEL" or service.get("LogEntryType") == "SEL"
                    entries = _link(service, "Entries")
                    if is_sel and entries is not None:
                        return entries
        return ""

    def _members(self, path: str) -> list[str]:
        found: list[str] = []
        for doc in self._pages(path):
            for member in _items(doc, "Members"):
                target = member.get("@odata.id")
                if isinstance(target, str) and target.startswith("/"):
                    found.append(target)
        return found

    def _pages(self, path: str) -> list[Json]:
        pages: list[Json] = []
        next_path: str | None = path
        while next_path is not None and len(pages) < MAX_PAGES:
            doc = self._transport.get(next_path)
            pages.append(doc)
            link = doc.get("Members@odata.nextLink")
            next_path = link if isinstance(link, str) and link.startswith("/") else None
        return pages


def parse_sel_entry(item: Json) -> SelEntry | None:
    """A ``LogEntry``; None for one without a numeric ``Id`` (it cannot be ordered).

    Its sensor is the ``SensorType`` (with the ``SensorNumber`` where given), not its ``Name``,
    which BMCs fill with the same words for every entry ("Log Entry", "SEL Entry").
    """
    raw_id = str(item.get("Id"))
    if len(raw_id) > MAX_SEL_ID_CHARS:
        return None
    try:
        key = int(raw_id, 0)
    except ValueError:
        return None
    severity = _SEVERITY.get(str(item.get("Severity") or "OK"), Severity.WARNING)
    sensor_type = _text(item.get("SensorType") or "", 64)
    sensor = sensor_type or "SEL"
    number = item.get("SensorNumber")
    if isinstance(number, int) and not isinstance(number, bool):
        sensor = f"{sensor_type or 'sensor'} #0x{number:02x}"
    return SelEntry(
        key=key,
        severity=severity,
        sensor=sensor[:64],
        message=_text(item.get("Message") or item.get("EntryCode") or "", 200),
        created=_text(item.get("Created") or "", 40),
        sensor_type=sensor_type[:40],
    )


def _text(value: object, limit: int) -> str:
    r"""``value`` as at most ``limit`` characters that UTF-8, and so an event's detail, can hold.

    JSON's ``\ud800`` escape decodes to a lone surrogate, which no UTF-8 string holds: the event
    made of the entry would be refused whole. Each becomes U+FFFD and the rest is kept.
    """
    return _SURROGATE.sub("\ufffd", str(value)[:limit])
