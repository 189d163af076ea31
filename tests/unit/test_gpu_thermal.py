"""GPU heat as NVML reports it: the model's slowdown threshold and the clock-event reasons."""

from pathlib import Path

import pytest

from agent.probes.gpu_signals import CLOCK_REASON_SIGNALS
from agent.sampler import Sampler
from agent.sim.hardware import SimNode
from agent.sources.nvml import NvmlSource
from agent.sources.sysfs import SysfsReader
from fleetwatch.model import Target
from fleetwatch.testing import FakeClock
from rules.xid_catalog import load_catalog


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode("node-a", tmp_path / "sys", FakeClock(), gpus=2, nvlinks=2, ib_ports=1)


@pytest.fixture
def sampler(node: SimNode) -> Sampler:
    s = Sampler(
        nvml=NvmlSource(node.nvml),
        sysfs=SysfsReader(node.sysfs.root),
        kmsg=node.kmsg,
        udev=node.udev,
        catalog=load_catalog(),
        clock=node.clock,
    )
    s.discover()
    return s


class TestGpuThermal:
    async def test_threshold_and_slowdown_reasons_are_samples(
        self, sampler: Sampler, node: SimNode
    ):
        gpu = Target.gpu(node.gpus[1].uuid)
        cool = (await sampler.poll()).samples
        assert cool[gpu, "temperature_slowdown_celsius"] == 87
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
        assert samples[Target.gpu(node.gpus[1].uuid), "temperature_slowdown_celsius"] == 87
