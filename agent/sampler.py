"""One poll of every source: current samples, plus events for what happened since the last poll.

The sampler owns no I/O of its own: sources, the Xid catalog and the clock are injected. A failed
read is counted per source and leaves the previous values in place; it never stops the poll.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from agent.exceptions import GpuLostError, SourceError
from agent.pci import normalize_bus_id
from agent.probes.gpu_signals import gpu_samples
from agent.probes.xid import parse_xid_line
from agent.probes.xid_merge import XidMerger
from fleetwatch.clock import unix_ms
from fleetwatch.model import EventKind, SampleKey, SampleValue, Target, event_kind_to_pb
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from agent.sources.kmsg import KmsgSource
    from agent.sources.nvml import GpuIdentity, NvmlSource
    from agent.sources.nvml_events import NvmlEventWatcher
    from agent.sources.sysfs import IbPortInfo, SysfsReader
    from agent.sources.udev import UdevSource
    from fleetwatch.clock import Clock
    from rules.xid_catalog import XidCatalog

log = structlog.get_logger("agent.sampler")

XID_FALLEN_OFF_BUS = 79
IB_ACTIVE = "ACTIVE"


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """An event before the outbox numbers it."""

    kind: EventKind
    target: Target
    time_unix_ms: int
    xid: int = 0
    xid_class: str = ""
    detail: str = ""

    def to_pb(self, seq: int) -> pb.Event:
        """Render as a wire event numbered ``seq``."""
        return pb.Event(
            seq=seq,
            time_unix_ms=self.time_unix_ms,
            kind=event_kind_to_pb(self.kind),
            target=self.target.to_pb(),
            xid=self.xid,
            xid_class=self.xid_class,
            detail=self.detail,
        )


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """What the node has, found at start-up and sent in the Hello."""

    driver_version: str
    nvml_version: str
    gpus: tuple[GpuIdentity, ...]
    ib_ports: tuple[IbPortInfo, ...]


@dataclass(slots=True)
class PollResult:
    """Every current sample, and the events this poll produced (in the order they happened)."""

    samples: dict[SampleKey, SampleValue] = field(default_factory=dict)
    events: list[PendingEvent] = field(default_factory=list)


class Sampler:
    """Turns source readings into samples and edge-triggered events."""

    def __init__(  # noqa: PLR0913 - one argument per injected source
        self,
        *,
        nvml: NvmlSource,
        sysfs: SysfsReader,
        kmsg: KmsgSource | None,
        udev: UdevSource | None,
        catalog: XidCatalog,
        clock: Clock,
        nvml_events: NvmlEventWatcher | None = None,
    ) -> None:
        """Keep the sources; call :meth:`discover` before polling."""
        self._nvml = nvml
        self._nvml_events = nvml_events
        self._merger = XidMerger()
        self._sysfs = sysfs
        self._kmsg = kmsg
        self._udev = udev
        self._catalog = catalog
        self._clock = clock
        self.inventory = NodeInventory("", "", (), ())
        self.source_errors: Counter[str] = Counter()
        self._by_bus: dict[str, GpuIdentity] = {}
        self._by_uuid: dict[str, GpuIdentity] = {}
        self._lost: set[str] = set()
        self._nvlink_prev: dict[tuple[str, int], bool] = {}
        self._ib_prev: dict[tuple[str, int], str] = {}

    def discover(self) -> NodeInventory:
        """Start NVML and list GPUs and IB ports. A GPU that cannot be identified is skipped."""
        driver, nvml_version = self._nvml.start()
        gpus: list[GpuIdentity] = []
        for index in range(self._nvml.device_count()):
            try:
                gpus.append(self._nvml.identify(index))
            except SourceError as exc:
                self.source_errors["nvml"] += 1
                log.warning("gpu_identify_failed", gpu_index=index, error=str(exc))
        try:
            ports = self._sysfs.ib_ports()
        except SourceError as exc:
            self.source_errors["sysfs"] += 1
            log.warning("ib_discovery_failed", error=str(exc))
            ports = []
        self.inventory = NodeInventory(driver, nvml_version, tuple(gpus), tuple(ports))
        self._by_bus = {gpu.pci_bus_id: gpu for gpu in gpus}
        self._by_uuid = {gpu.uuid: gpu for gpu in gpus}
        if self._nvml_events is not None and gpus:
            handles = {gpu.uuid: self._nvml.handle(gpu.index) for gpu in gpus}
            if not self._nvml_events.start(handles):
                self._nvml_events = None
        return self.inventory

    def close(self) -> None:
        """Stop the NVML event thread, if one runs."""
        if self._nvml_events is not None:
            self._nvml_events.stop()

    def poll(self) -> PollResult:
        """Read every source once."""
        result = PollResult()
        now_ms = unix_ms(self._clock)
        self._poll_kmsg(result, now_ms)
        self._poll_nvml_events(result, now_ms)
        self._poll_udev(result, now_ms)
        for gpu in self.inventory.gpus:
            self._poll_gpu(gpu, result, now_ms)
        for port in self.inventory.ib_ports:
            self._poll_ib_port(port, result, now_ms)
        return result

    def _gpu_lost(
        self,
        gpu: GpuIdentity,
        result: PollResult,
        now_ms: int,
        *,
        xid: int = 0,
        detail: str = "",
    ) -> None:
        """Record a lost GPU once per loss, whichever source noticed first."""
        result.samples[Target.gpu(gpu.uuid), "gpu_present"] = 0
        if gpu.uuid in self._lost:
            return
        self._lost.add(gpu.uuid)
        result.events.append(
            PendingEvent(
                kind=EventKind.GPU_LOST,
                target=Target.gpu(gpu.uuid),
                time_unix_ms=now_ms,
                xid=xid,
                xid_class=self._catalog.class_of(xid) if xid else "",
                detail=detail,
            ),
        )

    def _poll_kmsg(self, result: PollResult, now_ms: int) -> None:
        if self._kmsg is None:
            return
        try:
            records = self._kmsg.read()
        except SourceError as exc:
            self.source_errors["kmsg"] += 1
            log.warning("kmsg_read_failed", error=str(exc))
            return
        for record in records:
            line = parse_xid_line(record.text)
            if line is None:
                continue
            gpu = self._by_bus.get(line.pci_bus_id)
            if gpu is not None and line.xid == XID_FALLEN_OFF_BUS:
                self._gpu_lost(gpu, result, now_ms, xid=line.xid, detail=line.text)
                continue
            target = Target.gpu(gpu.uuid) if gpu else Target.pci(line.pci_bus_id)
            if gpu and not self._merger.offer("kmsg", gpu.uuid, line.xid, self._clock.monotonic()):
                continue
            result.events.append(
                PendingEvent(
                    kind=EventKind.XID,
                    target=target,
                    time_unix_ms=now_ms,
                    xid=line.xid,
                    xid_class=self._catalog.class_of(line.xid),
                    detail=line.text,
                ),
            )

    def _poll_nvml_events(self, result: PollResult, now_ms: int) -> None:
        if self._nvml_events is None:
            return
        for item in self._nvml_events.drain():
            gpu = self._by_uuid.get(item.gpu_uuid)
            if gpu is None:
                continue
            detail = f"NVML Xid event {item.xid}"
            if item.xid == XID_FALLEN_OFF_BUS:
                self._gpu_lost(gpu, result, now_ms, xid=item.xid, detail=detail)
                continue
            if not self._merger.offer("nvml", gpu.uuid, item.xid, item.mono):
                continue
            result.events.append(
                PendingEvent(
                    kind=EventKind.XID,
                    target=Target.gpu(gpu.uuid),
                    time_unix_ms=now_ms,
                    xid=item.xid,
                    xid_class=self._catalog.class_of(item.xid),
                    detail=detail,
                ),
            )

    def _poll_udev(self, result: PollResult, now_ms: int) -> None:
        if self._udev is None:
            return
        try:
            uevents = self._udev.poll()
        except SourceError as exc:
            self.source_errors["udev"] += 1
            log.warning("udev_poll_failed", error=str(exc))
            return
        for uevent in uevents:
            if uevent.subsystem != "pci" or uevent.action != "remove":
                continue
            try:
                bus_id = normalize_bus_id(uevent.sys_name)
            except ValueError:
                self.source_errors["udev"] += 1
                continue
            gpu = self._by_bus.get(bus_id)
            result.events.append(
                PendingEvent(
                    kind=EventKind.PCI_REMOVED,
                    target=Target.gpu(gpu.uuid) if gpu else Target.pci(bus_id),
                    time_unix_ms=now_ms,
                    detail=f"udev remove {bus_id}",
                ),
            )

    def _poll_gpu(self, gpu: GpuIdentity, result: PollResult, now_ms: int) -> None:
        try:
            if gpu.uuid in self._lost:
                self._reprobe(gpu)
            reading = self._nvml.read(gpu)
        except GpuLostError as exc:
            self._nvml.forget(gpu.index)
            self._gpu_lost(gpu, result, now_ms, detail=str(exc))
            return
        except SourceError as exc:
            self.source_errors["nvml"] += 1
            log.warning("gpu_read_failed", gpu_uuid=gpu.uuid, error=str(exc))
            return
        if gpu.uuid in self._lost:
            self._lost.discard(gpu.uuid)
            log.info("gpu_back", gpu_uuid=gpu.uuid)
        result.samples.update(gpu_samples(gpu, reading))
        for link, nvlink in enumerate(reading.nvlinks):
            up = nvlink.up
            if up is None:  # state unknown: neither up nor down
                continue
            prev = self._nvlink_prev.get((gpu.uuid, link))
            self._nvlink_prev[gpu.uuid, link] = up
            if prev is up or (prev is None and up):
                continue
            result.events.append(
                PendingEvent(
                    kind=EventKind.NVLINK_UP if up else EventKind.NVLINK_DOWN,
                    target=Target.nvlink(gpu.uuid, link),
                    time_unix_ms=now_ms,
                    detail=f"NVML link {link} state {'up' if up else 'down'}",
                ),
            )

    def _reprobe(self, gpu: GpuIdentity) -> None:
        """Identify a lost GPU again; a different UUID at its index is not the same GPU."""
        found = self._nvml.identify(gpu.index)
        if found.uuid != gpu.uuid:
            msg = f"GPU index {gpu.index} now has UUID {found.uuid}, was {gpu.uuid}"
            raise SourceError("nvml", msg)

    def _poll_ib_port(self, port: IbPortInfo, result: PollResult, now_ms: int) -> None:
        try:
            status = self._sysfs.ib_port_status(port.device, port.port)
        except SourceError as exc:
            self.source_errors["sysfs"] += 1
            log.warning("ib_read_failed", device=port.device, port=port.port, error=str(exc))
            return
        target = Target.ib_port(port.device, port.port)
        result.samples[target, "ib_state"] = status.state
        result.samples[target, "ib_phys_state"] = status.phys_state
        result.samples[target, "ib_link_downed"] = status.link_downed
        key = (port.device, port.port)
        prev = self._ib_prev.get(key)
        self._ib_prev[key] = status.state
        was_up = prev == IB_ACTIVE
        is_up = status.state == IB_ACTIVE
        if (prev is None and is_up) or (prev is not None and was_up == is_up):
            return
        result.events.append(
            PendingEvent(
                kind=EventKind.IB_PORT_UP if is_up else EventKind.IB_PORT_DOWN,
                target=target,
                time_unix_ms=now_ms,
                detail=(
                    f"state {status.state}, phys_state {status.phys_state}, "
                    f"link_downed {status.link_downed}"
                ),
            ),
        )
