"""A disk that holds an fsync: the agent's loop goes on, and the spool's order holds."""

import asyncio
import contextlib
import dataclasses
import os
import threading
from functools import partial
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.jobs.listener import JobQueue
from agent.main import build_agent
from agent.sim.cluster import sim_hardware
from agent.sim.hardware import SimNode
from agent.sources.kmsg_cursor import KmsgCursor
from collector.main import CollectorService
from collector.model.state import NodeState
from fleetwatch.clock import SystemClock
from fleetwatch.jobclient import report_step
from fleetwatch.testing import wait_until

pytestmark = pytest.mark.integration

# The most a held fsync waits before it goes on anyway (only reached if the loop is stuck).
HOLD_LIMIT_S = 30.0


class HeldDisk:
    """fsync that waits, once held, until let go (or for HOLD_LIMIT_S, then for good)."""

    def __init__(self) -> None:
        self.free = threading.Event()
        self.free.set()
        self.waiting = 0

    def hold(self) -> None:
        self.free.clear()

    def __call__(self, fd: int) -> None:
        self.waiting += 1
        if not self.free.wait(HOLD_LIMIT_S):
            self.free.set()
        self.waiting -= 1
        os.fsync(fd)


def all_read(jobs: JobQueue | None, sent: int) -> bool:
    """Whether the agent took ``sent`` step reports off its socket (kept or refused)."""
    assert jobs is not None
    return jobs.received + jobs.lost >= sent


async def test_a_held_fsync_holds_the_events_back_but_not_the_loop(
    collector_config, tmp_path: Path
):
    """The spool's fsync waits on the disk. Meanwhile a second Xid written to the kernel log
    becomes a numbered event, step reports are read off the job socket and heartbeats go on;
    but neither Xid reaches the collector and the kernel log cursor stays before them until
    the fsync returns. Then both arrive and the cursor passes them."""
    service = CollectorService(collector_config(), SystemClock())
    await service.start()
    clock = SystemClock()
    node = SimNode("node-1", tmp_path / "sys", clock)
    state = tmp_path / "state"
    cursor = KmsgCursor(state / "kmsg-cursor.json", node.boot_id)
    disk = HeldDisk()
    hardware = dataclasses.replace(sim_hardware(node), kmsg_cursor=cursor, fsync=disk)
    cfg = AgentConfig(
        collector=f"127.0.0.1:{service.grpc_port}",
        node="node-1",
        poll_interval=0.2,
        heartbeat_interval=0.2,
        state_dir=state,
        job_socket=tmp_path / "jobs.sock",
        memory_max_bytes=0,
        poll_cpu_max_share=0.0,
    )
    agent = build_agent(cfg, hardware, clock)
    running = asyncio.create_task(agent.run())

    def node_state() -> NodeState:
        return service.fleet.snapshot()["node-1"]

    def xids(gpu: int, xid: int) -> int:
        return node_state().gpus[node.gpus[gpu].uuid].xid_counts[xid]

    try:
        await wait_until(lambda: "node-1" in service.fleet.snapshot(), what="first report")
        node.xid(0, 13)  # before the hold: journaled, and the cursor moved past it
        await wait_until(lambda: xids(0, 13) == 1, what="the first Xid journaled")
        await agent.outbox.settled()  # the cursor's write follows the fsync on the disk thread
        before = cursor.load()
        assert before is not None
        disk.hold()
        node.xid(3, 13)
        await wait_until(lambda: disk.waiting == 1, what="its fsync to wait on the disk")
        node.xid(5, 31)
        await wait_until(lambda: agent.outbox.last_seq == 3, what="the next Xid numbered")
        for step in range(30):
            assert report_step("train", 0, step, 1.0, gpu=0, socket_path=str(cfg.job_socket))
            await wait_until(partial(all_read, agent.jobs, step + 1), what="report read")
        seen = node_state().last_seen_unix
        await wait_until(lambda: node_state().last_seen_unix > seen + 1.0, what="heartbeats")
        # All of that while the fsync still waits: nothing of it was sent, the cursor stayed.
        assert disk.waiting == 1
        assert not disk.free.is_set()
        assert agent.outbox.after(0) == []
        assert (xids(3, 13), xids(5, 31)) == (0, 0)
        assert cursor.load() == before
        read_up_to = agent.outbox.kmsg_seq()  # the record the second Xid was read from
        assert read_up_to > before
        disk.free.set()
        await wait_until(lambda: (xids(3, 13), xids(5, 31)) == (1, 1), what="both journaled")
        await wait_until(lambda: cursor.load() == read_up_to, what="the cursor past them")
    finally:
        disk.free.set()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await service.stop(grace=None)
