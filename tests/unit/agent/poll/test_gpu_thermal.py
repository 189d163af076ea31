"""GPU heat as NVML reports it: the model's slowdown threshold and the clock-event reasons."""

from pathlib import Path

import pytest

from agent.poll.gpu_signals import CLOCK_REASON_SIGNALS
from agent.poll.sampler import Sampler
from agent.sim.hardware import SimNode
from agent.sources.nvml import NvmlSource
from agent.sources.sysfs import SysfsReader
from agent.testing import sim_sampler
from fleetwatch.model import Target
from fleetwatch.testing import FakeClock
from rules.xid_catalog import load_catalog


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode("node-a", tmp_path / "sys", FakeClock(), gpus=2, nvlinks=2, ib_ports=1)


@pytest.fixture
def sampler(node: SimNode) -> Sampler:
    return sim_sampler(node, pci=False, counter_interval_s=5.0)


class TestGpuThermal:
    async def test_threshold_and_slowdown_reasons_are_samples(
        self, sampler: Sampler, node: SimNode
    ):
        gpu = Target.gpu(node.gpus[1].uuid)
        cool = (await sampler.poll()).samples
        assert cool[gpu, "temperature_slowdown_celsius"] == 89
        assert {name: cool[gpu, name] for name in CLOCK_REASON_SIGNALS} == dict.fromkeys(
            CLOCK_REASON_SIGNALS, 0
        )
        node.thermal(1, 90)
        hot = (await sampler.poll()).samples
        assert hot[gpu, "temperature_celsius"] == 90
        assert hot[gpu, "clocks_hw_thermal_slowdown"] == 1
        assert hot[gpu, "clocks_sw_thermal_slowdown"] == 1
        assert hot[gpu, "clocks_hw_power_brake"] == 0

    async def test_a_gpu_without_the_threshold_reports_none(self, sampler: Sampler, node: SimNode):
        node.gpus[0].unsupported.add("nvmlDeviceGetTemperatureThreshold")
        samples = (await sampler.poll()).samples
        assert (Target.gpu(node.gpus[0].uuid), "temperature_slowdown_celsius") not in samples
        assert samples[Target.gpu(node.gpus[1].uuid), "temperature_slowdown_celsius"] == 89


class TestUnreadableGpu:
    async def test_a_gpu_answering_unknown_error_counts_its_failed_polls(
        self, sampler: Sampler, node: SimNode
    ):
        """NVML's Unknown Error on every call (nvidia-smi's "Unable to determine the device
        handle"): the GPU's failed polls are counted, and the count goes to 0 once read again."""
        gpu = Target.gpu(node.gpus[1].uuid)
        healthy = (await sampler.poll()).samples
        assert (gpu, "nvml_read_failures") not in healthy  # absent while it reads
        node.gpus[1].unknown_error = True
        counts = [(await sampler.poll()).samples[gpu, "nvml_read_failures"] for _ in range(3)]
        assert counts == [1, 2, 3]
        node.gpus[1].unknown_error = False
        assert (await sampler.poll()).samples[gpu, "nvml_read_failures"] == 0
        assert (gpu, "nvml_read_failures") not in (await sampler.poll()).samples

    async def test_a_gpu_unknown_at_discovery_is_counted_on_the_node(self, tmp_path: Path):
        node = SimNode("node-b", tmp_path / "sys", FakeClock(), gpus=4, nvlinks=2, ib_ports=1)
        node.gpus[2].unknown_error = True
        sampler = Sampler(
            nvml=NvmlSource(node.nvml),
            sysfs=SysfsReader(node.sysfs.root),
            kmsg=node.kmsg,
            udev=node.udev,
            catalog=load_catalog(),
            clock=node.clock,
        )
        inventory = sampler.discover()
        assert [g.index for g in inventory.gpus] == [0, 1, 3]
        result = await sampler.poll()
        assert result.samples[Target.node(), "gpus_unidentified"] == 1
