"""Checks on messages from agents; each failure names what was wrong and why it was refused.

The collector runs these on everything it receives; the agent runs the event check on what it
produces so that a bug of its own cannot wedge its outbox behind an event the collector refuses.
A Report is screened sample by sample (:func:`screen_report`): a sample that breaks the contract
or holds a value that cannot be true (:mod:`fleetwatch.wire.plausible`) is refused on its own and
counted by reason, and the rest of the report is taken.

Exception tree::

    WireError                  (reason: a short label used as a metric label)
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final

from fleetwatch import PROTOCOL_VERSION
from fleetwatch.model import SampleValue, TargetKey, sample_value_from_pb
from fleetwatch.wire.grouped import sample_count
from fleetwatch.wire.plausible import rule_for, value_problem
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
BOOT_ID = re.compile(r"[A-Za-z0-9-]{1,64}")
GPU_UUID = re.compile(r"GPU-[0-9A-Fa-f-]{8,64}")
PCI_BUS_ID = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
DEVICE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SIGNAL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")

MAX_GPUS: Final = 64
MAX_NVLINKS: Final = 64
MAX_IB_PORTS: Final = 128
MAX_SAMPLES: Final = 50_000
MAX_TEXT: Final = 256
MAX_DETAIL: Final = 4096
MAX_XID: Final = 65_535
# An event's numbers are journaled in signed 64-bit columns (SQLite INTEGER, PostgreSQL bigint)
# and read back as JSON by the HTTP API: a sequence number stays below 2^53, where both are exact
# (a node numbering a million events a second would need 285 years to get there). Its other
# integers fit by their wire types (xid, target index: 32 bits; its time: int64, and a time that
# cannot be right is replaced by the time of receipt before it is journaled).
MAX_SEQ: Final = 2**53 - 1
# A node declares a few hundred targets; a stream remembers at most this many as checked.
MAX_CHECKED_TARGETS: Final = 4096

AGENT_EVENT_KINDS: Final = frozenset(
    {
        pb.EVENT_KIND_XID,
        pb.EVENT_KIND_GPU_LOST,
        pb.EVENT_KIND_NVLINK_DOWN,
        pb.EVENT_KIND_NVLINK_UP,
        pb.EVENT_KIND_IB_PORT_DOWN,
        pb.EVENT_KIND_IB_PORT_UP,
        pb.EVENT_KIND_PCI_REMOVED,
        pb.EVENT_KIND_PCIE_AER,
        pb.EVENT_KIND_PCI_RECOVERY,
        pb.EVENT_KIND_IB_DEVICE_ADDED,
        pb.EVENT_KIND_IB_DEVICE_REMOVED,
        # the kernel's other hardware lines; links below their rate
        pb.EVENT_KIND_MACHINE_CHECK,
        pb.EVENT_KIND_MACHINE_CHECK_UNCORRECTED,
        pb.EVENT_KIND_FS_ERROR,
        pb.EVENT_KIND_FS_READ_ONLY,
        pb.EVENT_KIND_SXID,
        pb.EVENT_KIND_SXID_FATAL,
        pb.EVENT_KIND_PCIE_AER_UNRECOVERED,
        pb.EVENT_KIND_IB_RATE_LOW,
        pb.EVENT_KIND_ROCE_GID_MISSING,
        pb.EVENT_KIND_PCIE_LINK_DEGRADED,
        # the node's BMC
        pb.EVENT_KIND_FAN_FAILED,
        pb.EVENT_KIND_FAN_RECOVERED,
        pb.EVENT_KIND_PSU_FAILED,
        pb.EVENT_KIND_PSU_RECOVERED,
        pb.EVENT_KIND_PSU_REDUNDANCY_LOST,
        pb.EVENT_KIND_PSU_REDUNDANCY_RESTORED,
        pb.EVENT_KIND_TEMPERATURE_CRITICAL,
        pb.EVENT_KIND_TEMPERATURE_NORMAL,
        pb.EVENT_KIND_BMC_SEL_ENTRY,
        pb.EVENT_KIND_BMC_SEL_CRITICAL,
    },
)


class WireError(ValueError):
    """A message broke the contract. ``reason`` is a short, bounded label for counting."""

    def __init__(self, reason: str, message: str) -> None:
        """Keep the label apart from the human-readable message."""
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Inventory:
    """What a node declared in its Hello; samples and events may only name these targets."""

    nvlinks_by_gpu: dict[str, int] = field(default_factory=dict)
    ib_ports: frozenset[tuple[str, int]] = frozenset()


def _require(ok: bool, reason: str, message: str) -> None:  # noqa: FBT001 - reads as an assertion
    if not ok:
        raise WireError(reason, message)


def _full(pattern: re.Pattern[str], value: str) -> bool:
    return pattern.fullmatch(value) is not None


def validate_hello(hello: pb.Hello) -> Inventory:
    """Check a Hello and return the inventory it declares."""
    r = "invalid_hello"
    _require(_full(NODE_NAME, hello.node), r, f"node name {hello.node[:80]!r} is not a host name")
    _require(_full(BOOT_ID, hello.boot_id), r, f"boot_id {hello.boot_id[:80]!r} is malformed")
    _require(
        hello.protocol_version == PROTOCOL_VERSION,
        r,
        f"protocol_version {hello.protocol_version} unsupported; this collector speaks "
        f"{PROTOCOL_VERSION}",
    )
    _require(
        hello.resume_seq <= MAX_SEQ,
        r,
        f"resume_seq {hello.resume_seq} out of range: sequence numbers go up to {MAX_SEQ}",
    )
    for name, text in (
        ("agent_version", hello.agent_version),
        ("driver_version", hello.driver_version),
        ("nvml_version", hello.nvml_version),
    ):
        _require(len(text) <= MAX_TEXT, r, f"{name} longer than {MAX_TEXT} characters")
    _require(len(hello.gpus) <= MAX_GPUS, r, f"{len(hello.gpus)} GPUs declared; limit {MAX_GPUS}")
    _require(
        len(hello.ib_ports) <= MAX_IB_PORTS,
        r,
        f"{len(hello.ib_ports)} IB ports declared; limit {MAX_IB_PORTS}",
    )
    nvlinks: dict[str, int] = {}
    indexes: set[int] = set()
    for gpu in hello.gpus:
        _require(_full(GPU_UUID, gpu.uuid), r, f"GPU uuid {gpu.uuid[:80]!r} is malformed")
        _require(gpu.uuid not in nvlinks, r, f"GPU {gpu.uuid} declared twice")
        _require(gpu.index not in indexes, r, f"GPU index {gpu.index} declared twice")
        _require(
            _full(PCI_BUS_ID, gpu.pci_bus_id),
            r,
            f"GPU {gpu.uuid} pci_bus_id {gpu.pci_bus_id[:80]!r} is not dddd:bb:dd.f",
        )
        _require(len(gpu.model) <= MAX_TEXT, r, f"GPU {gpu.uuid} model name too long")
        _require(
            gpu.nvlink_count <= MAX_NVLINKS,
            r,
            f"GPU {gpu.uuid} declares {gpu.nvlink_count} NVLinks; limit {MAX_NVLINKS}",
        )
        nvlinks[gpu.uuid] = gpu.nvlink_count
        indexes.add(gpu.index)
    ports: set[tuple[str, int]] = set()
    for port in hello.ib_ports:
        key = (port.device, port.port)
        _require(_full(DEVICE_NAME, port.device), r, f"IB device {port.device[:80]!r} malformed")
        _require(1 <= port.port <= 255, r, f"IB port {port.device}/{port.port} out of range")  # noqa: PLR2004
        _require(key not in ports, r, f"IB port {port.device}/{port.port} declared twice")
        _require(len(port.rate) <= MAX_TEXT, r, f"IB port {port.device}/{port.port} rate too long")
        _require(len(port.link_layer) <= MAX_TEXT, r, "IB link_layer too long")
        ports.add(key)
    return Inventory(nvlinks_by_gpu=nvlinks, ib_ports=frozenset(ports))


def validate_target(target: pb.Target, inventory: Inventory, reason: str) -> None:
    """Check that a target is well formed and names something the node declared."""
    kind = target.kind
    if kind == pb.TARGET_KIND_NODE:
        _require(
            not target.device or _full(DEVICE_NAME, target.device),
            reason,
            f"node target device {target.device[:80]!r} is malformed",
        )
        return
    if kind in (pb.TARGET_KIND_GPU, pb.TARGET_KIND_NVLINK):
        links = inventory.nvlinks_by_gpu.get(target.gpu_uuid)
        _require(links is not None, reason, f"unknown GPU {target.gpu_uuid[:80]!r}")
        if kind == pb.TARGET_KIND_NVLINK:
            _require(
                links is not None and target.index < links,
                reason,
                f"GPU {target.gpu_uuid} has no NVLink {target.index} (it declared {links})",
            )
        return
    if kind == pb.TARGET_KIND_IB_PORT:
        _require(
            (target.device, target.index) in inventory.ib_ports,
            reason,
            f"unknown IB port {target.device[:80]!r}/{target.index}",
        )
        return
    if kind == pb.TARGET_KIND_PCI:
        _require(
            _full(PCI_BUS_ID, target.device),
            reason,
            f"PCI target {target.device[:80]!r} is not dddd:bb:dd.f",
        )
        return
    raise WireError(reason, f"target kind {kind} is not allowed")


@dataclass(slots=True)
class ScreenedReport:
    """A report's samples split into those taken and those refused, with the reasons."""

    # (target key, signal, value) of each sample taken, in order
    accepted: list[tuple[TargetKey, str, SampleValue]] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    # the first refusal of each reason, in words, for the log
    examples: dict[str, str] = field(default_factory=dict)
    count: int = 0  # the samples the report carried, taken or not


def sample_problem(sample: pb.Sample, inventory: Inventory) -> tuple[str, str] | None:
    """(reason, message) when one sample breaks the contract, else None.

    Reasons: ``bad_signal``, ``bad_target``, ``no_value``, ``not_finite``, ``text_too_long``.
    """
    if not _full(SIGNAL_NAME, sample.signal):
        return "bad_signal", f"signal name {sample.signal[:80]!r} is not snake_case"
    try:
        validate_target(sample.target, inventory, "bad_target")
    except WireError as exc:
        return "bad_target", f"sample {sample.signal}: {exc}"
    which = sample.WhichOneof("value")
    if which is None:
        return "no_value", f"sample {sample.signal} has no value"
    if which == "real_value" and not math.isfinite(sample.real_value):
        return "not_finite", f"sample {sample.signal} value {sample.real_value} is not finite"
    if which == "text_value" and len(sample.text_value) > MAX_TEXT:
        return "text_too_long", f"sample {sample.signal} text longer than {MAX_TEXT} characters"
    return None


def _check_size(report: pb.Report) -> int:
    """Raise when a Report is too large to be one; else return its number of ungrouped samples.

    Grouped samples are counted as they are screened (a Report's bytes bound the work, and
    nothing of a Report is applied before all of it is screened).
    """
    count = len(report.samples)
    _require(
        count <= MAX_SAMPLES,
        "invalid_report",
        f"{count} samples in one report; limit {MAX_SAMPLES}",
    )
    _require(
        len(report.targets) <= MAX_SAMPLES,
        "invalid_report",
        f"{len(report.targets)} target groups in one report; limit {MAX_SAMPLES}",
    )
    return count


def column_problem(signal: str, value: SampleValue) -> tuple[str, str] | None:
    """(reason, message) when one grouped sample breaks the contract, else None.

    The grouped twin of :func:`sample_problem` (its target is checked once for its group).
    """
    if not _good_signal(signal):
        return "bad_signal", f"signal name {signal[:80]!r} is not snake_case"
    if isinstance(value, float) and not math.isfinite(value):
        return "not_finite", f"sample {signal} value {value} is not finite"
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return "text_too_long", f"sample {signal} text longer than {MAX_TEXT} characters"
    return None


def _uneven(group: pb.TargetSamples) -> str | None:
    """What is wrong with a group's columns, or None when each pair has one length."""
    for names, values, kind in (
        (group.int_signals, group.int_values, "int"),
        (group.real_signals, group.real_values, "real"),
        (group.text_signals, group.text_values, "text"),
    ):
        if len(names) != len(values):
            return f"{len(names)} {kind} signal names for {len(values)} values"
    return None


def validate_report(report: pb.Report, inventory: Inventory) -> None:
    """Check every sample of a Report against the contract; raise at the first that breaks it."""
    _check_size(report)
    for sample in report.samples:
        problem = sample_problem(sample, inventory)
        if problem is not None:
            raise WireError("invalid_report", problem[1])
    count = sample_count(report)
    _require(
        count <= MAX_SAMPLES,
        "invalid_report",
        f"{count} samples in one report; limit {MAX_SAMPLES}",
    )
    for group in report.targets:
        validate_target(group.target, inventory, "invalid_report")
        uneven = _uneven(group)
        _require(uneven is None, "invalid_report", f"target group: {uneven}")
        for signal, value in _columns(group):
            problem = column_problem(signal, value)
            if problem is not None:
                raise WireError("invalid_report", problem[1])


def _columns(group: pb.TargetSamples) -> list[tuple[str, SampleValue]]:
    """A group's (signal, value) pairs, every type (columns of unequal length cut short)."""
    pairs: list[tuple[str, SampleValue]] = []
    pairs.extend(zip(group.int_signals, group.int_values, strict=False))
    pairs.extend(zip(group.real_signals, group.real_values, strict=False))
    pairs.extend(zip(group.text_signals, group.text_values, strict=False))
    return pairs


def screen_report(report: pb.Report, inventory: Inventory) -> ScreenedReport:
    """Take the samples of a Report that keep the contract and hold a plausible value.

    Only a report too large to be a report at all raises (WireError ``invalid_report``); a bad
    sample is refused on its own, by reason: one of :func:`sample_problem`'s, or ``negative``,
    ``out_of_range`` or ``wrong_type`` from the table in :mod:`fleetwatch.wire.plausible`.
    """
    return SampleScreen(inventory).screen(report)


class SampleScreen:
    """:func:`screen_report` for one stream, remembering the targets it found good.

    A node names the same few hundred targets in every report: each is checked against its
    inventory once, then known by its key; each signal name is checked once per process. A
    sample then costs its key, two lookups and its value's checks.
    """

    def __init__(self, inventory: Inventory) -> None:
        """Screen samples against ``inventory`` (the stream's Hello)."""
        self._inventory = inventory
        self._checked: set[TargetKey] = set()

    def screen(self, report: pb.Report) -> ScreenedReport:
        """See :func:`screen_report`."""
        out = ScreenedReport(count=_check_size(report))
        checked, accepted = self._checked, out.accepted
        for sample in report.samples:
            t = sample.target
            key = (t.kind, t.gpu_uuid, t.index, t.device)
            signal = sample.signal
            which = sample.WhichOneof("value")
            value: SampleValue
            if key in checked and _good_signal(signal):
                if which == "real_value":
                    value = sample.real_value
                    good = math.isfinite(value)
                elif which == "int_value":
                    value, good = sample.int_value, True
                else:
                    value = sample.text_value
                    good = which == "text_value" and len(value) <= MAX_TEXT
                if good and rule_for(signal).fits(value):
                    accepted.append((key, signal, value))
                    continue
            problem = self._problem(sample, key)
            if problem is None:
                accepted.append((key, signal, sample_value_from_pb(sample)))
                continue
            _refuse(out, *problem, 1)
        if report.targets:
            out.count += self._screen_groups(report, out)
            _require(
                out.count <= MAX_SAMPLES,
                "invalid_report",
                f"{out.count} samples in one report; limit {MAX_SAMPLES}",
            )
        return out

    def _screen_groups(self, report: pb.Report, out: ScreenedReport) -> int:
        """Screen the grouped samples (``Report.targets``); return how many there were.

        A group's target is checked once (and then known); an int is checked against its
        signal's range (:func:`_int_bounds`), which is what most of a Report's values are.
        """
        count = 0
        for group in report.targets:
            ints, numbers = group.int_signals, group.int_values
            reals, floats = group.real_signals, group.real_values
            texts, strings = group.text_signals, group.text_values
            size = len(ints) + len(reals) + len(texts)
            count += size
            if len(ints) != len(numbers) or len(reals) != len(floats) or len(texts) != len(strings):
                size = max(size, len(numbers) + len(floats) + len(strings))
                _refuse(out, "uneven_columns", f"target group: {_uneven(group)}", size)
                continue
            key = self._group_key(group.target, out, size)
            if key is None:
                continue
            accepted = out.accepted
            for signal, number in zip(ints, numbers, strict=True):
                bounds = _int_bounds(signal)
                if bounds is not None and bounds[0] <= number <= bounds[1]:
                    accepted.append((key, signal, number))
                else:
                    _slow_check(out, key, signal, number)
            for signal, real in zip(reals, floats, strict=True):
                if math.isfinite(real) and _good_signal(signal) and rule_for(signal).fits(real):
                    accepted.append((key, signal, real))
                else:
                    _slow_check(out, key, signal, real)
            for signal, text in zip(texts, strings, strict=True):
                if len(text) <= MAX_TEXT and _good_signal(signal) and rule_for(signal).fits(text):
                    accepted.append((key, signal, text))
                else:
                    _slow_check(out, key, signal, text)
        return count

    def _group_key(self, t: pb.Target, out: ScreenedReport, size: int) -> TargetKey | None:
        """The key of a group's target; None (its ``size`` samples refused) when it is bad."""
        key = (t.kind, t.gpu_uuid, t.index, t.device)
        if key in self._checked:
            return key
        try:
            validate_target(t, self._inventory, "bad_target")
        except WireError as exc:
            _refuse(out, "bad_target", f"target group: {exc}", size)
            return None
        if len(self._checked) < MAX_CHECKED_TARGETS:
            self._checked.add(key)
        return key

    def _problem(self, sample: pb.Sample, key: TargetKey) -> tuple[str, str] | None:
        """Every check, in words (a sample the quick path did not take)."""
        problem = sample_problem(sample, self._inventory)
        if problem is not None:
            return problem
        if len(self._checked) < MAX_CHECKED_TARGETS:
            self._checked.add(key)
        found = value_problem(sample.signal, sample_value_from_pb(sample))
        return None if found is None else (found[0], f"sample {sample.signal}: {found[1]}")


def _refuse(out: ScreenedReport, reason: str, message: str, count: int) -> None:
    """Count ``count`` samples refused for ``reason``; keep the first ``message`` of it."""
    out.rejected[reason] += count
    out.examples.setdefault(reason, message)


@lru_cache(maxsize=4096)
def _int_bounds(signal: str) -> tuple[float, float] | None:
    """The range an int value of ``signal`` must fall in; None when no int can be right.

    The same answer as :meth:`Plausible.fits` for ints (a flag's 0..1 holds only 0 and 1),
    from one cached lookup: None for a malformed name or a text signal.
    """
    if not _good_signal(signal):
        return None
    rule = rule_for(signal)
    if rule.shape == "text":
        return None
    if rule.shape == "any":
        return (-math.inf, math.inf)
    return (rule.low, rule.high)


def _slow_check(out: ScreenedReport, key: TargetKey, signal: str, value: SampleValue) -> None:
    """Every check of one grouped sample the quick test did not take.

    It is refused by its first problem and counted, or taken after all.
    """
    problem = column_problem(signal, value)
    if problem is None:
        found = value_problem(signal, value)
        if found is None:
            out.accepted.append((key, signal, value))
            return
        problem = (found[0], f"sample {signal}: {found[1]}")
    _refuse(out, *problem, 1)


@lru_cache(maxsize=4096)
def _good_signal(signal: str) -> bool:
    return _full(SIGNAL_NAME, signal)


def validate_event(event: pb.Event, inventory: Inventory) -> None:
    """Check an Event from an agent."""
    r = "invalid_event"
    _require(event.seq >= 1, r, "event seq must start at 1")
    _require(
        event.seq <= MAX_SEQ,
        r,
        f"event seq {event.seq} out of range: sequence numbers go from 1 to {MAX_SEQ} (2^53-1)",
    )
    _require(
        event.kind in AGENT_EVENT_KINDS,
        r,
        f"event {event.seq}: kind {event.kind} may not be sent by an agent",
    )
    _require(event.time_unix_ms > 0, r, f"event {event.seq}: time_unix_ms must be positive")
    _require(event.xid <= MAX_XID, r, f"event {event.seq}: xid {event.xid} out of range")
    _require(len(event.xid_class) <= MAX_TEXT, r, f"event {event.seq}: xid_class too long")
    _require(
        len(event.detail) <= MAX_DETAIL,
        r,
        f"event {event.seq}: detail longer than {MAX_DETAIL} characters",
    )
    validate_target(event.target, inventory, r)
