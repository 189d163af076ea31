import asyncio
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.poll.gpu_signals import CLOCK_REASON_SIGNALS, GPU_SIGNALS, NVLINK_SIGNALS
from agent.poll.sampler import Sampler
from agent.sim.hardware import SimNode
from agent.sources.kmsg_cursor import KmsgCursor
from agent.sources.nvml import GpuIdentity, GpuReading, NvmlSource
from agent.sources.sysfs import SysfsReader
from agent.sources.udev import UdevEvent
from agent.testing import sim_sampler
from fleetwatch.model import EventKind, Target, TargetKind
from fleetwatch.testing import FakeClock
from rules.xid_catalog import load_catalog


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode("node-a", tmp_path / "sys", FakeClock(), gpus=4, nvlinks=6, ib_ports=4)


@pytest.fixture
def sampler(node: SimNode) -> Sampler:
    return sim_sampler(node)


async def kinds(sampler: Sampler) -> list[tuple[EventKind, Target, int]]:
    return [(e.kind, e.target, e.xid) for e in (await sampler.poll()).events]


class TestSampler:
    async def test_healthy_node_has_samples_and_no_events(self, sampler: Sampler, node: SimNode):
        """First poll: every signal sampled, nothing to report."""
        result = await sampler.poll()
        assert result.events == []
        uuid = node.gpus[0].uuid
        assert result.samples[Target.gpu(uuid), "gpu_present"] == 1
        assert result.samples[Target.gpu(uuid), "pcie_replay_count"] == 0
        assert result.samples[Target.nvlink(uuid, 5), "nvlink_up"] == 1
        assert result.samples[Target.ib_port("mlx5_3", 1), "ib_state"] == "ACTIVE"
        pcie_sysfs = 8  # width, max width, speed, max speed, degraded, 3 AER totals
        per_gpu = 3 + len(GPU_SIGNALS) + len(CLOCK_REASON_SIGNALS) + 6 * len(NVLINK_SIGNALS)
        per_gpu += pcie_sysfs
        gpu_kinds = (TargetKind.GPU, TargetKind.NVLINK)
        assert len([k for k in result.samples if k[0].kind in gpu_kinds]) == 4 * per_gpu
        port = Target.ib_port("mlx5_3", 1)
        assert result.samples[port, "ib_symbol_error"] == 0
        assert result.samples[port, "ib_port_xmit_bytes"] == 0
        assert result.samples[port, "ib_link_downed_saturated"] == 0
        assert (port, "ib_hw_out_of_buffer") in result.samples

    async def test_xid_79_is_one_gpu_lost_event(self, sampler: Sampler, node: SimNode):
        """The kernel line and NVML's GPU-lost error are one event, not two."""
        await sampler.poll()
        node.xid(2, 79)
        events = (await sampler.poll()).events
        assert [(e.kind, e.xid, e.xid_class) for e in events] == [(EventKind.GPU_LOST, 79, "bus")]
        assert events[0].target == Target.gpu(node.gpus[2].uuid)
        assert "fallen off the bus" in events[0].detail
        assert (await kinds(sampler)) == []
        assert (await sampler.poll()).samples[Target.gpu(node.gpus[2].uuid), "gpu_present"] == 0

    async def test_xid_79_logged_while_the_event_sources_were_read_still_names_the_loss(
        self, sampler: Sampler, node: SimNode
    ):
        """A line logged between a poll's event read and its GPU read reports the loss (Xid 79).

        The agent reads the event sources first and NVML after; a GPU that falls off the bus in
        between answers GPU-lost to NVML while its Xid 79 line waits in the kernel log.
        """
        await sampler.poll()
        assert sampler.poll_events().events == []
        node.xid(2, 79)
        result = await sampler.poll_devices()
        assert [(e.kind, e.xid, e.xid_class) for e in result.events] == [
            (EventKind.GPU_LOST, 79, "bus")
        ]
        assert result.kmsg_seq is not None  # the line was read here: its record moves the cursor
        assert sampler.poll_events().events == []

    async def test_a_reading_begun_before_the_loss_does_not_bring_the_gpu_back(self, node: SimNode):
        """Xid 79 read from the kernel log while NVML reads the GPUs: the answer NVML gave
        before the fall is stale. The GPU stays lost (no ``gpu_back``, no second loss)."""
        begun, release = threading.Event(), threading.Event()

        class HeldNvml(NvmlSource):
            held = False

            def read(self, gpu: GpuIdentity, *, counters: bool = True) -> GpuReading:
                reading = super().read(gpu, counters=counters)
                if gpu.index == 2 and not HeldNvml.held:  # answered, then held before returning
                    HeldNvml.held = True
                    begun.set()
                    release.wait(timeout=30)
                return reading

        sampler = Sampler(
            nvml=HeldNvml(node.nvml),
            sysfs=SysfsReader(node.sysfs.root),
            kmsg=node.kmsg,
            udev=node.udev,
            catalog=load_catalog(),
            clock=node.clock,
        )
        sampler.discover()
        devices = asyncio.ensure_future(sampler.poll_devices())
        assert await asyncio.to_thread(begun.wait, 30)
        node.xid(2, 79)
        lost = sampler.poll_events().events
        assert [(e.kind, e.xid) for e in lost] == [(EventKind.GPU_LOST, 79)]
        release.set()
        with capture_logs() as logs:
            stale = await devices
            later = await sampler.poll()
        gpu = Target.gpu(node.gpus[2].uuid)
        assert (gpu, "gpu_present") not in stale.samples  # the kernel log's 0 stands
        assert later.events == []
        assert later.samples[gpu, "gpu_present"] == 0
        assert "gpu_back" not in [e["event"] for e in logs]

    async def test_gpu_lost_seen_by_nvml_first_is_reported_once(
        self, sampler: Sampler, node: SimNode
    ):
        """NVML's GPU-lost without a kernel line still yields exactly one event."""
        await sampler.poll()
        node.gpus[1].lost = True
        assert (await kinds(sampler)) == [(EventKind.GPU_LOST, Target.gpu(node.gpus[1].uuid), 0)]
        node.xid(1, 79)
        assert (await kinds(sampler)) == []

    async def test_other_xids_are_classified_events(self, sampler: Sampler, node: SimNode):
        """Each Xid line is one event carrying the catalog class."""
        await sampler.poll()
        node.xid(0, 13)
        node.xid(0, 48)
        events = (await sampler.poll()).events
        assert [(e.kind, e.xid, e.xid_class) for e in events] == [
            (EventKind.XID, 13, "application"),
            (EventKind.XID, 48, "memory"),
        ]

    async def test_xid_for_unknown_bus_targets_the_pci_function(
        self, sampler: Sampler, node: SimNode
    ):
        """An Xid naming a bus id NVML never listed is kept, aimed at the PCI function."""
        await sampler.poll()
        node.kmsg.write("NVRM: Xid (PCI:0000:ee:00): 62, pid=1, name=x, halt")
        assert (await kinds(sampler)) == [(EventKind.XID, Target.pci("0000:ee:00.0"), 62)]

    async def test_nvlink_down_and_up_are_edges(self, sampler: Sampler, node: SimNode):
        """A link going down is one event; staying down is none; coming back is one."""
        await sampler.poll()
        node.nvlink_down(3, 4)
        link = Target.nvlink(node.gpus[3].uuid, 4)
        assert (await kinds(sampler)) == [(EventKind.NVLINK_DOWN, link, 0)]
        assert (await kinds(sampler)) == []
        node.nvlink_up(3, 4)
        assert (await kinds(sampler)) == [(EventKind.NVLINK_UP, link, 0)]

    async def test_link_down_at_start_is_reported(self, sampler: Sampler, node: SimNode):
        """A link already down on the first poll is a fault worth an event."""
        node.nvlink_down(0, 0)
        assert (await kinds(sampler)) == [
            (EventKind.NVLINK_DOWN, Target.nvlink(node.gpus[0].uuid, 0), 0)
        ]

    async def test_ib_flap_gives_down_up_down(self, sampler: Sampler, node: SimNode):
        """Each transition of a flapping port is an event; link_downed is in the evidence."""
        await sampler.poll()
        port = Target.ib_port("mlx5_2", 1)
        node.ib_port_down(2)
        events = (await sampler.poll()).events
        assert [(e.kind, e.target) for e in events] == [(EventKind.IB_PORT_DOWN, port)]
        assert "link_downed 1" in events[0].detail
        node.ib_port_up(2)
        assert (await kinds(sampler)) == [(EventKind.IB_PORT_UP, port, 0)]
        node.ib_port_down(2)
        assert (await kinds(sampler)) == [(EventKind.IB_PORT_DOWN, port, 0)]
        assert (await sampler.poll()).samples[port, "ib_link_downed"] == 2

    async def test_pci_remove_of_a_gpu_is_one_gpu_lost(self, sampler: Sampler, node: SimNode):
        """udev removing a GPU's function and NVML's GPU-lost are the same fault: one event."""
        await sampler.poll()
        node.pci_remove(1)
        events = (await sampler.poll()).events
        assert [(e.kind, e.target) for e in events] == [
            (EventKind.GPU_LOST, Target.gpu(node.gpus[1].uuid)),
        ]
        assert "udev" in events[0].detail
        assert (await kinds(sampler)) == []

    async def test_failed_read_is_counted_and_other_sources_go_on(
        self, sampler: Sampler, node: SimNode
    ):
        """A broken sysfs file costs that port's samples only, and is counted."""
        await sampler.poll()
        (node.sysfs.root / "class/infiniband/mlx5_0/ports/1/state").unlink()
        result = await sampler.poll()
        assert sampler.source_errors["sysfs"] == 1
        assert result.samples[Target.node(), "agent_source_errors_sysfs"] == 1  # reported too
        assert (Target.ib_port("mlx5_0", 1), "ib_state") not in result.samples
        assert result.samples[Target.ib_port("mlx5_1", 1), "ib_state"] == "ACTIVE"


def sampler_with_cursor(node: SimNode, cursor_path: Path) -> Sampler:
    """A new agent's sampler of ``node`` whose kernel log cursor lives at ``cursor_path``."""
    s = Sampler(
        nvml=NvmlSource(node.nvml),
        sysfs=SysfsReader(node.sysfs.root),
        kmsg=node.kmsg,
        udev=None,
        catalog=load_catalog(),
        clock=node.clock,
        kmsg_cursor=KmsgCursor(cursor_path, node.boot_id),
    )
    s.discover()
    return s


class TestSamplerSysfsAndKernelLog:
    async def test_pcie_link_and_aer_of_gpu_and_upstream_port(
        self, sampler: Sampler, node: SimNode
    ):
        """Each GPU and the port above it report link width/speed and AER totals."""
        result = await sampler.poll()
        gpu = Target.gpu(node.gpus[2].uuid)
        port = Target.pci(node.pcie_paths[2][1])
        for target in (gpu, port):
            assert result.samples[target, "pcie_sysfs_link_width"] == 16
            assert result.samples[target, "pcie_sysfs_link_speed_gts"] == 32.0
            assert result.samples[target, "pcie_link_width_degraded"] == 0
            assert result.samples[target, "aer_correctable_total"] == 0

    async def test_link_downgrade_shows_in_nvml_and_sysfs(self, sampler: Sampler, node: SimNode):
        """A link retrained to Gen4 x8 is seen by NVML and on both ends in sysfs."""
        node.pcie_downgrade(1, gen=4, width=8)
        result = await sampler.poll()
        gpu = Target.gpu(node.gpus[1].uuid)
        assert result.samples[gpu, "pcie_link_gen"] == 4
        assert result.samples[gpu, "pcie_link_width"] == 8
        assert result.samples[gpu, "pcie_link_width_max"] == 16
        assert result.samples[gpu, "pcie_link_width_degraded"] == 1
        assert result.samples[Target.pci(node.pcie_paths[1][1]), "pcie_link_width_degraded"] == 1

    async def test_replay_storm_is_one_aer_event_per_poll(self, sampler: Sampler, node: SimNode):
        """A storm of replays printed report by report becomes one AER event with a count,
        while the counters in NVML and sysfs carry the totals."""
        assert isinstance(node.clock, FakeClock)
        await sampler.poll()
        for _ in range(5):
            node.pcie_replays(0, 10)
        node.clock.advance(1.0)  # the sysfs counters are due again
        result = await sampler.poll()
        assert [(e.kind, e.target) for e in result.events] == [
            (EventKind.PCIE_AER, Target.gpu(node.gpus[0].uuid)),
        ]
        detail = result.events[0].detail
        assert "AER correctable" in detail
        assert "Timeout" in detail
        assert "5 reports" in detail
        gpu = Target.gpu(node.gpus[0].uuid)
        assert result.samples[gpu, "pcie_replay_count"] == 50
        assert result.samples[gpu, "aer_correctable_total"] == 50

    async def test_ib_rates_come_from_counter_deltas(self, sampler: Sampler, node: SimNode):
        """Traffic and congestion become per-second rates once two readings exist."""
        assert isinstance(node.clock, FakeClock)
        node.ib_ports[1].traffic_bytes_per_s = 4e9
        node.ib_congestion(1, 1000.0)
        await sampler.poll()
        node.clock.advance(2.0)
        node.tick(2.0)
        result = await sampler.poll()
        port = Target.ib_port("mlx5_1", 1)
        assert result.samples[port, "ib_port_xmit_bytes_per_second"] == pytest.approx(4e9)
        assert result.samples[port, "ib_port_xmit_wait_per_second"] == pytest.approx(1000.0)
        assert result.samples[port, "ib_port_xmit_bytes"] == 8_000_000_000

    async def test_ib_counters_are_not_read_more_often_than_asked(
        self, sampler: Sampler, node: SimNode
    ):
        """Counter files (firmware queries) are read at most once per interval."""
        assert isinstance(node.clock, FakeClock)
        await sampler.poll()
        node.ib_errors(0, symbol_errors=7)
        port = Target.ib_port("mlx5_0", 1)
        assert (port, "ib_symbol_error") not in (await sampler.poll()).samples  # not due yet
        node.clock.advance(1.0)
        assert (await sampler.poll()).samples[port, "ib_symbol_error"] == 7

    async def test_the_pcie_replay_counter_is_read_at_the_counter_interval(
        self, sampler: Sampler, node: SimNode
    ):
        """On a real H100 the replay counter is three quarters of a GPU's read (0.17 ms of CPU
        without it, 0.48-0.64 with): it waits for the counter interval, other GPU values do not."""
        assert isinstance(node.clock, FakeClock)
        gpu = Target.gpu(node.gpus[0].uuid)
        assert (await sampler.poll()).samples[gpu, "pcie_replay_count"] == 0
        node.gpus[0].pcie_replays = 40
        node.gpus[0].temperature_c = 77
        samples = (await sampler.poll()).samples
        assert (gpu, "pcie_replay_count") not in samples  # not due yet
        assert samples[gpu, "temperature_celsius"] == 77  # read every poll
        node.clock.advance(1.0)
        assert (await sampler.poll()).samples[gpu, "pcie_replay_count"] == 40

    async def test_a_gpu_that_keeps_failing_its_reads_is_logged_once(
        self, sampler: Sampler, node: SimNode
    ):
        """NVML's Unknown Error on every call: counted at every poll, logged once, and once
        more when the GPU reads again."""
        gpu = Target.gpu(node.gpus[1].uuid)
        with capture_logs() as logs:
            node.gpus[1].unknown_error = True
            for _ in range(4):
                last = await sampler.poll()
            assert last.samples[gpu, "nvml_read_failures"] == 4
            node.gpus[1].unknown_error = False
            await sampler.poll()
        events = [e["event"] for e in logs if e["event"].startswith("gpu_read_failed")]
        assert events == ["gpu_read_failed", "gpu_read_failed_ended"]

    async def test_saturated_counter_is_flagged(self, sampler: Sampler, node: SimNode):
        """A 16-bit error counter stuck at its top is flagged, its rate not faked as zero."""
        assert isinstance(node.clock, FakeClock)
        node.ib_errors(3, symbol_errors=70_000)
        result = await sampler.poll()
        port = Target.ib_port("mlx5_3", 1)
        assert result.samples[port, "ib_symbol_error"] == 65_535
        assert result.samples[port, "ib_symbol_error_saturated"] == 1

    async def test_memory_faults_leave_consistent_evidence(self, sampler: Sampler, node: SimNode):
        """A double-bit error: Xid 48 and Xid 63 events, DBE counters and a pending remap."""
        await sampler.poll()
        node.ecc_errors(2, sbe=3, dbe=1)
        result = await sampler.poll()
        assert [(e.kind, e.xid) for e in result.events] == [
            (EventKind.XID, 48),
            (EventKind.XID, 63),
        ]
        gpu = Target.gpu(node.gpus[2].uuid)
        assert result.samples[gpu, "ecc_dbe_volatile_total"] == 1
        assert result.samples[gpu, "ecc_sbe_aggregate_total"] == 3
        assert result.samples[gpu, "remap_pending"] == 1

    async def test_thermal_throttle_sets_reasons(self, sampler: Sampler, node: SimNode):
        """Thermal throttling shows in the clock-event reasons, temperature and SM clock."""
        node.thermal(0, 92)
        result = await sampler.poll()
        gpu = Target.gpu(node.gpus[0].uuid)
        assert int(result.samples[gpu, "clock_event_reasons"]) & 0x40
        assert result.samples[gpu, "temperature_celsius"] == 92
        assert result.samples[gpu, "sm_clock_mhz"] == 1305

    async def test_pci_recovery_and_ib_device_uevents(self, sampler: Sampler, node: SimNode):
        """PCI error recovery and HCAs coming and going are events."""
        bdf = node.gpus[0].sysfs_bus_id
        node.udev.push(
            UdevEvent(
                "change", "pci", bdf, {"ERROR_EVENT": "FAILED_RECOVERY", "DEVICE_ONLINE": "0"}
            ),
        )
        node.udev.push(UdevEvent("remove", "infiniband", "mlx5_2"))
        node.udev.push(UdevEvent("add", "infiniband", "mlx5_2"))
        events = (await sampler.poll()).events
        assert [(e.kind, e.target) for e in events] == [
            (EventKind.PCI_RECOVERY, Target.gpu(node.gpus[0].uuid)),
            (EventKind.IB_DEVICE_REMOVED, Target.node_device("mlx5_2")),
            (EventKind.IB_DEVICE_ADDED, Target.node_device("mlx5_2")),
        ]
        assert "FAILED_RECOVERY" in events[0].detail

    async def test_kmsg_cursor_skips_what_a_previous_agent_reported(
        self, node: SimNode, tmp_path: Path
    ):
        """A restarted agent of the same boot does not report old kernel lines again."""
        cursor_path = tmp_path / "state" / "kmsg-cursor.json"

        def make() -> Sampler:
            return sampler_with_cursor(node, cursor_path)

        first = make()
        node.xid(0, 13)
        result = await first.poll()
        assert [e.xid for e in result.events] == [13]
        assert result.kmsg_seq is not None
        first.commit_kmsg(result.kmsg_seq)  # what the agent does once the events are on disk
        replayed = node.kmsg.replay_all()  # a new reader of /dev/kmsg sees the whole buffer
        assert replayed
        node.xid(1, 31)
        assert [e.xid for e in (await make().poll()).events] == [31]

    async def test_a_crash_before_the_cursor_moved_repeats_nothing(
        self, node: SimNode, tmp_path: Path
    ):
        """The agent died after its events reached the spool and before the cursor file moved:
        the cursor is behind, but the events carry the record they were read up to, and the
        restarted agent resumes after the highest one its outbox restored."""
        cursor_path = tmp_path / "state" / "kmsg-cursor.json"

        def make() -> Sampler:
            return sampler_with_cursor(node, cursor_path)

        first = make()
        node.xid(0, 13)
        node.xid(2, 43)
        events = (await first.poll()).events  # ... and no commit: the crash
        assert [e.xid for e in events] == [13, 43]
        assert cursor_path.exists()  # placed before the first records, so a restart reads them
        restored = max(e.kmsg_seq for e in events)  # what Outbox.kmsg_seq() gives after a restart
        node.kmsg.replay_all()
        node.xid(1, 31)
        behind = make()
        repeated = (await behind.poll()).events
        assert [e.xid for e in repeated] == [13, 43, 31]  # the cursor alone repeats
        node.kmsg.replay_all()
        again = make()
        again.resume_kmsg_after(restored)
        assert [e.xid for e in (await again.poll()).events] == [31]


class TestCounterResets:
    async def test_hca_reset_gives_no_negative_rate(self, sampler: Sampler, node: SimNode):
        """Counters that go back to zero (HCA reset) start over: no negative or huge rate."""
        assert isinstance(node.clock, FakeClock)
        node.ib_ports[0].traffic_bytes_per_s = 1e9
        for _ in range(2):
            node.clock.advance(1.0)
            node.tick(1.0)
            await sampler.poll()
        node.sysfs.reset_ib_counters("mlx5_0", 1)
        node.clock.advance(1.0)
        node.tick(1.0)
        result = await sampler.poll()
        port = Target.ib_port("mlx5_0", 1)
        assert 0 <= float(result.samples[port, "ib_port_xmit_bytes_per_second"]) <= 1e9
        assert sampler._ib.counter_resets > 0
