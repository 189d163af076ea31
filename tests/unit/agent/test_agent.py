import asyncio
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.exceptions import NoDriverError
from agent.main import build_agent
from agent.sim.cluster import sim_hardware
from agent.sim.hardware import SimNode
from agent.sim.nvml_lib import SimNvmlLibrary
from fleetwatch.testing import FakeClock, wait_until


async def test_agent_retries_until_nvml_starts(tmp_path: Path):
    """Without a driver the agent logs, backs off and tries again; it starts once NVML does."""
    clock = FakeClock()
    node = SimNode("node-a", tmp_path / "sys", clock, gpus=2, nvlinks=2, ib_ports=1)
    hardware = sim_hardware(node)
    assert isinstance(hardware.nvml, SimNvmlLibrary)
    hardware.nvml.driver_loaded = False
    agent = build_agent(AgentConfig(node="node-a", state_dir=None), hardware, clock)
    start = asyncio.create_task(agent.start())
    # Discovery runs on a thread: a failed try shows as the backoff wait on the agent's clock.
    await wait_until(lambda: clock.monotonic() > 0, what="a failed try and its backoff")
    assert not start.done()
    assert agent.sampler.inventory.driver_version == ""  # not discovered yet
    hardware.nvml.driver_loaded = True
    await asyncio.wait_for(start, 5)
    assert [gpu.index for gpu in agent.sampler.inventory.gpus] == [0, 1]


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


async def test_poll_numbers_events_into_the_outbox(tmp_path: Path):
    """A poll puts each new event in the outbox with the next sequence number."""
    clock = FakeClock()
    node = SimNode("node-a", tmp_path / "sys", clock, gpus=2, nvlinks=2, ib_ports=1)
    cfg = AgentConfig(node="node-a", state_dir=tmp_path / "state")
    agent = build_agent(cfg, sim_hardware(node), clock)
    await agent.start()
    await agent.poll_once()
    node.xid(1, 13)
    node.nvlink_down(0, 1)
    await agent.poll_once()
    assert [(e.seq, e.xid) for e in agent.outbox.after(0)] == [(1, 13), (2, 0)]
    assert agent.live.changed.is_set()


async def test_bmc_events_reach_the_outbox_and_the_sel_cursor_follows_them(tmp_path: Path):
    """A BMC read's events are numbered into the outbox with the rest, its samples go to the
    link, and the SEL cursor moves to what was read once those events are on disk."""
    import json  # noqa: PLC0415

    from fleetwatch.model import Target, event_kind_from_pb  # noqa: PLC0415

    clock = FakeClock()
    node = SimNode("node-a", tmp_path / "sys", clock, gpus=2, nvlinks=2, ib_ports=1)
    cfg = AgentConfig(node="node-a", state_dir=tmp_path / "state")
    agent = build_agent(cfg, sim_hardware(node), clock)
    await agent.start()
    assert agent.bmc is not None
    await agent.poll_bmc_once(agent.bmc)
    node.bmc.fail_fan(2)
    await agent.poll_bmc_once(agent.bmc)
    events = [(event_kind_from_pb(e.kind).value, e.target.device) for e in agent.outbox.after(0)]
    assert events == [("fan_failed", "Fan_2"), ("bmc_sel_critical", "Fan")]
    assert agent.live.values[Target.node(), "bmc_fans_failed"] == 1
    cursor = tmp_path / "state" / "bmc-sel-cursor.json"
    await wait_until(
        lambda: cursor.exists() and json.loads(cursor.read_text())["key"] == 1,
        what="the SEL cursor at the entry read",
    )
    assert json.loads(cursor.read_text())["bmc"] == "node-a-bmc"
