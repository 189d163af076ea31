"""A node whose NVML hangs keeps reporting: its Xids still arrive, its heartbeats go on."""

import asyncio

import pytest

from agent.sim.cluster import SimCluster
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until

pytestmark = pytest.mark.integration


async def test_an_xid_arrives_while_nvml_hangs_and_heartbeats_go_on(collector_config, tmp_path):
    """NVML on one GPU hangs for good: the collector learns it (agent_nvml_hung), an Xid written
    to the kernel log meanwhile is journaled within seconds, the node never goes unreachable,
    and once NVML answers again the node says so."""
    # Silence of 10 s makes a node unreachable: more than the one wait at the hang's start
    # (nvml_call_timeout, 5 s by default), during which the agent's loop is held.
    service = CollectorService(collector_config(missed_heartbeats=20), SystemClock())
    await service.start()
    cluster = SimCluster(
        ["node-1"],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.2,
        heartbeat_interval=0.2,
        nvml_call_timeout=1.0,
    )
    cluster.start()
    sim = cluster.nodes["node-1"]

    def node_signal(name: str) -> object:
        node = service.fleet.snapshot().get("node-1")
        return None if node is None else node.signals.get(name)

    try:
        await wait_until(lambda: node_signal("agent_nvml_hung") == 0, what="first report")
        sim.nvml_hang(4)
        await wait_until(lambda: node_signal("agent_nvml_hung") == 1, what="hang reported")
        assert node_signal("agent_nvml_calls_timed_out") == 1

        seen_before = service.fleet.snapshot()["node-1"].last_seen_unix
        sim.xid(6, 31)
        gpu6 = sim.gpus[6].uuid
        await wait_until(
            lambda: service.fleet.snapshot()["node-1"].gpus[gpu6].xid_counts[31] == 1,
            timeout=5,
            what="the Xid journaled",
        )
        await asyncio.sleep(1.0)  # several heartbeat intervals, all while NVML hangs
        state = service.fleet.snapshot()["node-1"]
        assert state.reachable
        assert state.last_seen_unix > seen_before
        assert node_signal("agent_nvml_hung") == 1  # all of it happened during the hang
        assert node_signal("agent_nvml_calls_timed_out") == 1  # refused since, not timed out

        sim.nvml_hang_clear(4)
        await wait_until(lambda: node_signal("agent_nvml_hung") == 0, what="NVML back")
    finally:
        await cluster.stop()
        await service.stop(grace=None)
