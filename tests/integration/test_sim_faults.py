"""Faults the simulator stages itself, against a real collector: an agent cut off from its
collector for a while, and a training job that dies of a lost GPU and restarts."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import pytest

from agent.sim.scenario import Fault, FaultKind
from agent.sim.training import SimTrainingJob
from cli.main import main
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import job_fleet

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration


async def test_an_agent_cut_off_is_unreachable_then_sends_what_it_saw(running):
    """node-2's agent loses its collector for 4 s: the collector marks it unreachable; an Xid
    logged meanwhile waits in the agent's outbox and is journaled once when the link is back."""
    service, cluster = running
    await cluster.inject(Fault(0.0, "node-2", FaultKind.AGENT_CUTOFF, {"seconds": 4.0}))
    await wait_until(
        lambda: not service.fleet.snapshot()["node-2"].connected, what="the stream ends"
    )
    cluster.nodes["node-2"].xid(1, 31)
    await wait_until(
        lambda: not service.fleet.snapshot()["node-2"].reachable, timeout=10, what="unreachable"
    )
    assert not service.reader.events(node="node-2", kind="xid", limit=10)
    await wait_until(lambda: service.fleet.snapshot()["node-2"].connected, timeout=15, what="back")
    await wait_until(
        lambda: len(service.reader.events(node="node-2", kind="xid", limit=10)) == 1,
        what="the Xid journaled",
    )
    kinds = [e.kind for e in service.reader.events(node="node-2", limit=100)]
    assert kinds.count("node_unreachable") == 1
    assert kinds.count("node_reachable") == 1
    assert cluster.agents["node-2"].link.failures >= 1
    assert all(service.fleet.snapshot()[n].reachable for n in ("node-1", "node-3"))


async def test_a_job_dies_of_a_lost_gpu_and_restarts_from_its_checkpoint(
    collector_config: Any, receiver: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """A job on three nodes loses a GPU: it stops (its GPUs free), comes back from its last
    checkpoint (30 steps back) on the two healthy nodes, and the collector counts the restart,
    shows node-02's ranks missing (API, `fleetwatch jobs`), and ETTR falls."""
    nodes = ["node-01", "node-02", "node-03"]
    async with job_fleet(collector_config, receiver, tmp_path, nodes, poll_interval=0.1) as (
        service,
        cluster,
    ):
        job = SimTrainingJob.on_nodes(
            "resumable",
            [cluster.nodes[n] for n in nodes],
            cluster.job_sockets,
            SystemClock(),
            ranks_per_node=2,
            compute_s=0.02,
            comm_s=0.005,
            checkpoint_every=40,
            restart_after_s=1.0,
            node_up=cluster.running,
        )
        runner = asyncio.create_task(job.run(pace=2.0))
        try:
            await wait_until(lambda: job.step > 70, timeout=30, what="70 steps")
            assert cluster.nodes["node-02"].gpus[1].processes  # rank 3 computes there
            cluster.nodes["node-02"].xid(1, 79)
            await wait_until(lambda: job.crashes == 1, what="the job dies")
            assert "node-02 GPU 1 lost" in job.last_crash
            assert not cluster.nodes["node-01"].gpus[0].processes
            await wait_until(lambda: job.running, timeout=10, what="the restart")
            assert {p.node.name for p in job.placements} == {"node-01", "node-03"}

            def restarts() -> int:
                found = [j for j in service.jobs.summaries() if j["id"] == "resumable"]
                return int(found[0]["restarts"]) if found else 0

            await wait_until(lambda: restarts() == 1, timeout=20, what="the restart counted")
            await wait_until(
                lambda: any(j["ranks_missing"] == 2 for j in service.jobs.summaries()),
                what="node-02's two ranks missing",
            )
            (view,) = [j for j in service.jobs.summaries() if j["id"] == "resumable"]
            assert view["missing_nodes"] == ["node-02"]
            assert view["ettr"] < 1.0
            url = f"http://127.0.0.1:{service.http_port}"
            assert await asyncio.to_thread(main, ["jobs", "--api", url]) == 0
            listing = capsys.readouterr().out.splitlines()
            header = listing[0].split()
            (row,) = [line.split() for line in listing if line.startswith("resumable ")]
            assert row[header.index("MISSING")] == "2"
            assert await asyncio.to_thread(main, ["jobs", "resumable", "--api", url]) == 0
            ranks = capsys.readouterr().out
            missing = [line.split() for line in ranks.splitlines()[1:] if " node-" in line]
            assert [r[0] for r in missing if r[-1] == "missing"] == ["2", "3"]
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        assert not any(g.processes for n in cluster.nodes.values() for g in n.gpus)
