"""The simulator plays hangs (issue 40): a simulated job whose ranks are processes of their own
hangs or fails the way a real one does when a scenario's fault hits one of its ranks, and the
real agents and collector say so and name the right rank, as docs/scenarios.md promises.

Three jobs share two simulated nodes (two GPUs of each per job), so each test plays three hangs
at once: the stopped rank, the rank in another collective and the stalled filesystem; then the
rank stuck before its collective, the rank that dies and the GPU lost under a rank."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import pytest

from agent.sim.scenario import Fault, FaultKind
from agent.sim.training import SimTrainingJob
from collector.jobs.config import JobsConfig
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import api, job_fleet

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from agent.sim.cluster import SimCluster
    from collector.main import CollectorService

pytestmark = pytest.mark.integration

NODES = ["node-1", "node-2"]
# A short deadline (the default floor is 30 s); NCCL's watchdog far beyond the test.
HANGS = JobsConfig(hang_floor_s=2.0, exit_grace_s=1.0)
WATCHDOG_S = 600.0
GPUS = {"job-a": (0, 1), "job-b": (2, 3), "job-c": (4, 5)}  # each job: 2 GPUs of each node


def view(service: CollectorService, job: str) -> dict[str, Any]:
    status, body = api(service, "GET", f"/api/v1/jobs/{job}")
    return body if status == 200 else {}


@contextlib.asynccontextmanager
async def jobs(
    cluster: SimCluster, watchdog_s: dict[str, float] | None = None
) -> AsyncIterator[dict[str, SimTrainingJob]]:
    """The three jobs, stepping, each rank a process; every process ends with the test.

    NCCL's watchdog ends a hung job after ``watchdog_s[job]`` (far beyond the test unless said);
    a job it ended starts again 2 s later.
    """
    clock = SystemClock()
    made = {
        name: SimTrainingJob.on_nodes(
            name,
            list(cluster.nodes.values()),
            cluster.job_sockets,
            clock,
            gpus=gpus,
            processes=True,
            nccl_timeout_s=(watchdog_s or {}).get(name, WATCHDOG_S),
            restart_after_s=2.0,
            noise=0.0,
        )
        for name, gpus in GPUS.items()
    }
    tasks = [asyncio.create_task(job.run()) for job in made.values()]
    try:
        yield made
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def hit(cluster: SimCluster, node: str, kind: FaultKind, **params: Any) -> None:
    await cluster.inject(Fault(0.0, node, kind, params))


def culprits(service: CollectorService, job: str) -> list[str]:
    return list(view(service, job).get("culprits", []))


async def steady(service: CollectorService) -> None:
    await wait_until(
        lambda: all(view(service, j).get("step", 0) >= 20 for j in GPUS), 60, "20 steps of each job"
    )
    assert {view(service, j)["state"] for j in GPUS} == {"running"}


@pytest.mark.timeout(180)
async def test_a_stopped_rank_a_desynced_rank_and_a_stalled_filesystem(
    collector_config: Any, receiver: Any, tmp_path: Path
):
    """rank_stop on node-2 GPU 1 (job-a's rank 3): hung, rank 3 named as stopped. rank_desync on
    node-1 GPU 3 (job-b's rank 1): hung, rank 1 named by its Flight Recorder. job_stall on
    node-1: job-c (on both nodes) hung, nobody named, every rank waits in the same frame."""
    async with (
        job_fleet(collector_config, receiver, tmp_path, NODES, poll_interval=0.2, jobs=HANGS) as (
            service,
            cluster,
        ),
        jobs(cluster),
    ):
        await steady(service)
        await hit(cluster, "node-2", FaultKind.RANK_STOP, gpu=1)
        await hit(cluster, "node-1", FaultKind.RANK_DESYNC, gpu=3)
        await hit(cluster, "node-1", FaultKind.JOB_STALL, seconds=120.0)
        await wait_until(
            lambda: {view(service, j).get("state") for j in GPUS} == {"hung"}, 60, "three hangs"
        )
        await wait_until(lambda: bool(culprits(service, "job-a")), 30, "job-a's culprit")
        await wait_until(lambda: bool(culprits(service, "job-b")), 30, "job-b's culprit")
        assert culprits(service, "job-a")[0].startswith("rank 3 on node-2 GPU 1: ")
        assert "stopped" in culprits(service, "job-a")[0]
        assert culprits(service, "job-b")[0].startswith("rank 1 on node-1 GPU 3: ")
        assert "broadcast" in culprits(service, "job-b")[0]
        summary = view(service, "job-b")["summary"]
        assert "; flight recorder: rank 1 entered broadcast #" in summary
        assert "; stacks: rank 1 waits in broadcast" in summary
        assert culprits(service, "job-c") == []
        await wait_until(lambda: bool(view(service, "job-c").get("evidence")), 30, "evidence")
        stall = view(service, "job-c")["evidence"]["verdict"]
        assert "no rank stands out: every rank waits in read (local.py:353)" in stall
        for name in GPUS:
            assert view(service, name)["state"] == "hung"


@pytest.mark.timeout(180)
async def test_a_stuck_rank_a_dying_rank_and_a_lost_gpu(
    collector_config: Any, receiver: Any, tmp_path: Path
):
    """rank_stuck on node-1 GPU 0 (job-a's rank 0): hung, rank 0 named (it never entered the
    all-reduce the others wait in). rank_exit on node-2 GPU 3 (job-b's rank 3): failed, rank 3
    named. gpu_lost on node-2 GPU 4 (job-c's rank 2): its rank dies with the GPU, the job fails
    with rank 2 named and the Xid 79 as hardware evidence, gpu_hang_culprit fires; then NCCL's
    watchdog ends the job and it starts again on node-1 alone (the scheduler leaves node-2 out)."""
    async with (
        job_fleet(collector_config, receiver, tmp_path, NODES, poll_interval=0.2, jobs=HANGS) as (
            service,
            cluster,
        ),
        jobs(cluster, {"job-c": 8.0}) as made,
    ):
        await steady(service)
        await hit(cluster, "node-1", FaultKind.RANK_STUCK, gpu=0)
        await hit(cluster, "node-2", FaultKind.RANK_EXIT, gpu=3)
        await hit(cluster, "node-2", FaultKind.GPU_LOST, gpu=4)
        expect = {"job-a": "hung", "job-b": "failed", "job-c": "failed"}
        await wait_until(
            lambda: {j: view(service, j).get("state") for j in GPUS} == expect, 60, str(expect)
        )
        await wait_until(lambda: all(culprits(service, j) for j in GPUS), 30, "every culprit")
        # First named by its wait channel (a sleep, while the others wait on a read), then by
        # its Flight Recorder and stack once the evidence is in.
        await wait_until(
            lambda: "flight recorder" in culprits(service, "job-a")[0], 30, "job-a's evidence"
        )
        stuck = culprits(service, "job-a")[0]
        assert stuck.startswith("rank 0 on node-1 GPU 0: its process waits in hrtimer_nanosleep")
        assert "flight recorder: never entered all_reduce #" in stuck
        assert "_next_data (dataloader.py:1328)" in stuck
        assert culprits(service, "job-b")[0].startswith("rank 3 on node-2 GPU 3: ")
        lost = culprits(service, "job-c")[0]
        assert lost.startswith("rank 2 on node-2 GPU 4: "), lost
        assert lost.endswith("; hardware: GPU 4 lost")
        await wait_until(
            lambda: any(
                i["rule"] == "gpu_hang_culprit"
                for i in api(service, "GET", "/api/v1/incidents")[1]["incidents"]
            ),
            30,
            "gpu_hang_culprit",
        )
        [hang] = [
            i
            for i in api(service, "GET", "/api/v1/incidents")[1]["incidents"]
            if i["rule"] == "gpu_hang_culprit"
        ]
        # Its evidence is what named the rank, not a straggler's slowdown (0% while hung).
        assert hang["evidence"].startswith("culprit of job job-c: rank 2 on node-2 GPU 4: "), hang
        assert "slower" not in hang["evidence"]
        # The watchdog ends job-c (every rank gone) and it restarts on node-1's GPUs alone.
        await wait_until(lambda: made["job-c"].crashes == 1, 30, "job-c ended by its watchdog")
        assert "NCCL's watchdog" in made["job-c"].last_crash
        await wait_until(lambda: view(service, "job-c").get("state") == "running", 60, "restart")
        assert {p.node.name for p in made["job-c"].placements} == {"node-1"}
        assert view(service, "job-c")["restarts"] >= 1


@pytest.mark.timeout(180)
async def test_hardware_that_wedges_a_collective_names_the_rank_on_it(
    collector_config: Any, receiver: Any, tmp_path: Path
):
    """nvlink_down on node-2 GPU 0 (job-a's rank 2): every rank waits alike in the all-reduce,
    and only the hardware names rank 2; its node is drained (gpu_hang_culprit). nvml_hang on
    node-1 GPU 2 (job-b's rank 0): the rank blocks in torch.cuda.synchronize and never enters
    the collective, named with the wedged driver as evidence."""
    async with (
        job_fleet(collector_config, receiver, tmp_path, NODES, poll_interval=0.2, jobs=HANGS) as (
            service,
            cluster,
        ),
        jobs(cluster),
    ):
        await steady(service)
        await hit(cluster, "node-2", FaultKind.NVLINK_DOWN, gpu=0, link=3)
        await wait_until(lambda: view(service, "job-a").get("state") == "hung", 60, "job-a hung")
        await wait_until(lambda: bool(culprits(service, "job-a")), 30, "job-a's culprit")
        said = "every rank waits alike, and its node or GPU shows faults"
        wedged = culprits(service, "job-a")
        assert wedged == [f"rank 2 on node-2 GPU 0: {said}; hardware: GPU 0: 1 NVLink down"]
        await wait_until(
            lambda: any(
                (i["rule"], i["target"]) == ("gpu_hang_culprit", "node-2/gpu/0")
                for i in api(service, "GET", "/api/v1/incidents")[1]["incidents"]
            ),
            30,
            "gpu_hang_culprit on node-2/gpu/0",
        )
        # The wedged driver is the node's: played after, so that it is not job-a's evidence too.
        await hit(cluster, "node-1", FaultKind.NVML_HANG, gpu=2)
        await wait_until(lambda: view(service, "job-b").get("state") == "hung", 60, "job-b hung")
        await wait_until(
            lambda: "synchronize" in " ".join(culprits(service, "job-b")), 30, "job-b's culprit"
        )
        blocked = culprits(service, "job-b")[0]
        assert blocked.startswith("rank 0 on node-1 GPU 2: "), blocked
        assert "flight recorder: never entered all_reduce #" in blocked
        assert "hardware: NVML hung (the driver does not answer)" in blocked
        cluster.nodes["node-1"].nvml_hang_clear()
