import asyncio
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.exceptions import NoDriverError
from agent.main import build_agent
from agent.sim.cluster import sim_hardware
from agent.sim.hardware import SimNode
from agent.sim.nvml_lib import SimNvmlLibrary
from fleetwatch.testing import FakeClock


async def test_a_node_without_nvml_library_stops_the_agent_at_once(tmp_path: Path):
    """No libnvidia-ml at all: no backoff and retry (nothing will install it), one clear error."""
    clock = FakeClock()
    node = SimNode("node-a", tmp_path / "sys", clock, gpus=2, nvlinks=2, ib_ports=1)
    hardware = sim_hardware(node)
    assert isinstance(hardware.nvml, SimNvmlLibrary)
    hardware.nvml.library_installed = False
    agent = build_agent(AgentConfig(node="node-a", state_dir=None), hardware, clock)
    with pytest.raises(NoDriverError, match=r"no NVIDIA driver found .* use --simulate"):
        await asyncio.wait_for(agent.start(), 10)
    assert clock.monotonic() == 0  # not a moment of backoff
