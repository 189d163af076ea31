"""A real torch.distributed job (4 gloo ranks on the CPU, two on each of two agents) hangs and
fails for real: a rank is stopped (SIGSTOP), then killed. The collector calls the job hung,
naming the stopped rank, then failed, naming the killed one (issue 40). Another job hangs because
one rank sleeps before an all-reduce the others wait in: the agents dump every rank's stack (real
py-spy), and the collector names the sleeping rank by its stack. A third hangs because one rank
broadcasts while the others all-reduce: the ranks' Flight Recorders (torch's own, served through
fleetwatch.jobclient) show it out of step, and the collector names it. A job that ends normally
is checked in test_torch_straggler.py: finished, never hung."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent.jobs.stacks import PySpyDumper, find_py_spy
from cli import api as cli_api
from collector.jobs.config import JobsConfig
from fleetwatch.testing import free_port, wait_until
from tests.integration.fleet_harness import api, job_fleet

if TYPE_CHECKING:
    from asyncio.subprocess import Process

    from collector.main import CollectorService

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "jobs" / "torch_job.py"
NODES = ["node-1", "node-2"]
PLACES = {0: "node-1", 1: "node-1", 2: "node-2", 3: "node-2"}  # rank -> the agent it reports to
JOB = "torch-hang"
# A deadline the 2-core machine's healthy steps never come near (5 x p99 is far less).
HANGS = JobsConfig(hang_floor_s=5.0, exit_grace_s=2.0)
SLEEPER = 2  # on node-2
SLEEP_AT_STEP = 30
SLEEP_LINE = next(  # the line the sleeping rank waits at (py-spy names it)
    n
    for n, line in enumerate(SCRIPT.read_text(encoding="utf-8").splitlines(), 1)
    if "time.sleep(args.sleep_s)" in line
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed (make unit does it)"
)


def job(service: CollectorService) -> dict[str, Any]:
    status, body = api(service, "GET", f"/api/v1/jobs/{JOB}")
    return body if status == 200 else {}


def firing(service: CollectorService) -> set[str]:
    _, body = api(service, "GET", "/api/v1/incidents")
    return {i["rule"] for i in body["incidents"] if i["phase"] == "firing"}


async def start_ranks(
    tmp_path: Path, sockets: dict[str, Path], *extra: str, env: dict[str, str] | None = None
) -> list[Process]:
    """One process per rank of PLACES, each reporting to its node's agent (``env`` added)."""
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
            f"--socket={sockets[node]}",
            *extra,
        ]
        with (tmp_path / f"rank{rank}.log").open("wb") as out:
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    *argv,
                    cwd=ROOT,
                    stdout=out,
                    stderr=out,
                    env={**os.environ, **(env or {})},
                )
            )
    return procs


async def end(procs: list[Process]) -> None:
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


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
        procs = await start_ranks(tmp_path, cluster.job_sockets)
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
            await end(procs)


@pytest.mark.skipif(os.geteuid() != 0, reason="py-spy reads other processes' stacks as root")
@pytest.mark.timeout(240)
async def test_a_rank_sleeping_before_the_all_reduce_is_named_by_its_stack(
    collector_config: Any, receiver: Any, tmp_path: Path
):
    """Rank 2 sleeps before step 30's all-reduce, the 3 others wait in it. The job is hung;
    the agents dump every rank (py-spy) at once, unasked by anyone; the evidence groups ranks
    0, 1 and 3 in torch.distributed's all_reduce and names rank 2 on node-2, sleeping in its
    training loop, as the culprit. ``fleetwatch jobs JOB --dump`` gathers it again and prints
    the same verdict."""
    # The simulated nodes' agents read real stacks: only the hardware is simulated here.
    async with job_fleet(
        collector_config,
        receiver,
        tmp_path,
        NODES,
        poll_interval=0.2,
        stacks=PySpyDumper(find_py_spy()),
        jobs=HANGS,
    ) as (service, cluster):
        procs = await start_ranks(
            tmp_path,
            cluster.job_sockets,
            f"--sleep-rank={SLEEPER}",
            f"--sleep-at-step={SLEEP_AT_STEP}",
            "--gloo-timeout-s=600",
        )
        try:
            await wait_until(lambda: job(service).get("step", 0) >= 20, 120, "20 steps of the job")
            await wait_until(lambda: "job_hung" in firing(service), 60, "job_hung firing")
            await wait_until(lambda: bool(job(service).get("evidence")), 30, "the evidence")
            hung = job(service)
            assert hung["state"] == "hung"
            evidence = hung["evidence"]
            assert [n["node"] for n in evidence["nodes"]] == NODES, evidence["nodes"]
            assert all(not n["error"] and n["ranks"] == 2 for n in evidence["nodes"]), evidence
            assert evidence["took_s"] < 15.0
            waiting, sleeping = evidence["groups"]
            assert (waiting["ranks"], waiting["collective"]) == ([0, 1, 3], True), evidence
            assert any(
                f.startswith("all_reduce@") and "torch/distributed/" in f
                for f in waiting["signature"]
            ), waiting
            assert sleeping["ranks"] == [SLEEPER]
            assert any(f.endswith(f"torch_job.py:{SLEEP_LINE}") for f in sleeping["signature"])
            assert [(s["rank"], s["node"]) for s in evidence["suspects"]] == [(SLEEPER, "node-2")]
            assert evidence["verdict"].startswith(
                f"rank {SLEEPER} waits in train (torch_job.py:{SLEEP_LINE}) while 3 ranks wait "
                "in all_reduce (distributed_c10d.py:"
            ), evidence["verdict"]
            assert hung["culprits"][0].startswith(f"rank {SLEEPER} on node-2"), hung["culprits"]
            assert f"stack: waits in train (torch_job.py:{SLEEP_LINE})" in hung["culprits"][0]
            assert hung["culprit_nodes"] == ["node-2"]
            by_rank = {r["rank"]: r for r in evidence["ranks"]}
            assert sorted(by_rank) == [0, 1, 2, 3]
            assert by_rank[SLEEPER]["pid"] == procs[SLEEPER].pid
            out = io.StringIO()
            api_url = f"http://127.0.0.1:{service.http_port}"
            await asyncio.to_thread(cli_api.jobs, api_url, JOB, output="table", out=out, dump=True)
            printed = out.getvalue()
            assert f"rank {SLEEPER} waits in train (torch_job.py:{SLEEP_LINE})" in printed
            assert f"  suspect: rank {SLEEPER} on node-2: stack: waits in train" in printed
        finally:
            await end(procs)


@pytest.mark.timeout(240)
async def test_a_rank_broadcasting_while_the_others_all_reduce_is_named_by_its_flight_recorder(
    collector_config: Any, receiver: Any, tmp_path: Path
):
    """Rank 2 calls a broadcast before step 30's all-reduce; the 3 others enter the all-reduce.
    The ranks run with torch's Flight Recorder on (TORCH_FR_BUFFER_SIZE), so each serves it to
    its agent. The job is hung; the stacks are simulated here (all in all_reduce: nobody stands
    out by stack), and the recorders name rank 2: it entered broadcast #N of default_pg while 3
    ranks entered all_reduce #N."""
    async with job_fleet(
        collector_config, receiver, tmp_path, NODES, poll_interval=0.2, jobs=HANGS
    ) as (service, cluster):
        procs = await start_ranks(
            tmp_path,
            cluster.job_sockets,
            f"--broadcast-rank={SLEEPER}",
            f"--sleep-at-step={SLEEP_AT_STEP}",
            "--gloo-timeout-s=600",
            env={"TORCH_FR_BUFFER_SIZE": "64"},
        )
        try:
            await wait_until(lambda: "job_hung" in firing(service), 120, "job_hung firing")
            await wait_until(lambda: bool(job(service).get("evidence")), 30, "the evidence")
            hung = job(service)
            evidence = hung["evidence"]
            recorders = evidence["flight_recorder"]
            assert recorders is not None, evidence
            assert recorders["ranks"] == [0, 1, 2, 3], evidence["ranks"]
            by_rank = {r["rank"]: r for r in evidence["ranks"]}
            groups = by_rank[0]["collectives"]
            assert [g["name"] for g in groups] == ["default_pg"], groups
            seq = groups[0]["last_enqueued"]
            assert by_rank[SLEEPER]["collectives"][0]["recent"][-1] == f"broadcast #{seq}"
            assert by_rank[0]["collectives"][0]["recent"][-1] == f"all_reduce #{seq}"
            assert [s["rank"] for s in recorders["suspects"]] == [SLEEPER], recorders
            said = (
                f"flight recorder: entered broadcast #{seq} of default_pg while 3 ranks entered "
                f"all_reduce #{seq} (out of step)"
            )
            assert recorders["suspects"][0]["why"] == said
            told = f"flight recorder: rank {SLEEPER} entered broadcast #{seq}"
            assert evidence["verdict"].startswith(told)
            assert hung["culprits"][0].startswith(f"rank {SLEEPER} on node-2"), hung["culprits"]
            assert said in hung["culprits"][0]
            assert hung["culprit_nodes"] == ["node-2"]
        finally:
            await end(procs)
