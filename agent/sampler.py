"""One poll of every source: current samples, plus events for what happened since the last poll.

The sampler owns no I/O of its own: sources, the Xid catalog and the clock are injected. It reads
the GPUs through NVML itself and hands the kernel log, udev, InfiniBand and PCIe sysfs to one
poller each. A failed read is counted per source and costs only the values it would have given;
it never stops the poll. A GPU is reported lost once per loss, whichever source saw it first
(the kernel's Xid 79 line, NVML's GPU-lost error or event, or udev removing its PCI function).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import structlog

from agent.exceptions import GpuLostError, SourceError
from agent.findings import PendingEvent, PollResult
from agent.poll_ib import IbPoller
from agent.poll_kernel_log import KernelLogPoller
from agent.poll_pcie import PciePoller
from agent.poll_udev import UdevPoller
from agent.probes.gpu_signals import GpuSampler
from agent.probes.xid_merge import XidMerger
from fleetwatch.clock import unix_ms
from fleetwatch.model import EventKind, Target

if TYPE_CHECKING:
    from agent.sources.kmsg import KmsgSource
    from agent.sources.kmsg_cursor import KmsgCursor
    from agent.sources.nvml import GpuIdentity, NvmlSource
    from agent.sources.nvml_events import NvmlEventWatcher
    from agent.sources.pci_sysfs import PciSysfsReader
    from agent.sources.sysfs import IbPortInfo, SysfsReader
    from agent.sources.udev import UdevSource
    from agent.wakeup import Waker
    from fleetwatch.clock import Clock
    from rules.xid_catalog import XidCatalog

__all__ = ["NodeInventory", "PendingEvent", "PollResult", "Sampler"]

log = structlog.get_logger("agent.sampler")

XID_FALLEN_OFF_BUS: Final = 79
SOURCES: Final = ("nvml", "sysfs", "kmsg", "udev")


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """What the node has, found at start-up and sent in the Hello."""

    driver_version: str
    nvml_version: str
    gpus: tuple[GpuIdentity, ...]
    ib_ports: tuple[IbPortInfo, ...]


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
        pci: PciSysfsReader | None = None,
        kmsg_cursor: KmsgCursor | None = None,
        counter_interval_s: float = 5.0,
    ) -> None:
        """Keep the sources; call :meth:`discover` before polling."""
        self._nvml = nvml
        self._nvml_events = nvml_events
        self._sysfs = sysfs
        self._catalog = catalog
        self._clock = clock
        self._merger = XidMerger()
        self._kernel_log = (
            KernelLogPoller(kmsg, catalog, self._merger, clock, kmsg_cursor) if kmsg else None
        )
        self._udev = UdevPoller(udev) if udev else None
        self._ib = IbPoller(sysfs, clock)
        self._counter_interval = counter_interval_s
        self._last_counters: float | None = None
        self._pcie = PciePoller(pci) if pci else None
        self.inventory = NodeInventory("", "", (), ())
        self.source_errors: Counter[str] = Counter()
        self._by_bus: dict[str, GpuIdentity] = {}
        self._by_uuid: dict[str, GpuIdentity] = {}
        self._lost: set[str] = set()
        self._gpu_samplers: dict[str, GpuSampler] = {}
        self._nvlink_prev: dict[tuple[str, int], bool] = {}

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

    def compute_processes(self, gpu: GpuIdentity) -> list[int]:
        """Pids using ``gpu`` (SourceError, GpuLostError included, when NVML cannot say)."""
        return self._nvml.compute_processes(gpu)

    def close(self) -> None:
        """Stop the NVML event thread, if one runs, and close kept sysfs files."""
        if self._nvml_events is not None:
            self._nvml_events.stop()
        self._sysfs.close()

    def watch(self, waker: Waker) -> None:
        """Have the event sources (kernel log, NVML events, udev) wake the poll loop."""
        if self._kernel_log is not None:
            self._kernel_log.watch(waker)
        if self._nvml_events is not None:
            self._nvml_events.watch(waker)
        if self._udev is not None:
            self._udev.watch(waker)

    def poll_events(self) -> PollResult:
        """Read only the event sources: what a wake-up from :meth:`watch` asks for."""
        result = PollResult()
        self._read_events(result, unix_ms(self._clock))
        return result

    def _read_events(self, result: PollResult, now_ms: int) -> None:
        errors = self.source_errors
        if self._kernel_log is not None:
            self._kernel_log.poll(self._by_bus, self._gpu_lost, result, now_ms, errors)
        self._poll_nvml_events(result, now_ms)
        if self._udev is not None:
            self._udev.poll(self._by_bus, self._gpu_lost, result, now_ms, errors)

    def poll(self) -> PollResult:
        """Read every source once."""
        result = PollResult()
        now_ms = unix_ms(self._clock)
        errors = self.source_errors
        self._read_events(result, now_ms)
        for gpu in self.inventory.gpus:
            self._poll_gpu(gpu, result, now_ms)
        # Counters in sysfs (IB ports, PCIe AER and link) are read at the counter interval.
        mono = self._clock.monotonic()
        due = self._last_counters is None or mono - self._last_counters >= self._counter_interval
        if due:
            self._last_counters = mono
            if self._pcie is not None:
                self._pcie.poll(self.inventory.gpus, self._lost, result, errors)
        self._ib.poll(self.inventory.ib_ports, result, now_ms, errors, counters=due)
        self._self_samples(result)
        return result

    def _self_samples(self, result: PollResult) -> None:
        """The agent's own health, as samples of the node: read errors, lost kernel records."""
        node = Target.node()
        for source in SOURCES:
            result.samples[node, f"agent_source_errors_{source}"] = self.source_errors[source]
        if self._kernel_log is not None:
            result.samples[node, "agent_kmsg_overruns"] = self._kernel_log.overruns
        result.samples[node, "agent_ib_counter_resets"] = self._ib.counter_resets

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
        maker = self._gpu_samplers.get(gpu.uuid)
        if maker is None:
            maker = self._gpu_samplers[gpu.uuid] = GpuSampler(gpu)
        result.samples.update(maker.samples(reading))
        for link, nvlink in enumerate(reading.nvlinks):
            up = nvlink.up
            if up is None:  # state unknown: neither up nor down
                continue
            prev = self._nvlink_prev.get((gpu.uuid, link))
            self._nvlink_prev[gpu.uuid, link] = up
            if prev is up or (prev is None and up):
                continue
            result.event(
                EventKind.NVLINK_UP if up else EventKind.NVLINK_DOWN,
                Target.nvlink(gpu.uuid, link),
                now_ms,
                f"NVML link {link} state {'up' if up else 'down'}",
            )

    def _reprobe(self, gpu: GpuIdentity) -> None:
        """Identify a lost GPU again; a different UUID at its index is not the same GPU."""
        found = self._nvml.identify(gpu.index)
        if found.uuid != gpu.uuid:
            msg = f"GPU index {gpu.index} now has UUID {found.uuid}, was {gpu.uuid}"
            raise SourceError("nvml", msg)
