"""PCIe AER lines in the kernel log (``drivers/pci/pcie/aer.c``), parsed by pure functions.

One AER report is several log lines. The port that received the error message names the source,
then the device whose AER registers were read prints the details::

    pcieport 0000:15:01.0: AER: Corrected error received: 0000:18:00.0
    nvidia 0000:18:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)
    nvidia 0000:18:00.0:   device [10de:2330] error status/mask=00000001/0000e000
    nvidia 0000:18:00.0:    [ 0] RxErr                  (First)

Kernels word these lines differently, and every variant is accepted: ``AER: `` in front of every
line or only some; ``Corrected``/``Uncorrected`` (older) or ``Correctable``/``Uncorrectable``
(newer); ``error received:`` (older) or ``error message received from`` (newer); ``id=00e8``
instead of a bus id (3.x). The firmware-first (APEI/GHES) path prints ``aer_status:``,
``aer_layer=`` and ``aer_uncor_severity:`` lines instead. Newer kernels also rate limit these
lines and say ``aer_ratelimit: 30 callbacks suppressed``, so count errors from sysfs and use the
log for context.

:func:`parse_aer_line` turns one line into an :class:`AerLine` (or None), and
:func:`group_reports` folds consecutive lines into one :class:`AerReport` per device and error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from agent.probes.pci import normalize_bus_id
from fleetwatch.wire.validate import MAX_DETAIL

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = [
    "AerAgent",
    "AerLayer",
    "AerLine",
    "AerLineKind",
    "AerReport",
    "AerSeverity",
    "aer_detail",
    "group_reports",
    "parse_aer_line",
]


class AerLineKind(StrEnum):
    """Which of the AER log lines a line is."""

    SOURCE = "source"  # a port received an error message from a device
    ERROR = "error"  # "PCIe Bus Error: severity=..., type=..., (... ID)" or "aer_layer=..."
    STATUS = "status"  # "device [vvvv:dddd] error status/mask=..." or "aer_status: ..."
    BIT = "bit"  # one set bit of the status register: "[ 0] RxErr (First)"
    TLP_HEADER = "tlp_header"  # the header of the TLP behind an uncorrectable error
    UNCOR_SEVERITY = "uncor_severity"  # firmware-first: which uncorrectable errors are fatal
    REPORTED_FIRST = "reported_first"  # of several devices, this one reported first
    NO_DETAILS = "no_details"  # the port found no device with the error logged
    SUPPRESSED = "suppressed"  # the kernel's rate limiter dropped this many AER messages


class AerSeverity(StrEnum):
    """Severity, named like the sysfs counter files (``aer_dev_correctable``, ...)."""

    CORRECTABLE = "correctable"
    NONFATAL = "nonfatal"
    FATAL = "fatal"


class AerLayer(StrEnum):
    """The layer the kernel blames (``type=`` in the log)."""

    PHYSICAL = "physical"
    DATA_LINK = "data_link"
    TRANSACTION = "transaction"
    INACCESSIBLE = "inaccessible"  # the device's AER registers could not be read


class AerAgent(StrEnum):
    """The role of the device that logged the error."""

    RECEIVER = "receiver"
    REQUESTER = "requester"
    COMPLETER = "completer"
    TRANSMITTER = "transmitter"
    UNREGISTERED = "unregistered"


@dataclass(frozen=True, slots=True)
class AerLine:
    """One AER log line; fields its kind does not carry are None.

    ``reporter_bus_id`` is the device that printed the line (its ``driver bdf:`` prefix) and
    ``driver`` the driver name in that prefix. ``device_bus_id`` is the device the error is
    about: the error source a port names in ``SOURCE`` and ``NO_DETAILS`` lines, else the
    printing device itself. Bus ids are normalised with :func:`agent.probes.pci.normalize_bus_id`.
    """

    kind: AerLineKind
    text: str
    reporter_bus_id: str | None = None
    device_bus_id: str | None = None
    driver: str | None = None
    severity: AerSeverity | None = None
    error_type: AerLayer | None = None
    agent: AerAgent | None = None
    multiple: bool = False
    vendor_id: int | None = None
    device_id: int | None = None
    status: int | None = None
    mask: int | None = None
    bit: int | None = None
    bit_name: str | None = None
    first: bool = False
    tlp_header: str | None = None
    uncor_severity: int | None = None
    suppressed: int | None = None


@dataclass(frozen=True, slots=True)
class AerReport:
    """One AER error of one device, folded from consecutive lines (kept in ``lines``).

    ``reporter_bus_id`` is the port that received the error message, when its line was seen.
    ``errors`` are the names of the set status bits in log order; ``first_error`` the one the
    device flagged ``(First)``.
    """

    device_bus_id: str | None
    reporter_bus_id: str | None = None
    severity: AerSeverity | None = None
    error_type: AerLayer | None = None
    agent: AerAgent | None = None
    multiple: bool = False
    vendor_id: int | None = None
    device_id: int | None = None
    status: int | None = None
    mask: int | None = None
    errors: tuple[str, ...] = ()
    first_error: str | None = None
    tlp_header: str | None = None
    lines: tuple[str, ...] = ()


_BDF = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
_SEVERITY = r"Uncorrect(?:ed|able) \((?:Non-)?Fatal\)|Correct(?:ed|able)"
_TIMESTAMP: Final = re.compile(r"\[\s*\d+\.\d+\]\s?")  # when the text comes from dmesg
# "driver 0000:18:00.0: " (3.x printed the port service device "0000:00:03.0:pcie02"), "AER: ".
_PREFIX: Final = re.compile(
    rf"(?:(?P<driver>[\w.-]+) (?P<bdf>{_BDF})(?::pcie\d+)?: )?(?:AER: )?",
)
_SUPPRESSED: Final = re.compile(r"aer_\w+: (?P<n>\d{1,20}) callbacks suppressed")
_SOURCE: Final = re.compile(
    rf"(?P<multi>Multiple )?(?P<sev>{_SEVERITY}) error (?:received:|message received from) "
    rf"(?:(?P<bdf>{_BDF})|id=(?P<id>[0-9A-Fa-f]{{4}}))(?: \(no details found\))?",
)
_ERROR: Final = re.compile(
    r"PCIe Bus Error: severity=(?P<sev>[^,]+), type=(?P<type>[^,]+), "
    r"(?:id=[0-9A-Fa-f]{4})?\((?P<agent>[^)]+)\)",
)
_CPER_LAYER: Final = re.compile(r"aer_layer=(?P<type>[^,]+), aer_agent=(?P<agent>.+)")
_STATUS: Final = re.compile(
    r"\s*device \[(?P<vendor>[0-9A-Fa-f]{4}):(?P<device>[0-9A-Fa-f]{4})\] "
    r"error status/mask=(?P<status>[0-9A-Fa-f]{8})/(?P<mask>[0-9A-Fa-f]{8})",
)
_CPER_STATUS: Final = re.compile(
    r"aer_status: 0x(?P<status>[0-9A-Fa-f]{8}), aer_mask: 0x(?P<mask>[0-9A-Fa-f]{8})",
)
_BIT: Final = re.compile(
    r"\s+\[\s*(?P<bit>3[01]|[12]?\d)\] (?P<name>.*?\S)\s*(?P<first>\(First\))?"
)
_TLP: Final = re.compile(r"\s*TLP Header: (?P<header>[0-9A-Fa-fx ]*[0-9A-Fa-f])")
_UNCOR_SEVERITY: Final = re.compile(r"aer_uncor_severity: 0x(?P<value>[0-9A-Fa-f]{8})")
_REPORTED_FIRST: Final = re.compile(r"\s*Error of this Agent is reported first")
_NO_DETAILS: Final = re.compile(
    rf"found no error details for (?P<bdf>{_BDF})|can't find device of ID(?P<id>[0-9A-Fa-f]{{4}})",
)

_LAYERS: Final = {
    "physical layer": AerLayer.PHYSICAL,
    "data link layer": AerLayer.DATA_LINK,
    "transaction layer": AerLayer.TRANSACTION,
    "inaccessible": AerLayer.INACCESSIBLE,
    "unaccessible": AerLayer.INACCESSIBLE,  # the spelling of kernels before 4.17
}
_AGENTS: Final = {
    "receiver id": AerAgent.RECEIVER,
    "requester id": AerAgent.REQUESTER,
    "completer id": AerAgent.COMPLETER,
    "transmitter id": AerAgent.TRANSMITTER,
    "unregistered agent id": AerAgent.UNREGISTERED,
}


@dataclass(frozen=True, slots=True)
class _Prefix:
    """What the ``driver bdf:`` prefix says about a line."""

    text: str
    reporter: str | None
    driver: str | None

    def line(self, kind: AerLineKind, severity: AerSeverity | None = None) -> AerLine:
        """A line of ``kind`` printed by this prefix's device, about that device."""
        return AerLine(kind, self.text, self.reporter, self.reporter, self.driver, severity)


def parse_aer_line(text: str) -> AerLine | None:
    """Return the AER line in ``text``, or None when it is not one; never raises.

    ``text`` is a kernel log message (``KmsgRecord.text``); a leading dmesg timestamp is
    allowed. A line naming a bus id that cannot be normalised (a VMD domain above ffff) is None.
    """
    text = text.strip()
    stamp = _TIMESTAMP.match(text)
    body = text[stamp.end() :] if stamp else text
    suppressed = _SUPPRESSED.fullmatch(body)
    if suppressed is not None:
        return AerLine(AerLineKind.SUPPRESSED, text, suppressed=int(suppressed["n"]))
    prefix = _PREFIX.match(body)
    if prefix is None:  # pragma: no cover - every part of the prefix is optional
        return None
    reporter = _bus_id(prefix["bdf"]) if prefix["bdf"] else None
    if prefix["bdf"] and reporter is None:
        return None
    ctx = _Prefix(text, reporter, prefix["driver"])
    body = body[prefix.end() :]
    # Only the port's SOURCE line says enough on its own; "[ 0] RxErr" needs the device prefix.
    parsers = _DETAIL_PARSERS if reporter else (_source,)
    for parse in parsers:
        line = parse(body, ctx)
        if line is not None:
            return line
    return None


def group_reports(lines: Iterable[AerLine | None]) -> list[AerReport]:
    """Fold consecutive AER lines into one report per device and error, in log order.

    Pass ``parse_aer_line`` of every log line: None (a line that is not AER) ends the open report
    and forgets the port's ``SOURCE`` line, so a later report is not lent a port it never came
    through. A ``SOURCE`` line lends its port, severity and "Multiple" to the details that
    follow; a ``SOURCE`` line whose details never came (rate limited, or no details found) is a
    report on its own. ``STATUS``, ``BIT`` and ``TLP_HEADER`` lines join the open report of the
    same device, and so do ``UNCOR_SEVERITY`` and ``REPORTED_FIRST`` lines and an ``ERROR`` line
    that follows its status (the firmware-first order). ``NO_DETAILS`` and ``SUPPRESSED`` lines
    carry no error of their own and are skipped.
    """
    reports: list[AerReport] = []
    source: AerLine | None = None
    source_used = False
    current: _Builder | None = None
    for line in lines:
        if line is None or line.kind is AerLineKind.SOURCE:
            _flush(current, reports)
            if source is not None and not source_used:
                reports.append(_Builder.start(source.device_bus_id, source).build())
            source, source_used, current = line, False, None
            continue
        if line.kind not in _STARTING_KINDS and line.kind not in _JOINING_KINDS:
            continue
        joins = current is not None and current.device_bus_id == line.reporter_bus_id
        if line.kind is AerLineKind.ERROR and current is not None and current.error_seen:
            joins = False
        if joins and current is not None:
            current.add(line)
        elif line.kind in _STARTING_KINDS:
            _flush(current, reports)
            lends = source is not None and (
                not source_used or source.multiple or source.device_bus_id == line.reporter_bus_id
            )
            current = _Builder.start(line.reporter_bus_id, source if lends else None)
            current.add(line)
            source_used = source_used or lends
    _flush(current, reports)
    if source is not None and not source_used:
        reports.append(_Builder.start(source.device_bus_id, source).build())
    return reports


def _bus_id(text: str) -> str | None:
    try:
        return normalize_bus_id(text)
    except ValueError:
        return None


def _requester_bus_id(reporter: str | None, requester_id: str) -> str:
    """Turn a 16-bit requester id (bus << 8 | devfn) into a bus id in the reporter's domain."""
    value = int(requester_id, 16)
    domain = reporter.split(":", 1)[0] if reporter else "0000"
    return f"{domain}:{value >> 8:02x}:{(value >> 3) & 0x1F:02x}.{value & 0x7}"


def _severity(text: str) -> AerSeverity | None:
    words = text.strip().lower()
    if words in ("corrected", "correctable"):
        return AerSeverity.CORRECTABLE
    if words in ("uncorrected (non-fatal)", "uncorrectable (non-fatal)"):
        return AerSeverity.NONFATAL
    if words in ("uncorrected (fatal)", "uncorrectable (fatal)"):
        return AerSeverity.FATAL
    return None


def _source(body: str, ctx: _Prefix) -> AerLine | None:
    match = _SOURCE.fullmatch(body)
    if match is None:
        return None
    device = _named_device(ctx, match["bdf"], match["id"])
    if device is None:
        return None
    line = ctx.line(AerLineKind.SOURCE, severity=_severity(match["sev"]))
    return replace(line, device_bus_id=device, multiple=bool(match["multi"]))


def _error(body: str, ctx: _Prefix) -> AerLine | None:
    match = _ERROR.fullmatch(body)
    severity = _severity(match["sev"]) if match else None
    match = match or _CPER_LAYER.fullmatch(body)
    if match is None:
        return None
    layer = _LAYERS.get(match["type"].strip().lower())
    agent = _AGENTS.get(match["agent"].strip().lower())
    return replace(ctx.line(AerLineKind.ERROR, severity), error_type=layer, agent=agent)


def _status(body: str, ctx: _Prefix) -> AerLine | None:
    match = _STATUS.fullmatch(body)
    ids = (int(match["vendor"], 16), int(match["device"], 16)) if match else (None, None)
    match = match or _CPER_STATUS.fullmatch(body)
    if match is None:
        return None
    status, mask = int(match["status"], 16), int(match["mask"], 16)
    line = ctx.line(AerLineKind.STATUS)
    return replace(line, vendor_id=ids[0], device_id=ids[1], status=status, mask=mask)


def _bit(body: str, ctx: _Prefix) -> AerLine | None:
    match = _BIT.fullmatch(body)
    if match is None:
        return None
    bit, first = int(match["bit"]), bool(match["first"])
    return replace(ctx.line(AerLineKind.BIT), bit=bit, bit_name=match["name"], first=first)


def _tlp(body: str, ctx: _Prefix) -> AerLine | None:
    match = _TLP.fullmatch(body)
    return replace(ctx.line(AerLineKind.TLP_HEADER), tlp_header=match["header"]) if match else None


def _uncor_severity(body: str, ctx: _Prefix) -> AerLine | None:
    match = _UNCOR_SEVERITY.fullmatch(body)
    if match is None:
        return None
    return replace(ctx.line(AerLineKind.UNCOR_SEVERITY), uncor_severity=int(match["value"], 16))


def _reported_first(body: str, ctx: _Prefix) -> AerLine | None:
    matched = _REPORTED_FIRST.fullmatch(body) is not None
    return ctx.line(AerLineKind.REPORTED_FIRST) if matched else None


def _no_details(body: str, ctx: _Prefix) -> AerLine | None:
    match = _NO_DETAILS.fullmatch(body)
    if match is None:
        return None
    device = _named_device(ctx, match["bdf"], match["id"])
    return (
        None if device is None else replace(ctx.line(AerLineKind.NO_DETAILS), device_bus_id=device)
    )


def _named_device(ctx: _Prefix, bdf: str | None, requester_id: str | None) -> str | None:
    """The error source a port names, as a bus id or (3.x) a 16-bit requester id."""
    if bdf:
        return _bus_id(bdf)
    if requester_id:
        return _requester_bus_id(ctx.reporter, requester_id)
    return None  # pragma: no cover - the patterns require one of the two


_DETAIL_PARSERS: Final[tuple[Callable[[str, _Prefix], AerLine | None], ...]] = (
    _source,
    _error,
    _status,
    _bit,
    _tlp,
    _uncor_severity,
    _reported_first,
    _no_details,
)
_STARTING_KINDS: Final = frozenset({AerLineKind.ERROR, AerLineKind.STATUS, AerLineKind.BIT})
_JOINING_KINDS: Final = frozenset(
    {AerLineKind.TLP_HEADER, AerLineKind.UNCOR_SEVERITY, AerLineKind.REPORTED_FIRST},
)


@dataclass(slots=True)
class _Builder:
    """A report being folded together."""

    device_bus_id: str | None
    reporter_bus_id: str | None = None
    severity: AerSeverity | None = None
    multiple: bool = False
    error_seen: bool = False
    error_type: AerLayer | None = None
    agent: AerAgent | None = None
    vendor_id: int | None = None
    device_id: int | None = None
    status: int | None = None
    mask: int | None = None
    tlp_header: str | None = None
    uncor_severity: int | None = None
    errors: list[str] = field(default_factory=list)
    first_error: str | None = None
    lines: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, device_bus_id: str | None, source: AerLine | None) -> _Builder:
        """Open a report on ``device_bus_id``, lent the port, severity and lines of ``source``."""
        if source is None:
            return cls(device_bus_id)
        return cls(
            device_bus_id=device_bus_id,
            reporter_bus_id=source.reporter_bus_id,
            severity=source.severity,
            multiple=source.multiple,
            lines=[source.text],
        )

    def add(self, line: AerLine) -> None:
        self.lines.append(line.text)
        if line.kind is AerLineKind.ERROR:
            self.error_seen = True
            self.severity = line.severity or self.severity
            self.error_type, self.agent = line.error_type, line.agent
        elif line.kind is AerLineKind.STATUS:
            self.vendor_id, self.device_id = line.vendor_id, line.device_id
            self.status, self.mask = line.status, line.mask
        elif line.kind is AerLineKind.TLP_HEADER:
            self.tlp_header = line.tlp_header
        elif line.kind is AerLineKind.UNCOR_SEVERITY:
            self.uncor_severity = line.uncor_severity
        elif line.bit_name is not None:
            self.errors.append(line.bit_name)
            if line.first:
                self.first_error = line.bit_name

    def build(self) -> AerReport:
        severity = self.severity
        if severity is None and self.uncor_severity is not None and self.status is not None:
            # The device sends ERR_FATAL for the errors its severity register marks fatal.
            errors = self.status & ~(self.mask or 0)
            fatal = errors & self.uncor_severity
            severity = AerSeverity.FATAL if fatal else AerSeverity.NONFATAL
        return AerReport(
            device_bus_id=self.device_bus_id,
            reporter_bus_id=self.reporter_bus_id,
            severity=severity,
            error_type=self.error_type,
            agent=self.agent,
            multiple=self.multiple,
            vendor_id=self.vendor_id,
            device_id=self.device_id,
            status=self.status,
            mask=self.mask,
            errors=tuple(self.errors),
            first_error=self.first_error,
            tlp_header=self.tlp_header,
            lines=tuple(self.lines),
        )


def _flush(builder: _Builder | None, reports: list[AerReport]) -> None:
    if builder is not None:
        reports.append(builder.build())


def aer_detail(reports: list[AerReport]) -> str:
    """One line for a device's AER reports of one severity in one poll, at most ``MAX_DETAIL``.

    A storm of distinct error names would make it longer than an event may carry (and the event
    would be refused); the line is cut instead, so the event still goes out.
    """
    first = reports[0]
    errors = sorted({e for r in reports for e in r.errors})
    layer = first.error_type.value if first.error_type else "unknown layer"
    parts = [f"AER {first.severity.value if first.severity else 'unknown'}: {layer}"]
    if errors:
        parts.append(", ".join(errors))
    if len(reports) > 1:
        parts.append(f"{len(reports)} reports")
    if first.reporter_bus_id and first.reporter_bus_id != first.device_bus_id:
        parts.append(f"reported by {first.reporter_bus_id}")
    detail = "; ".join(parts)
    return detail if len(detail) <= MAX_DETAIL else detail[: MAX_DETAIL - 3] + "..."
