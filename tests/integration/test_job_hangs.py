"""A real torch.distributed job (4 gloo ranks on the CPU, two on each of two agents) hangs and
fails for real: a rank is stopped (SIGSTOP), then killed. The collector calls the job hung,
naming the stopped rank, then failed, naming the killed one (issue 40). A job that ends normally
is checked in test_torch_straggler.py: finished, never hung."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from collector.jobs.config import JobsConfig
from fleetwatch.testing import free_port, wait_until
from tests.integration.fleet_harness import api, job_fleet

if TYPE_CHECKING:
    from collector.main import CollectorService

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "jobs" / "torch_job.py"
NODES = ["node-1", "node-2"]
PLACES = {0: "node-1", 1: "node-1", 2: "node-2", 3: "node-2"}  # rank -> the agent it reports to
JOB = "torch-hang"
# A deadline the 2-core machine's healthy steps never come near (5 x p99 is far less).
HANGS = JobsConfig(hang_floor_s=5.0, exit_grace_s=2.0)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed (make unit does it)"
)


def job(service: CollectorService) -> dict[str, Any]:
    status, body = api(service, "GET", f"/api/v1/jobs/{JOB}")
    return body if status == 200 else {}


def firing(service: CollectorService) -> set[str]:
    _, body = api(service, "GET", "/api/v1/incidents")
    return {i["rule"] for i in body["incidents"] if i["phase"] == "firing"}


@pytest.mark.timeout(240)
async def test_a_stopped_rank_hangs_the_job_and_a_killed_one_fails_it(
    collector_config: Any, receiver: Any, tmp_path: Path
):
    """SIGSTOP rank 3: within its deadline plus a few polls the job is hung, job_hung fires and
    rank 3 on node-2 is named (its process is stopped). SIGKILL it: gloo ends the others in an
    exception, and the job is failed, job_rank_lost fires, rank 3 named first (it ended
    without a word)."""
    async with job_fleet(
        collector_config, receiver, tmp_path, NODES, poll_interval=0.2, jobs=HANGS
    ) as (service, cluster):
        port = free_port()
        procs = []
        for rank, node in PLACES.items():
            argv = [
                str(SCRIPT),
                f"--rank={rank}",
                f"--world-size={len(PLACES)}",
                f"--master-port={port}",
                f"--job={JOB}",
                "--steps=1000000",
                f"--socket={cluster.job_sockets[node]}",
            ]
            with (tmp_path / f"rank{rank}.log").open("wb") as out:
                procs.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable, *argv, cwd=ROOT, stdout=out, stderr=out
                    )
                )
        try:
            await wait_until(lambda: job(service).get("step", 0) >= 20, 120, "20 steps of the job")
            assert job(service)["state"] == "running"
            os.kill(procs[3].pid, signal.SIGSTOP)
            stopped = time.monotonic()
            await wait_until(lambda: "job_hung" in firing(service), 60, "job_hung firing")
            took = time.monotonic() - stopped
            hung = job(service)
            assert hung["state"] == "hung"
            assert took < hung["hang_deadline_s"] + 15, (took, hung)
            assert hung["culprits"][0].startswith("rank 3 on node-2"), hung["culprits"]
            assert "its process is stopped" in hung["culprits"][0]
            assert hung["culprit_nodes"] == ["node-2"]
            procs[3].kill()
            await wait_until(lambda: "job_rank_lost" in firing(service), 60, "job_rank_lost")
            lost = job(service)
            assert lost["state"] == "failed"
            assert lost["culprits"][0] == (
                "rank 3 on node-2 GPU 0: its process ended without a word (killed?)"
            ), lost["culprits"]
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()
