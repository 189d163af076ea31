"""A training job whose rank dies on a GPU with hardware faults is requeued in a real Slurm,
kept off that node, and released; with requeue off the job is left alone (issue 40).

The job is a real batch job (``sbatch``) in the loopback Slurm of tests/slurm_harness.py, and
its ranks are real processes that report their steps under its Slurm job id to the simulated
nodes' agents, as ``fleetwatch.jobclient`` does under Slurm. Rank 1 (on node-02) is killed
after an Xid on its GPU: the collector calls the job failed, names rank 1, and the rule with
``gpu_hang_culprit``'s own condition fires on node-02's GPU and runs its actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent.sim.cluster import SimCluster
from collector.actions.config import ActionsConfig, SlurmConfig
from collector.jobs.config import JobsConfig
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from rules.loader import load_rules
from tests.slurm_harness import SlurmCluster, slurm_cluster

if TYPE_CHECKING:
    from asyncio.subprocess import Process
    from collections.abc import AsyncIterator, Iterator

pytestmark = pytest.mark.integration

CULPRIT = "node-02"
OTHER = "node-03"
# The built-in rule's condition, so the test follows what ships.
HANG_CULPRIT = next(r for r in load_rules().rules if r.name == "gpu_hang_culprit")
RULES = f"""\
version: 1
rules:
  - name: gpu_hang_culprit
    scope: gpu
    when: '{HANG_CULPRIT.when}'
    severity: critical
    actions: [drain_node, {{requeue_job: {{exclude_node: true}}}}]
"""
# A rank: reports a step every 0.1 s while the file argv[5] exists, then waits (as ranks wait
# in a collective that a dead rank never joins).
RANK = """\
import os, sys, time
from fleetwatch.jobclient import report_step
sock, job, rank, world, go = sys.argv[1:6]
step = 0
while os.path.exists(go):
    report_step(job, int(rank), step, 0.1, 512, compute_time=0.08, gpu=0,
                world_size=int(world), socket_path=sock)
    step += 1
    time.sleep(0.1)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    with slurm_cluster(spares=3) as running:
        yield running


@contextlib.asynccontextmanager
async def hardware_fault_kills_a_rank(
    slurm: SlurmCluster, collector_config: Any, tmp_path: Path, *, requeue: bool
) -> AsyncIterator[tuple[CollectorService, str]]:
    """A collector acting through the real Slurm (``requeue`` on or off), a running batch job,
    its two ranks on node-03 and node-02; GPU 0 of node-02 takes an Xid and its rank is killed.

    Yields (collector, Slurm job id) once gpu_hang_culprit fires on node-02's GPU 0.
    """
    job = slurm.submit(slurm.real_node, "--requeue")
    slurm.wait_for_job(job, lambda j: j.state == "RUNNING")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    acts = ActionsConfig(slurm=SlurmConfig(enabled=True, slurm_conf=slurm.conf, requeue=requeue))
    service = CollectorService(
        collector_config(
            actions=acts,
            rules=(rules,),
            rules_interval=0.1,
            jobs=JobsConfig(hang_floor_s=5.0, exit_grace_s=2.0),
        ),
        SystemClock(),
    )
    await service.start()
    sockets = Path(tempfile.mkdtemp(prefix="fwrq", dir="/tmp"))
    cluster = SimCluster(
        [OTHER, CULPRIT],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.1,
        heartbeat_interval=0.5,
        job_socket_dir=sockets,
    )
    cluster.start()
    go = tmp_path / "go"
    go.touch()
    ranks: list[Process] = []
    try:
        await wait_until(
            lambda: all(p.exists() for p in cluster.job_sockets.values()), what="job sockets"
        )
        for rank, node in enumerate((OTHER, CULPRIT)):
            argv = [str(cluster.job_sockets[node]), job, str(rank), "2", str(go)]
            ranks.append(await asyncio.create_subprocess_exec(sys.executable, "-c", RANK, *argv))
        await wait_until(
            lambda: [j for j, _, _ in service.jobs.on_gpu(CULPRIT, 0)] == [job],
            30,
            "rank 1 of the job on node-02 GPU 0",
        )
        await wait_until(lambda: _step(service, job) >= 20, 30, "20 steps of the job")
        cluster.nodes[CULPRIT].xid(0, 79)  # the GPU falls off the bus ...
        go.unlink()  # ... every rank waits in the collective ...
        os.kill(ranks[1].pid, signal.SIGKILL)  # ... and rank 1's process dies without a word
        await wait_until(lambda: _firing(service), 90, "gpu_hang_culprit firing on node-02")
        yield service, job
    finally:
        for proc in ranks:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        await cluster.stop()
        await service.stop(grace=None)
        slurm.cancel_all()
        slurm.run("scontrol", "update", f"NodeName={CULPRIT}", "State=RESUME", check=False)


def _step(service: CollectorService, job: str) -> int:
    state = service.jobs.jobs.get(job)
    return state.steps[-1].step if state is not None and state.steps else 0


async def _firing(service: CollectorService) -> bool:
    rows = await service.journal.do(lambda s: s.incidents.incidents(open_only=True))
    return any(
        r.rule == "gpu_hang_culprit" and r.target == f"{CULPRIT}/gpu/0" and r.phase == "firing"
        for r in rows
    )


async def _requeue_row(service: CollectorService) -> Any:
    """The journaled requeue_job of node-02, once it has an outcome."""
    for _ in range(200):
        rows = await service.journal.do(lambda s: s.incidents.actions(node=CULPRIT))
        done = [r for r in rows if r.action == "requeue_job" and r.state != "running"]
        if done and done[0].state != "planned":
            return done[0]
        await asyncio.sleep(0.1)
    msg = f"no requeue_job outcome journaled for {CULPRIT}: {rows}"
    raise AssertionError(msg)


@pytest.mark.timeout(180)
async def test_culprit_job_is_requeued_without_its_node(slurm, collector_config, tmp_path):
    """With ``requeue = true`` the job is requeued (Restarts 1, back to PENDING), excludes
    node-02, is released (not held), and the journal says so; node-02 is drained first."""
    async with hardware_fault_kills_a_rank(slurm, collector_config, tmp_path, requeue=True) as (
        service,
        job,
    ):
        row = await _requeue_row(service)
        assert (row.state, row.params) == ("succeeded", {"exclude_node": True, "job": job})
        after = slurm.wait_for_job(job, lambda j: j.restarts == 1 and not j.held)
        assert after.state in ("PENDING", "RUNNING"), after
        assert after.excluded is not None
        assert CULPRIT in after.excluded.split(","), after.excluded
        assert row.detail.startswith(f"slurm: job {job} requeued (restart 1), excluding {CULPRIT}")
        assert "released" in row.detail
        assert slurm.node(CULPRIT).drained or slurm.node(CULPRIT).draining
        tally = {(a, o) for (a, o, _), _, _ in service.dispatcher.tally.snapshot()}
        assert ("requeue_job", "succeeded") in tally


@pytest.mark.timeout(180)
async def test_with_requeue_off_the_job_is_left_alone(slurm, collector_config, tmp_path):
    """With ``requeue`` off (the default) the same fault drains node-02 but the job keeps
    running where it was, nothing excluded; the journal says the requeue was skipped."""
    async with hardware_fault_kills_a_rank(slurm, collector_config, tmp_path, requeue=False) as (
        service,
        job,
    ):
        row = await _requeue_row(service)
        assert (row.state, row.params.get("job")) == ("skipped", job)
        assert row.detail.startswith("requeue is off")
        await wait_until(lambda: slurm.node(CULPRIT).drained, 20, "node-02 drained")
        untouched = slurm.job(job)
        assert (untouched.state, untouched.restarts, untouched.excluded) == ("RUNNING", 0, None)
