"""The kernel log: Xid lines (merged with NVML's Xid events), PCIe AER reports, other hardware.

A cursor (the last record's sequence number, per boot) lets a restarted agent skip what it has
already reported. AER reports are folded per device and severity within one poll, so an error
storm that the kernel prints line by line becomes one event per poll, with a count. An Xid storm
(the same Xid on the same GPU printed over and over) is coalesced by the merger
(:mod:`agent.probes.xid_merge`): after the first occurrences, one event per window that says how
many it stands for; ``agent_events_coalesced`` counts the occurrences held back.

The node's other hardware lines (:mod:`agent.probes.kernel_hw`: CPU machine checks, filesystem
errors, NVSwitch SXids, the outcome of PCIe error recovery) are folded per kind and component
within one poll: a machine check prints half a dozen lines, a failing disk one per I/O. The
outcome of a recovery is attached to the AER report it follows (in the same poll or an earlier
one); a recovery that failed, or found a driver without error handlers, is an event of its own.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Final, Protocol

import structlog

from agent.exceptions import SourceError
from agent.poll.findings import PendingEvent
from agent.probes.aer import AerSeverity, aer_detail, group_reports, parse_aer_line
from agent.probes.kernel_hw import AerOutcome, HwLine, parse_hw_line
from agent.probes.xid import parse_xid_line
from agent.sources.kmsg_cursor import filter_new
from fleetwatch.model import EventKind, Target
from fleetwatch.wire.repeats import mark_repeats
from fleetwatch.wire.validate import MAX_DETAIL

if TYPE_CHECKING:
    from collections import Counter

    from agent.poll.findings import PollResult
    from agent.probes.aer import AerLine, AerReport
    from agent.probes.xid_merge import XidMerger, XidRepeats
    from agent.sources.kmsg import KmsgSource
    from agent.sources.kmsg_cursor import KmsgCursor
    from agent.sources.nvml import GpuIdentity
    from agent.sources.wakeup import Waker
    from fleetwatch.clock import Clock
    from rules.xid_catalog import XidCatalog

log = structlog.get_logger("agent.kernel_log")

XID_FALLEN_OFF_BUS: Final = 79
_FINAL: Final = frozenset({AerOutcome.FAILED, AerOutcome.RECOVERED})


class GpuLost(Protocol):
    """How the poller reports a GPU that fell off the bus (once per loss, by the sampler)."""

    def __call__(
        self,
        gpu: GpuIdentity,
        result: PollResult,
        now_ms: int,
        *,
        xid: int = 0,
        detail: str = "",
    ) -> None:
        """Record the loss."""


def _cut(detail: str) -> str:
    return detail if len(detail) <= MAX_DETAIL else detail[: MAX_DETAIL - 3] + "..."


def repeat_event(
    repeats: XidRepeats, catalog: XidCatalog, *, on_gpu: bool, now_ms: int
) -> PendingEvent:
    """The event of a storm's window, saying how many occurrences it stands for.

    ``on_gpu``: the storm's key is a GPU's UUID (else a PCI bus id NVML does not know).
    """
    target = Target.gpu(repeats.gpu) if on_gpu else Target.pci(repeats.gpu)
    text = repeats.text or f"Xid {repeats.xid}"
    return PendingEvent(
        kind=EventKind.XID,
        target=target,
        time_unix_ms=now_ms,
        xid=repeats.xid,
        xid_class=catalog.class_of(repeats.xid),
        detail=mark_repeats(text, repeats.times, repeats.span_s),
    )


def repeat_events(
    merger: XidMerger,
    catalog: XidCatalog,
    gpus: set[str],
    mono: float,
    now_ms: int,
) -> list[PendingEvent]:
    """The events of every storm window that ended by ``mono`` (``gpus``: the known UUIDs)."""
    return [
        repeat_event(r, catalog, on_gpu=r.gpu in gpus, now_ms=now_ms) for r in merger.flush(mono)
    ]


class KernelLogPoller:
    """Turns new kernel log records into Xid, GPU-lost and AER events."""

    def __init__(
        self,
        kmsg: KmsgSource,
        catalog: XidCatalog,
        merger: XidMerger,
        clock: Clock,
        cursor: KmsgCursor | None = None,
    ) -> None:
        """Start after the cursor's record, when there is one for this boot."""
        self._kmsg = kmsg
        self._catalog = catalog
        self._merger = merger
        self._clock = clock
        self._cursor = cursor
        self._last_seq = cursor.load() if cursor is not None else None
        self._cursor_on_disk = self._last_seq is not None
        # The last uncorrectable AER report (device, detail): what a later recovery outcome
        # line is about.
        self._last_uncorrectable: tuple[str, str] | None = None

    def watch(self, waker: Waker) -> None:
        """Wake the poll loop when new records arrive."""
        self._kmsg.watch(waker)

    @property
    def overruns(self) -> int:
        """Times the kernel overwrote unread records (EPIPE), when the source counts them."""
        return int(getattr(self._kmsg, "overruns", 0))

    def poll(
        self,
        by_bus: dict[str, GpuIdentity],
        gpu_lost: GpuLost,
        result: PollResult,
        now_ms: int,
        errors: Counter[str],
    ) -> None:
        """Read what the kernel logged since the last poll.

        The events made here carry the poll's last record number (``kmsg_seq``), and so does
        ``result``; the cursor file moves only when the agent says the events are durable
        (:meth:`commit`). A crash in between leaves the cursor behind, and the restarted agent
        resumes after the highest ``kmsg_seq`` its outbox restored (:meth:`resume_after`).
        """
        try:
            records = filter_new(self._kmsg.read(), self._last_seq)
        except SourceError as exc:
            errors["kmsg"] += 1
            log.warning("kmsg_read_failed", error=str(exc))
            return
        if records and self._cursor is not None and not self._cursor_on_disk:
            # The first records of this boot: a cursor file must exist before they can be in
            # the outbox, or a restarted agent would read the kernel log from its end and miss
            # what came after them. Just before them is a place that skips nothing unreported.
            self._cursor.save(records[0].seq - 1)
            self._cursor_on_disk = True
        first_event = len(result.events)
        aer_lines: list[AerLine | None] = []
        hw_lines: list[HwLine] = []
        for record in records:
            aer_lines.append(parse_aer_line(record.text))
            line = parse_xid_line(record.text)
            if line is None:
                hw = parse_hw_line(record.text)
                if hw is not None:
                    hw_lines.append(hw)
                continue
            gpu = by_bus.get(line.pci_bus_id)
            if gpu is not None and line.xid == XID_FALLEN_OFF_BUS:
                gpu_lost(gpu, result, now_ms, xid=line.xid, detail=line.text)
                continue
            mono = self._clock.monotonic()
            key = gpu.uuid if gpu is not None else line.pci_bus_id
            if not self._merger.offer("kmsg", key, line.xid, mono, line.text):
                continue
            result.events.append(
                self._xid_event(line.xid, gpu, line.pci_bus_id, line.text, now_ms),
            )
        known = {gpu.uuid for gpu in by_bus.values()}
        result.events.extend(
            repeat_events(self._merger, self._catalog, known, self._clock.monotonic(), now_ms)
        )
        result.samples[Target.node(), "agent_events_coalesced"] = self._merger.coalesced
        outcomes = [h for h in hw_lines if h.outcome is not None]
        self._aer_events(aer_lines, outcomes, by_bus, result, now_ms)
        self._hw_events([h for h in hw_lines if h.outcome is None], result, now_ms)
        if records:
            last = self._last_seq = records[-1].seq
            result.kmsg_seq = last
            made = result.events[first_event:]
            result.events[first_event:] = [replace(e, kmsg_seq=last) for e in made]

    def commit(self, seq: int) -> None:
        """The events of the records up to ``seq`` are durable: move the cursor file there."""
        if self._cursor is not None:
            self._cursor.save(seq)

    def resume_after(self, seq: int) -> None:
        """Skip records up to ``seq`` too (the outbox holds events made from them)."""
        if seq > (self._last_seq or 0):
            log.info("kmsg_resumed_from_outbox", seq=seq, cursor=self._last_seq)
            self._last_seq = seq

    def _xid_event(
        self,
        xid: int,
        gpu: GpuIdentity | None,
        bus_id: str,
        text: str,
        now_ms: int,
    ) -> PendingEvent:
        return PendingEvent(
            kind=EventKind.XID,
            target=Target.gpu(gpu.uuid) if gpu else Target.pci(bus_id),
            time_unix_ms=now_ms,
            xid=xid,
            xid_class=self._catalog.class_of(xid),
            detail=text,
        )

    def _aer_events(
        self,
        lines: list[AerLine | None],
        outcomes: list[HwLine],
        by_bus: dict[str, GpuIdentity],
        result: PollResult,
        now_ms: int,
    ) -> None:
        grouped: defaultdict[tuple[str, str], list[AerReport]] = defaultdict(list)
        if any(lines):
            for report in group_reports(lines):
                if report.device_bus_id is None:
                    continue
                severity = report.severity.value if report.severity else "unknown"
                grouped[report.device_bus_id, severity].append(report)
        recovery = "; ".join(dict.fromkeys(str(o.outcome) for o in outcomes))
        for (bus_id, severity), reports in grouped.items():
            gpu = by_bus.get(bus_id)
            detail = aer_detail(reports)
            if severity != AerSeverity.CORRECTABLE:
                self._last_uncorrectable = (bus_id, detail)
                if recovery:
                    detail = _cut(f"{detail}; recovery: {recovery}")
            result.event(
                EventKind.PCIE_AER,
                Target.gpu(gpu.uuid) if gpu else Target.pci(bus_id),
                now_ms,
                detail,
            )
        failed = [o for o in outcomes if o.outcome is not None and o.outcome.unrecovered]
        # The device the recovery was for: the last uncorrectable report's (the outcome lines
        # name the port above it, or the device itself), else the one the first line names.
        last = self._last_uncorrectable
        if any(o.outcome in _FINAL for o in outcomes):
            self._last_uncorrectable = None  # that recovery is over
        if not failed:
            return
        bus_id, after = last or (failed[0].device, "")
        if not bus_id:
            return
        gpu = by_bus.get(bus_id)
        said = "; ".join(dict.fromkeys(o.text for o in failed))
        result.event(
            EventKind.PCIE_AER_UNRECOVERED,
            Target.gpu(gpu.uuid) if gpu else Target.pci(bus_id),
            now_ms,
            _cut(
                f"AER recovery failed ({recovery}): {said}" + (f"; after {after}" if after else "")
            ),
        )

    def _hw_events(self, lines: list[HwLine], result: PollResult, now_ms: int) -> None:
        """One event per kind and component (and SXid) of this poll, saying how many lines."""
        folded: dict[tuple[EventKind, str, int], list[HwLine]] = {}
        for line in lines:
            folded.setdefault((line.kind, line.device, line.code), []).append(line)
        for (kind, device, code), same in folded.items():
            if kind in (EventKind.SXID, EventKind.SXID_FATAL):
                target = Target.pci(device)
            else:
                target = Target.node_device(device) if device else Target.node()
            detail = same[0].text if len(same) == 1 else f"{same[0].text} ({len(same)} lines)"
            result.events.append(
                PendingEvent(kind, target, now_ms, xid=code, detail=_cut(detail)),
            )
