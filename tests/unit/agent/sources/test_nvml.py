import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

import pytest

from agent.exceptions import GpuLostError
from agent.poll.sampler import Sampler
from agent.probes.xid_merge import XidMerger
from agent.sim.hardware import SimNode
from agent.sources.nvml import NvmlSource
from agent.sources.nvml_events import NvmlEventWatcher
from agent.sources.sysfs import SysfsReader
from fleetwatch.clock import SystemClock
from fleetwatch.model import EventKind, Target
from fleetwatch.testing import FakeClock, wait_for_more, wait_until
from rules.xid_catalog import load_catalog

T = TypeVar("T")


def gather(into: list[T], items: Iterable[T]) -> bool:
    """Add ``items`` to ``into``; report whether anything has been gathered yet."""
    into.extend(items)
    return bool(into)


class Notes:
    """A waker that counts its notes (an NVML event queued) for the test to wait on."""

    def __init__(self) -> None:
        self.notes = 0

    def notify(self) -> None:
        self.notes += 1

    def watch_fd(self, fd: int) -> None:
        pass


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode("node-a", tmp_path / "sys", FakeClock(), gpus=2, nvlinks=4, ib_ports=1)


def started(node: SimNode) -> NvmlSource:
    src = NvmlSource(node.nvml)
    src.start()
    return src


class TestFieldValues:
    def test_one_batch_call_carries_the_per_link_and_device_counters(self, node: SimNode):
        """With every field supported, a poll is one field-values batch plus a few direct calls."""
        src = started(node)
        gpu = src.identify(0)
        node.gpus[0].nvlink_errors[2] = [5, 1, 9]
        node.gpus[0].ecc_dbe_volatile = 2
        node.gpus[0].remap_pending = True
        before = src.calls
        reading = src.read(gpu)
        # batch + gen, width, reasons, temp, power, util, clock; the first poll asks the
        # slowdown temperature threshold too (fixed per model: asked once)
        assert src.calls - before == 9
        assert reading.temperature_slowdown_c == 89
        before = src.calls
        assert src.read(gpu).temperature_slowdown_c == 89
        assert src.calls - before == 8
        before = src.calls
        fast = src.read(gpu, counters=False)  # the batch without the PCIe replay counter
        assert fast.pcie_replay_count is None
        assert fast.ecc_dbe_volatile == 2
        assert src.calls - before == 8
        assert reading.nvlinks[2].replay_errors == 5
        assert reading.nvlinks[2].recovery_errors == 1
        assert reading.nvlinks[2].crc_errors == 9
        assert reading.ecc_dbe_volatile == 2
        assert reading.remap_pending is True
        assert reading.remap_failure is False
        assert (reading.pcie_gen, reading.pcie_width) == (5, 16)
        assert (gpu.max_pcie_gen, gpu.max_pcie_width) == (5, 16)
        assert reading.power_w == pytest.approx(118.0)

    def test_link_count_comes_from_the_device(self, node: SimNode):
        """Field 91 gives the link count; no loop to NVML_NVLINK_MAX_LINKS."""
        assert started(node).identify(1).nvlink_count == 4

    def test_fields_the_gpu_lacks_fall_back_to_per_call(self, node: SimNode):
        """Without the Hopper NVLink error fields, the per-link counter call answers instead."""
        node.gpus[0].unsupported |= {161, 162, 163}
        node.gpus[0].nvlink_errors[1] = [3, 0, 7]
        src = started(node)
        reading = src.read(src.identify(0))
        assert (reading.nvlinks[1].replay_errors, reading.nvlinks[1].crc_errors) == (3, 7)

    def test_not_supported_either_way_is_none_and_not_asked_again(self, node: SimNode):
        """A counter missing from both APIs (Blackwell's DL counters) reads None, once probed."""
        node.gpus[0].unsupported |= {161, 162, 163, "nvmlDeviceGetNvLinkErrorCounter"}
        src = started(node)
        gpu = src.identify(0)
        first = src.read(gpu)
        assert first.nvlinks[0].replay_errors is None
        assert first.nvlinks[0].up is True
        before = src.calls
        src.read(gpu)
        assert src.calls - before == 8  # the refused per-link calls are not repeated

    def test_without_field_values_everything_is_per_call(self, node: SimNode):
        """An old driver without nvmlDeviceGetFieldValues still gets every value."""
        node.gpus[1].unsupported.add("nvmlDeviceGetFieldValues")
        node.gpus[1].pcie_replays = 12
        node.gpus[1].remapped_uncorrectable = 3
        src = started(node)
        gpu = src.identify(1)
        reading = src.read(gpu)
        assert gpu.nvlink_count == 4
        assert reading.pcie_replay_count == 12
        assert reading.remapped_uncorrectable == 3
        assert reading.nvlink_up == (True, True, True, True)

    def test_lost_gpu_in_the_batch_raises_gpu_lost(self, node: SimNode):
        """GPU-lost from the batch call is GpuLostError, like any other call."""
        src = started(node)
        gpu = src.identify(0)
        node.gpus[0].lost = True
        with pytest.raises(GpuLostError):
            src.read(gpu)


class TestEventWatcher:
    async def test_xid_events_arrive_through_the_waiting_thread(self, node: SimNode):
        """An Xid posted by the driver is queued by the thread and drained by the poll."""
        src = started(node)
        gpus = [src.identify(i) for i in range(2)]
        watcher = NvmlEventWatcher(node.nvml, SystemClock(), timeout_ms=50)
        assert watcher.start({g.uuid: src.handle(g.index) for g in gpus})
        try:
            node.xid(1, 48)
            got: list[tuple[str, int]] = []
            await wait_until(
                lambda: gather(got, ((x.gpu_uuid, x.xid) for x in watcher.drain())),
                timeout=5,
            )
            assert got == [(gpus[1].uuid, 48)]
            # Timeouts keep the thread looping, not failing: it waits again, twice more.
            await wait_for_more(lambda: watcher.waits, 2, timeout=5, what="more waits")
            assert watcher.errors == 0
        finally:
            watcher.stop()
        assert not watcher.running
        assert node.nvml.event_sets == []

    def test_stop_returns_within_a_wait_timeout(self, node: SimNode):
        """Stopping does not hang on a blocked wait."""
        src = started(node)
        gpu = src.identify(0)
        watcher = NvmlEventWatcher(node.nvml, SystemClock(), timeout_ms=100)
        assert watcher.start({gpu.uuid: src.handle(0)})
        watcher.stop()
        # Ended, not left behind: stop gives up on a thread still waiting after 1 s (then
        # it keeps the event set); a thread in a 100 ms wait is long gone by then.
        assert not watcher.running
        assert node.nvml.event_sets == []

    def test_unavailable_events_say_so_and_return_false(self, node: SimNode):
        """A GPU that cannot register events leaves the watcher off, not the agent down."""
        node.gpus[0].unsupported.add("nvmlDeviceRegisterEvents")
        src = started(node)
        gpu = src.identify(0)
        watcher = NvmlEventWatcher(node.nvml, SystemClock())
        assert watcher.start({gpu.uuid: src.handle(0)}) is False
        assert not watcher.running


class TestXidMerger:
    def test_same_fault_from_both_sources_is_one(self):
        """The kernel line and the NVML event of one Xid pair up."""
        merger = XidMerger(window_s=10)
        assert merger.offer("kmsg", "GPU-a", 48, 0.0)
        assert not merger.offer("nvml", "GPU-a", 48, 0.5)

    def test_a_burst_stays_a_burst(self):
        """Three Xids seen by both sources are three events, not one and not six."""
        merger = XidMerger(window_s=10)
        new = [merger.offer("kmsg", "GPU-a", 13, t) for t in (0.0, 0.1, 0.2)]
        new += [merger.offer("nvml", "GPU-a", 13, t) for t in (0.3, 0.4, 0.5)]
        assert new == [True, True, True, False, False, False]

    def test_one_source_alone_reports_everything(self):
        """Without the other source every occurrence is new."""
        merger = XidMerger(window_s=10)
        assert all(merger.offer("nvml", "GPU-a", 13, float(t)) for t in range(5))

    def test_outside_the_window_they_are_different_faults(self):
        """Occurrences further apart than the window do not pair."""
        merger = XidMerger(window_s=1)
        assert merger.offer("kmsg", "GPU-a", 79, 0.0)
        assert merger.offer("nvml", "GPU-a", 79, 5.0)

    def test_different_gpu_or_xid_do_not_pair(self):
        """Only the same GPU and the same Xid pair."""
        merger = XidMerger()
        assert merger.offer("kmsg", "GPU-a", 13, 0.0)
        assert merger.offer("nvml", "GPU-b", 13, 0.0)
        assert merger.offer("nvml", "GPU-a", 31, 0.0)


class TestSamplerWithNvmlEvents:
    async def test_one_xid_seen_twice_is_one_event(self, tmp_path: Path):
        """With kmsg and NVML events both on, an Xid makes exactly one event."""
        node = SimNode("node-b", tmp_path / "sys", SystemClock(), gpus=2, nvlinks=2, ib_ports=1)
        watcher = NvmlEventWatcher(node.nvml, SystemClock(), timeout_ms=50)
        queued = Notes()
        watcher.watch(queued)
        sampler = Sampler(
            nvml=NvmlSource(node.nvml),
            sysfs=SysfsReader(node.sysfs.root),
            kmsg=node.kmsg,
            udev=node.udev,
            catalog=load_catalog(),
            clock=SystemClock(),
            nvml_events=watcher,
        )
        sampler.discover()
        try:
            await sampler.poll()
            node.xid(0, 31)
            await wait_until(lambda: queued.notes > 0, timeout=5, what="NVML's Xid queued")
            events = (await sampler.poll()).events + (await sampler.poll()).events
            assert [(e.kind, e.xid, e.target) for e in events] == [
                (EventKind.XID, 31, Target.gpu(node.gpus[0].uuid)),
            ]
            assert "NVRM: Xid" in events[0].detail  # the kernel's words, when it had them
        finally:
            sampler.close()

    async def test_nvml_alone_reports_the_xid(self, tmp_path: Path):
        """With the kernel log off, the NVML event carries the Xid."""
        node = SimNode("node-c", tmp_path / "sys", SystemClock(), gpus=1, nvlinks=2, ib_ports=1)
        sampler = Sampler(
            nvml=NvmlSource(node.nvml),
            sysfs=SysfsReader(node.sysfs.root),
            kmsg=None,
            udev=None,
            catalog=load_catalog(),
            clock=SystemClock(),
            nvml_events=NvmlEventWatcher(node.nvml, SystemClock(), timeout_ms=50),
        )
        sampler.discover()
        try:
            node.xid(0, 94)
            events: list[tuple[EventKind, int]] = []
            for _ in range(100):  # until NVML's event thread has queued it, 5 s at most
                if gather(events, ((e.kind, e.xid) for e in (await sampler.poll()).events)):
                    break
                await asyncio.sleep(0.05)
            assert events == [(EventKind.XID, 94)]
        finally:
            sampler.close()

    async def test_gpu_back_on_the_bus_is_reprobed(self, tmp_path: Path):
        """A lost GPU that returns is identified again and reports values again."""
        node = SimNode("node-d", tmp_path / "sys", FakeClock(), gpus=2, nvlinks=2, ib_ports=1)
        sampler = Sampler(
            nvml=NvmlSource(node.nvml),
            sysfs=SysfsReader(node.sysfs.root),
            kmsg=node.kmsg,
            udev=None,
            catalog=load_catalog(),
            clock=node.clock,
        )
        sampler.discover()
        uuid = node.gpus[1].uuid
        node.xid(1, 79)
        assert [e.kind for e in (await sampler.poll()).events] == [EventKind.GPU_LOST]
        assert (Target.gpu(uuid), "temperature_celsius") not in (await sampler.poll()).samples
        node.gpus[1].lost = False
        result = await sampler.poll()
        assert result.samples[Target.gpu(uuid), "gpu_present"] == 1
        assert result.samples[Target.gpu(uuid), "temperature_celsius"] == 41
        assert result.samples[Target.gpu(node.gpus[0].uuid), "gpu_present"] == 1
