"""A node whose NVML hangs keeps reporting: its Xids still arrive, its heartbeats go on."""

from functools import partial
from pathlib import Path

import pytest

from agent.jobs.listener import JobQueue
from agent.sim.cluster import SimCluster
from collector.main import CollectorService
from collector.model.state import NodeState
from fleetwatch.clock import SystemClock
from fleetwatch.jobclient import report_step
from fleetwatch.testing import wait_for_more, wait_until

pytestmark = pytest.mark.integration

# Far beyond anything this file waits for: what must happen during a hang happens before it.
LONG_DEADLINE_S = 30.0


def all_read(jobs: JobQueue | None, sent: int) -> bool:
    """Whether the agent took ``sent`` step reports off its socket (kept or refused)."""
    assert jobs is not None
    return jobs.received + jobs.lost >= sent


async def test_an_xid_arrives_while_nvml_hangs_and_heartbeats_go_on(collector_config, tmp_path):
    """NVML on one GPU hangs for good: the collector learns it (agent_nvml_hung), an Xid written
    to the kernel log meanwhile is journaled within seconds, the node never goes unreachable,
    and once NVML answers again the node says so."""
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
    sim, agent = cluster.nodes["node-1"], cluster.agents["node-1"]

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
            what="the Xid journaled",
        )
        # several polls, each of which would time out again, and heartbeats, all while NVML hangs
        await wait_for_more(lambda: agent.polls, 5, what="5 polls during the hang")
        await wait_until(
            lambda: service.fleet.snapshot()["node-1"].last_seen_unix > seen_before,
            what="a heartbeat during the hang",
        )
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


async def test_the_loop_runs_on_while_the_first_hung_call_waits(collector_config, tmp_path: Path):
    """NVML hangs and its deadline is far off: before it passes, an Xid written to the kernel
    log meanwhile is journaled, step reports sent meanwhile are read off the job socket, one
    at a time, and heartbeats go on. The agent shares the event loop with the collector here,
    as simulated agents do in the demo: a loop held by the wait would hold them all."""
    service = CollectorService(collector_config(), SystemClock())
    await service.start()
    cluster = SimCluster(
        ["node-1"],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.2,
        heartbeat_interval=0.2,
        nvml_call_timeout=LONG_DEADLINE_S,
        state_dir=tmp_path / "state",
    )
    cluster.start()
    sim, agent = cluster.nodes["node-1"], cluster.agents["node-1"]
    guard = agent.sampler._nvml.guard
    socket_path = str(cluster.job_sockets["node-1"])

    def node_state() -> NodeState:
        return service.fleet.snapshot()["node-1"]

    try:
        await wait_until(lambda: "node-1" in service.fleet.snapshot(), what="first report")
        sim.nvml_hang(4)
        # Two calls stuck: NVML's event wait, and the poll's GPU read, now waiting its deadline.
        await wait_until(lambda: sim.nvml.blocked == 2, what="the GPU read to hang")
        seen = node_state().last_seen_unix
        sim.xid(6, 31)
        for step in range(30):  # three times what the socket queues unread
            assert report_step("train", 0, step, 1.0, gpu=0, socket_path=socket_path)
            await wait_until(partial(all_read, agent.jobs, step + 1), what="report read")
        gpu6 = sim.gpus[6].uuid
        await wait_until(
            lambda: node_state().gpus[gpu6].xid_counts[31] == 1, what="the Xid journaled"
        )
        await wait_until(lambda: node_state().last_seen_unix > seen + 1.0, what="heartbeats")
        # All of it within the first hung call's deadline: it is still waiting.
        assert sim.nvml.blocked == 2
        assert guard.timed_out == 0
        assert node_state().reachable
    finally:
        sim.nvml_hang_clear()
        await cluster.stop()
        await service.stop(grace=None)
