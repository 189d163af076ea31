"""One poll of every source: current samples, plus events for what happened since the last poll.

The sampler owns no I/O of its own: sources, the Xid catalog and the clock are injected. It reads
the GPUs through NVML itself and hands the kernel log, udev, InfiniBand and PCIe sysfs to one
poller each. A failed read is counted per source and costs only the values it would have given;
it never stops the poll. A GPU is reported lost once per loss, whichever source saw it first
(the kernel's Xid 79 line, NVML's GPU-lost error or event, or udev removing its PCI function).

A poll has two parts. :meth:`Sampler.poll_events` reads the event sources (kernel log, NVML's
event queue, udev) at once, without a hand-off, so a wake-up is served in microseconds.
:meth:`Sampler.poll_devices` reads the GPUs, the sysfs counters and the agent's own health; it
is awaited, because every GPU of a poll is read in one hand-off to the NVML guard's worker
thread (:mod:`agent.sources.nvml_guard`) and the event loop goes on meanwhile. When NVML hangs, the
devices part goes on after the deadline with the GPUs read so far; later polls leave NVML out at
once until the stuck call returns, while the kernel log, udev and sysfs are read as usual.
``agent_nvml_hung`` says so.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Final

import structlog

from agent.exceptions import GpuLostError, SourceError
from agent.poll.findings import PendingEvent, PollResult
from agent.poll.gpu_signals import GpuSampler
from agent.poll.ib import IbPoller
from agent.poll.ib_link import IbLinkPoller
from agent.poll.kernel_log import KernelLogPoller
from agent.poll.pcie import PciePoller
from agent.poll.udev import UdevPoller
from agent.probes.xid_merge import XidMerger
from agent.sources.ib_link import IbLinkReader
from agent.sources.nvml_guard import NvmlHungError
from fleetwatch.clock import unix_ms
from fleetwatch.model import EventKind, Target

if TYPE_CHECKING:
    from agent.sources.kmsg import KmsgSource
    from agent.sources.kmsg_cursor import KmsgCursor
    from agent.sources.nvml import GpuIdentity, GpuReading, NvmlSource
    from agent.sources.nvml_events import NvmlEventWatcher
    from agent.sources.pci_sysfs import PciSysfsReader
    from agent.sources.sysfs import IbPortInfo, SysfsReader
    from agent.sources.udev import UdevSource
    from agent.sources.wakeup import Waker
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


@dataclass(slots=True)
class _GpuReads:
    """One poll's GPU readings, filled on the NVML worker thread, GPU by GPU.

    A caller that stops waiting (NVML hung) takes what is there and sets ``abandoned``: the
    worker then stops after the call it is stuck in.
    """

    done: list[tuple[GpuIdentity, GpuReading | SourceError]] = field(default_factory=list)
    abandoned: bool = False


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
        # How ports trained, RoCE GIDs, NIC and NVSwitch PCIe links: at the counter interval.
        self._ib_link = IbLinkPoller(IbLinkReader(sysfs.root), pci)
        self._counter_interval = counter_interval_s
        self._last_counters: float | None = None
        self._pcie = PciePoller(pci) if pci else None
        self.inventory = NodeInventory("", "", (), ())
        self.source_errors: Counter[str] = Counter()
        self._by_bus: dict[str, GpuIdentity] = {}
        self._by_uuid: dict[str, GpuIdentity] = {}
        self._lost: set[str] = set()
        self._gpu_samplers: dict[str, GpuSampler] = {}
        # NVML indices that could not be identified at discovery (left out of the inventory),
        # and each GPU's polls in a row whose read failed (NVML answered an error, not GPU-lost).
        self._unidentified = 0
        self._read_failures: dict[str, int] = {}
        self._nvlink_prev: dict[tuple[str, int], bool] = {}

    def discover(self) -> NodeInventory:
        """Start NVML and list GPUs and IB ports. A GPU that cannot be identified is skipped.

        NVML that hangs fails discovery as a whole (NvmlHungError): a GPU must not be left out
        of the inventory because the driver was slow to answer. Each NVML call blocks its
        caller for up to the deadline: the agent runs this on a thread of its own.
        """
        driver, nvml_version = self._nvml.start()
        gpus: list[GpuIdentity] = []
        self._unidentified = 0  # discovery may be tried again after a hang
        for index in range(self._nvml.device_count()):
            try:
                gpus.append(self._nvml.identify(index))
            except NvmlHungError:
                raise
            except SourceError as exc:
                self.source_errors["nvml"] += 1
                self._unidentified += 1
                log.warning("gpu_identify_failed", gpu_index=index, error=str(exc))
        try:
            ports = self._sysfs.ib_ports()
        except SourceError as exc:
            self.source_errors["sysfs"] += 1
            log.warning("ib_discovery_failed", error=str(exc))
            ports = []
        self.inventory = NodeInventory(driver, nvml_version, tuple(gpus), tuple(ports))
        self._ib_link.discover()
        self._by_bus = {gpu.pci_bus_id: gpu for gpu in gpus}
        self._by_uuid = {gpu.uuid: gpu for gpu in gpus}
        if self._nvml_events is not None and gpus:
            self._start_nvml_events(self._nvml_events, gpus)
        return self.inventory

    def _start_nvml_events(self, watcher: NvmlEventWatcher, gpus: list[GpuIdentity]) -> None:
        """Register the GPUs for Xid events; NVML hanging here leaves the events off."""

        def register() -> bool:
            handles = {gpu.uuid: self._nvml.handle(gpu.index) for gpu in gpus}
            return watcher.start(handles)

        try:
            started = self._nvml.guarded("register for NVML events", register)
        except NvmlHungError as exc:
            watcher.cancel()  # should registration end after all, no thread starts
            log.warning("nvml_events_unavailable", error=str(exc))
            started = False
        if not started:
            self._nvml_events = None

    async def compute_processes(self, gpu: GpuIdentity) -> list[int]:
        """Pids using ``gpu`` (SourceError, GpuLostError included, when NVML cannot say).

        Awaited on the NVML worker thread, under its deadline.
        """
        what = f"compute processes of GPU {gpu.index}"
        return await self._nvml.guard.call(what, partial(self._nvml.compute_processes, gpu))

    def close(self) -> None:
        """Stop the NVML event thread, if one runs, and close kept sysfs files.

        Never waits on a hung NVML for longer than the guard's deadline, but may wait that
        long: the agent runs this on a thread of its own.
        """
        if self._nvml_events is not None:
            self._nvml_events.cancel()  # the thread ends even if NVML hangs now and returns later
            try:
                self._nvml.guarded("stop NVML events", self._nvml_events.stop)
            except NvmlHungError as exc:
                log.warning("nvml_events_stop_hung", error=str(exc))
        self._nvml.close()
        self._sysfs.close()

    def watch(self, waker: Waker) -> None:
        """Have the event sources (kernel log, NVML events, udev) wake the poll loop."""
        if self._kernel_log is not None:
            self._kernel_log.watch(waker)
        if self._nvml_events is not None:
            self._nvml_events.watch(waker)
        if self._udev is not None:
            self._udev.watch(waker)

    def commit_kmsg(self, seq: int) -> None:
        """The events of kernel log records up to ``seq`` are durable: move the cursor there.

        The cursor file is replaced with an fsync: the agent runs this on the outbox's disk
        thread (:meth:`agent.outbox.queue.Outbox.on_disk_thread`), after the events' own fsync.
        """
        if self._kernel_log is not None:
            self._kernel_log.commit(seq)

    def resume_kmsg_after(self, seq: int) -> None:
        """Skip kernel log records up to ``seq`` too (the restored outbox holds their events)."""
        if self._kernel_log is not None and seq > 0:
            self._kernel_log.resume_after(seq)

    def poll_events(self) -> PollResult:
        """Read only the event sources: what a wake-up from :meth:`watch` asks for.

        Nothing here waits: the kernel log and udev are read without blocking, and NVML's Xid
        events come from the queue its event thread fills.
        """
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

    async def poll_devices(self) -> PollResult:
        """Read the GPUs (awaited on the NVML worker), the sysfs counters and the agent's health.

        The event loop is free while NVML works, for as long as the deadline allows.
        """
        result = PollResult()
        now_ms = unix_ms(self._clock)
        errors = self.source_errors
        mono = self._clock.monotonic()
        due = self._last_counters is None or mono - self._last_counters >= self._counter_interval
        lost_before = frozenset(self._lost)
        readings = await self._read_gpus(lost_before, counters=due)
        if any(isinstance(r, GpuLostError) and g.uuid not in self._lost for g, r in readings):
            # The driver logs Xid 79 before NVML answers GPU-lost, and the line says more (the
            # Xid, its class): read the event sources again, so that a line logged while NVML
            # was read reports the loss, not NVML's bare error.
            self._read_events(result, unix_ms(self._clock))
        for gpu, reading in readings:
            if gpu.uuid in self._lost and gpu.uuid not in lost_before:
                # Lost while NVML was read (the kernel log or udev said so meanwhile): a reading
                # that answered was begun before the loss, and would say the GPU is back.
                continue
            self._take_gpu(gpu, reading, result, now_ms)
        # Counters (IB ports, PCIe AER and link in sysfs; the GPUs' PCIe replay counter in NVML,
        # above) are read at the counter interval.
        if due:
            self._last_counters = mono
            if self._pcie is not None:
                self._pcie.poll(self.inventory.gpus, self._lost, result, errors)
        self._ib.poll(self.inventory.ib_ports, result, now_ms, errors, counters=due)
        if due:  # after the port states: only active ports are judged
            self._ib_link.poll(self.inventory.ib_ports, result, now_ms, errors)
        self._self_samples(result)
        return result

    async def poll(self) -> PollResult:
        """Read every source once: the event sources, then the devices, in one result.

        The agent takes the two parts apart (it numbers a poll's events before it waits for
        NVML); this is for callers that want one poll's whole picture.
        """
        events = self.poll_events()
        result = await self.poll_devices()
        result.events[:0] = events.events
        result.samples.update(events.samples)
        seqs = [s for s in (events.kmsg_seq, result.kmsg_seq) if s is not None]
        result.kmsg_seq = max(seqs) if seqs else None
        return result

    def _self_samples(self, result: PollResult) -> None:
        """The agent's own health, as samples of the node: read errors, lost kernel records."""
        node = Target.node()
        for source in SOURCES:
            result.samples[node, f"agent_source_errors_{source}"] = self.source_errors[source]
        if self._kernel_log is not None:
            result.samples[node, "agent_kmsg_overruns"] = self._kernel_log.overruns
        result.samples[node, "agent_ib_counter_resets"] = self._ib.counter_resets
        result.samples[node, "gpus_unidentified"] = self._unidentified
        guard = self._nvml.guard
        result.samples[node, "agent_nvml_hung"] = int(guard.hung)
        result.samples[node, "agent_nvml_calls_timed_out"] = guard.timed_out

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

    async def _read_gpus(
        self, lost: frozenset[str], *, counters: bool = True
    ) -> list[tuple[GpuIdentity, GpuReading | SourceError]]:
        """Every GPU's reading (or why there is none), in one awaited hand-off to the NVML thread.

        ``lost``: the GPUs known lost when the read begins (each is identified again first).
        ``counters``: read the slow counters too (see :meth:`NvmlSource.read`). When NVML hangs,
        the GPUs read before the stuck call; none while it stays stuck.
        """
        gpus = self.inventory.gpus
        if not gpus:
            return []
        reads = _GpuReads()
        read_all = partial(self._read_all, reads, lost, counters=counters)
        try:
            await self._nvml.guard.call("read GPUs", read_all)
        except NvmlHungError as exc:
            done = list(reads.done)
            reads.abandoned = True
            if exc.timed_out:  # the first poll of a hang; later ones are refused quietly
                stuck = gpus[len(done)] if len(done) < len(gpus) else None
                log.error(
                    "gpu_read_hung",
                    gpu_index=None if stuck is None else stuck.index,
                    gpu_uuid=None if stuck is None else stuck.uuid,
                    error=str(exc),
                )
            return done
        except asyncio.CancelledError:
            reads.abandoned = True  # the worker stops after the GPU it is reading
            raise
        return reads.done

    def _read_all(self, reads: _GpuReads, lost: frozenset[str], *, counters: bool) -> None:
        """On the NVML thread: read each GPU (a lost one is identified again first)."""
        nvml = self._nvml
        for gpu in self.inventory.gpus:
            if reads.abandoned:
                return
            try:
                if gpu.uuid in lost:
                    self._reprobe(gpu)
                reading: GpuReading | SourceError = nvml.read(gpu, counters=counters)
            except GpuLostError as exc:
                nvml.forget(gpu.index)
                reading = exc
            except SourceError as exc:
                reading = exc
            reads.done.append((gpu, reading))

    def _take_gpu(
        self,
        gpu: GpuIdentity,
        reading: GpuReading | SourceError,
        result: PollResult,
        now_ms: int,
    ) -> None:
        if isinstance(reading, GpuLostError):
            self._gpu_lost(gpu, result, now_ms, detail=str(reading))
            return
        if isinstance(reading, SourceError):
            self.source_errors["nvml"] += 1
            failures = self._read_failures[gpu.uuid] = self._read_failures.get(gpu.uuid, 0) + 1
            result.samples[Target.gpu(gpu.uuid), "nvml_read_failures"] = failures
            if failures == 1:  # NVML's Unknown Error comes at every poll: logged once a spell
                log.warning("gpu_read_failed", gpu_uuid=gpu.uuid, error=str(reading))
            return
        if self._read_failures.pop(gpu.uuid, 0):  # read again: say so once (absent otherwise)
            log.info("gpu_read_failed_ended", gpu_uuid=gpu.uuid)
            result.samples[Target.gpu(gpu.uuid), "nvml_read_failures"] = 0
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
