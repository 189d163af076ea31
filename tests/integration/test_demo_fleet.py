"""The demo's simulated fleet in processes of its own, streaming to a real collector."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agent.sim.scenario import Fault, FaultKind
from cli.demo.fleet_procs import (
    FleetProcessError,
    FleetProcesses,
    FleetSpec,
    demo_intervals,
    groups_for,
)
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

NODES = ["node-01", "node-02", "node-03", "node-04"]


def test_nodes_are_shared_out_in_order_up_to_one_process_per_cpu():
    names = [f"node-{i:03d}" for i in range(1, 257)]
    assert [len(g) for g in groups_for(names, cpus=2)] == [128, 128]
    assert [len(g) for g in groups_for(names, cpus=16)] == [64, 64, 64, 64]
    assert groups_for(NODES, cpus=8) == [NODES]
    assert groups_for(names, cpus=2)[0][0] == "node-001"


def test_a_big_fleet_polls_less_often():
    assert demo_intervals(4, 0.5, 1.0) == (0.5, 1.0)
    assert demo_intervals(256, 0.5, 1.0) == (2.0, 4.0)


async def test_two_fleet_processes_stream_to_the_collector(
    collector_config: Callable[..., CollectorConfig], tmp_path: Path
):
    """Four nodes in two processes: every agent connects, a fault goes to the process that
    holds its node and reaches the journal, each process runs its own job, and a fault for a
    node with no such GPU is an error that names it."""
    service = CollectorService(collector_config(), SystemClock())
    await service.start()
    sockets = Path(tempfile.mkdtemp(prefix="fwdf", dir="/tmp"))
    fleet = FleetProcesses(
        NODES,
        FleetSpec(
            collector=f"127.0.0.1:{service.grpc_port}",
            root=tmp_path / "nodes",
            sockets=sockets,
            poll_interval=0.2,
            heartbeat_interval=0.5,
            job="shared",
            checkpoint_every=20,
            nccl_timeout_s=3.0,
            restart_after_s=3.0,
        ),
        cpus=2,
        per_process=2,
    )
    try:
        assert fleet.groups == [NODES[:2], NODES[2:]]
        assert fleet.jobs == ["shared", "shared-2"]
        await fleet.start()

        async def connected() -> int:
            return (await fleet.status())["connected"]

        for _ in range(200):
            if await connected() == len(NODES):
                break
            await asyncio.sleep(0.1)
        assert sum(n.connected for n in service.fleet.snapshot().values()) == len(NODES)
        await fleet.inject(Fault(0.0, "node-03", FaultKind.XID, {"gpu": 1, "xid": 31}))
        await wait_until(
            lambda: len(service.reader.events(node="node-03", kind="xid", limit=5)) == 1,
            what="the Xid journaled",
        )
        await wait_until(
            lambda: {j["id"] for j in service.jobs.summaries()} == {"shared", "shared-2"},
            timeout=30,
            what="both jobs reporting",
        )
        with pytest.raises(FleetProcessError, match="no such GPU"):
            await fleet.inject(Fault(0.0, "node-01", FaultKind.XID, {"gpu": 12, "xid": 31}))

        async def all_acked() -> bool:
            return (await fleet.status())["unacked"] == 0

        # An event journaled (the Xid, or one the jobs raised) is acked a moment later.
        await wait_until(all_acked, what="every event acked")
    finally:
        await fleet.stop()
        await service.stop(grace=None)
