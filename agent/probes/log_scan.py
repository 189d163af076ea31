"""Saved kernel logs scanned after the fact: the agent's parsers over ``dmesg``, journal, syslog.

What on-call runs over a node's logs (``fleetwatch scan``). Each line's prefix is taken off
first, in whichever of the forms the tools write:

* ``dmesg``: ``[ 1234.567890] text``; ``dmesg -T``: ``[Tue Nov 25 01:02:03 2026] text``;
  ``dmesg -x``: ``kern  :err   : `` in front of either; ``dmesg -H``: ``[Nov25 01:02] text``
  then ``[  +0.000012] text`` for the lines after it (those take the time of the last full
  one); a kernel built with ``CONFIG_PRINTK_CALLER``: ``[   36.117975][  T291] text``;
* ``journalctl -k`` (``-o short``, the default): ``Nov 25 01:02:03 host kernel: text``, the
  month as the locale writes it (``фев 12``, ``jan. 29``);
  ``-o short-precise``: ``Nov 25 01:02:03.123456 host kernel: text``; ``-o short-iso`` and
  ``short-iso-precise``: ``2026-11-25T01:02:03+0000 host kernel: text``; ``-o short-monotonic``:
  ``[ 1234.567890] host kernel: text``;
* syslog files (rsyslog's traditional and RFC 3339 forms, as the journal's), which may keep the
  kernel's own ``[ 123.456]`` after ``kernel:``; lines of other programs are skipped;
* ``/dev/kmsg`` records (``6,1234,5678,-;text``).

Journal markers (``-- Boot ... --``, ``-- No entries --``) are skipped. Then every line goes
through the same parsers as the agent's (:mod:`agent.probes.xid`, :mod:`agent.probes.aer`,
:mod:`agent.probes.kernel_hw`), and what they find is folded per host, kind, component and
number (an Xid, an SXid, an AER severity), with the first and last time it was seen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from agent.probes.aer import AerSeverity, aer_detail, group_reports, parse_aer_line
from agent.probes.kernel_hw import AerOutcome, parse_hw_line
from agent.probes.xid import parse_xid_line
from fleetwatch.model import EventKind

if TYPE_CHECKING:
    from collections.abc import Iterable

    from agent.probes.aer import AerLine, AerReport
    from rules.xid_catalog import XidCatalog

__all__ = ["Finding", "LogLine", "LogScanner", "split_prefix"]

XID_FALLEN_OFF_BUS: Final = 79
# A month as strftime's %b writes it in any locale: Nov, фев, janv., Mär (letters, maybe a dot).
_MONTH: Final = r"[^\W\d_]{2,8}\.?"
# journalctl -o short / short-precise, traditional syslog: "Nov 25 01:02:03[.123456] host ".
_SHORT: Final = rf"{_MONTH} [ 0-3]\d \d\d:\d\d:\d\d(?:\.\d+)?"
# journalctl -o short-iso[-precise], RFC 3339 syslog: "2026-11-25T01:02:03[.123456]+0000 host ".
_ISO: Final = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"
_SYSLOG: Final = re.compile(
    rf"(?P<when>{_SHORT}|{_ISO}) (?P<host>\S+) (?P<ident>[^\s:\[]+)(?:\[\d+\])?: ?(?P<text>.*)"
)
_DMESG_LEVEL: Final = re.compile(r"[a-z]+\s*:[a-z]+\s*: ")  # dmesg -x
# dmesg: "[ 1234.567890] "; dmesg -T: "[Tue Nov 25 01:02:03 2026] "; dmesg -H: "[Nov25 01:02] "
# and "[  +0.000012] "; then CONFIG_PRINTK_CALLER's "[  T291] " or "[   C3] ".
_DMESG: Final = re.compile(
    rf"\[(?P<when>\s*\+?\d{{1,12}}\.\d{{1,9}}|[^\W\d_]{{2,8}}\.? {_MONTH} [ 0-3]\d \d\d:\d\d:\d\d "
    rf"\d{{4}}|{_MONTH} ?[ 0-3]?\d \d\d:\d\d)\](?:\[ *[TC]\d{{1,9}}\])? ?(?P<text>.*)"
)
_KMSG: Final = re.compile(r"\d{1,9},\d{1,20},(?P<usec>\d{1,20}),[^;]*;(?P<text>.*)")
# journalctl -o short-monotonic: "host kernel: " or "host program[pid]: " after the time (a
# kernel line such as "EDAC MC1: ..." has neither form).
_MONOTONIC_HOST: Final = re.compile(
    r"(?P<host>[A-Za-z0-9][\w.-]*) (?:kernel|(?P<program>[\w.@-]+)\[\d+\]): (?P<text>.*)"
)
_JOURNAL_MARKER: Final = re.compile(r"-- .* --$|-- No entries --$")
_KERNEL_IDENTS: Final = frozenset({"kernel", "kern"})
_MAX_LINE: Final = 64 * 1024  # longer is no kernel line: parse its start only
# Consecutive AER lines are folded in blocks of at most this many, so an AER storm of millions of
# lines in a row holds this many in memory, not the storm.
MAX_AER_BLOCK: Final = 10_000
_UNRECOVERED: Final = EventKind.PCIE_AER_UNRECOVERED
_FINAL: Final = frozenset({AerOutcome.FAILED, AerOutcome.RECOVERED})


@dataclass(frozen=True, slots=True)
class LogLine:
    """A kernel line without its prefix: when it was logged (as the file says), on which host."""

    when: str
    host: str
    text: str


def split_prefix(raw: str) -> LogLine | None:
    """Take the prefix off one saved line; None for a line that is no kernel line."""
    line = raw.rstrip("\r\n")[:_MAX_LINE]
    if not line.strip() or _JOURNAL_MARKER.match(line):
        return None
    when, host = "", ""
    if (m := _SYSLOG.match(line)) is not None:
        if m["ident"] not in _KERNEL_IDENTS:
            return None
        when, host, line = m["when"], m["host"], m["text"]
    elif (m := _KMSG.match(line)) is not None:
        when, line = f"{int(m['usec']) / 1e6:.6f}", m["text"]
    line = line.removeprefix("kernel: ") if not host else line
    if (m := _DMESG_LEVEL.match(line)) is not None:
        line = line[m.end() :]
    if (m := _DMESG.match(line)) is not None:
        # syslog keeps the kernel's own seconds since boot after its wall-clock time
        when = when or m["when"].strip()
        line = m["text"]
        if not host and (m := _MONOTONIC_HOST.fullmatch(line)) is not None:
            # journalctl -o short-monotonic: the host and identifier follow the time
            if m["program"] is not None:
                return None
            host, line = m["host"], m["text"]
    return LogLine(when, host, line)


@dataclass(slots=True)
class Finding:
    """One kind of fault on one component, folded over the lines that showed it."""

    host: str
    kind: str
    component: str
    detail: str  # the first line's (what the event would carry)
    first: str
    last: str
    count: int = 1
    number: int | None = None  # the Xid or SXid
    name: str = ""  # the Xid catalog's name and class, for an Xid

    def as_dict(self) -> dict[str, object]:
        """The finding as JSON-ready data."""
        return {
            "host": self.host,
            "kind": self.kind,
            "component": self.component,
            "number": self.number,
            "name": self.name,
            "count": self.count,
            "first": self.first,
            "last": self.last,
            "detail": self.detail,
        }


@dataclass(slots=True)
class _AerBlock:
    """Consecutive AER lines of one host, and when the first was logged."""

    host: str
    when: str
    lines: list[AerLine] = field(default_factory=list)


class LogScanner:
    """Feed it a saved log line by line; :meth:`findings` says what faults it showed."""

    def __init__(self, catalog: XidCatalog) -> None:
        """Nothing read yet."""
        self._catalog = catalog
        self._found: dict[tuple[str, str, str, str], Finding] = {}
        self._block: _AerBlock | None = None
        self._last_uncorrectable: dict[str, tuple[str, str]] = {}  # host -> (device, detail)
        self.lines = 0
        self.kernel_lines = 0
        self.unparsed = 0  # lines a parser refused (a 5,000-digit number, say); the rest go on
        self.first_unparsed: tuple[int, str] | None = None  # (line number, why)
        self._full_when = ""  # dmesg -H: the last full time, for the "+0.000012" lines after it

    def feed_all(self, lines: Iterable[str]) -> None:
        """Feed every line of a file."""
        for line in lines:
            self.feed(line)

    def feed(self, raw: str) -> None:
        """Read one saved line; one a parser refuses is counted in :attr:`unparsed`."""
        self.lines += 1
        try:
            self._feed(raw)
        except (ValueError, OverflowError, RecursionError) as exc:
            self.unparsed += 1
            if self.first_unparsed is None:
                self.first_unparsed = (self.lines, str(exc)[:200])

    def _feed(self, raw: str) -> None:
        line = split_prefix(raw)
        if line is None:
            return
        self.kernel_lines += 1
        if line.when.startswith("+"):
            line = LogLine(self._full_when or line.when, line.host, line.text)
        elif line.when:
            self._full_when = line.when
        aer = parse_aer_line(line.text)
        if aer is not None:
            block = self._block
            if block is None or block.host != line.host or len(block.lines) >= MAX_AER_BLOCK:
                self._flush_aer()
                block = self._block = _AerBlock(line.host, line.when)
            block.lines.append(aer)
            return
        self._flush_aer()
        xid = parse_xid_line(line.text)
        if xid is not None:
            self._xid(line, xid.pci_bus_id, xid.xid, xid.text)
            return
        hw = parse_hw_line(line.text)
        if hw is None:
            return
        if hw.outcome is not None:
            self._outcome(line, hw.device, hw.outcome, hw.text)
            return
        component = hw.device or "node"
        number = hw.code if hw.kind in (EventKind.SXID, EventKind.SXID_FATAL) else None
        self._add(line.host, hw.kind, component, hw.text, line.when, number=number)

    def findings(self) -> list[Finding]:
        """Everything found so far, in the order first seen."""
        self._flush_aer()
        return list(self._found.values())

    def _add(  # noqa: PLR0913 - one finding's parts
        self,
        host: str,
        kind: str,
        component: str,
        detail: str,
        when: str,
        *,
        number: int | None = None,
        sub: str = "",
        name: str = "",
    ) -> None:
        key = (host, kind, component, sub or ("" if number is None else str(number)))
        seen = self._found.get(key)
        if seen is None:
            self._found[key] = Finding(
                host, kind, component, detail, when, when, number=number, name=name
            )
        else:
            seen.count += 1
            seen.last = when or seen.last

    def _xid(self, line: LogLine, bus_id: str, xid: int, text: str) -> None:
        kind = EventKind.GPU_LOST if xid == XID_FALLEN_OFF_BUS else EventKind.XID
        entry = self._catalog.get(xid)
        name = f"{entry.name} ({entry.xid_class}, {entry.action})" if entry else "not in catalog"
        self._add(line.host, kind, bus_id, text, line.when, number=xid, name=name)

    def _outcome(self, line: LogLine, device: str, outcome: AerOutcome, text: str) -> None:
        last = self._last_uncorrectable.get(line.host)
        if outcome in _FINAL:
            self._last_uncorrectable.pop(line.host, None)
        if not outcome.unrecovered:
            return
        component, after = last or (device, "")
        detail = f"{outcome}: {text}" + (f"; after {after}" if after else "")
        self._add(line.host, _UNRECOVERED, component or "node", detail, line.when)

    def _flush_aer(self) -> None:
        block, self._block = self._block, None
        if block is None:
            return
        for report in group_reports([*block.lines, None]):
            self._aer_report(block, report)

    def _aer_report(self, block: _AerBlock, report: AerReport) -> None:
        device = report.device_bus_id
        if device is None:
            return
        severity = report.severity.value if report.severity else "unknown"
        detail = aer_detail([report])
        if report.severity is not AerSeverity.CORRECTABLE:
            self._last_uncorrectable[block.host] = (device, detail)
        self._add(block.host, EventKind.PCIE_AER, device, detail, block.when, sub=severity)
