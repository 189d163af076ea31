"""A training job whose rank dies on a GPU with hardware faults is requeued in a real Slurm,
kept off that node, and released; with requeue off the job is left alone; ranks that only say
they are the job's are not its ranks (issue 40).

The job is a real batch job (``sbatch``) on node-01, the loopback Slurm's node with a slurmd
(tests/slurm_harness.py), and its ranks are real processes that report their steps under its
Slurm job id to the simulated nodes' agents, as ``fleetwatch.jobclient`` does under Slurm. The
agents read /proc through a tests/proc_overlay.py overlay that shows the ranks in the job's
Slurm cgroup (the harness's Slurm runs without cgroups), so the agents vouch for them as Slurm
job J, as on a node. Rank 1 (on node-01) is killed after an Xid on its GPU: the collector calls
the job failed, names rank 1, and the rule with ``gpu_hang_culprit``'s own condition fires on
node-01's GPU and runs its actions.
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
from tests.proc_overlay import ProcOverlay, slurm_cgroup
from tests.slurm_harness import SlurmCluster, slurm_cluster

if TYPE_CHECKING:
    from asyncio.subprocess import Process
    from collections.abc import AsyncIterator, Iterator

pytestmark = pytest.mark.integration

CULPRIT = "node-01"  # the Slurm node that runs the job
OTHER = "node-03"
# node-01 is the only node that runs jobs (the others are spares with no slurmd); the job does
# not ask for it by name (excluded, it could never start again), it excludes the spares.
SPARES = "node-[02-04]"
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
# A rank: once the file argv[5] exists, reports a step every 0.1 s while it does, then waits
# (as ranks wait in a collective that a dead rank never joins).
RANK = """\
import os, sys, time
from fleetwatch.jobclient import report_step
sock, job, rank, world, go = sys.argv[1:6]
while not os.path.exists(go):
    time.sleep(0.02)
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
    slurm: SlurmCluster,
    collector_config: Any,
    tmp_path: Path,
    *,
    requeue: bool,
    in_job: bool = True,
) -> AsyncIterator[tuple[CollectorService, str]]:
    """A collector acting through the real Slurm (``requeue`` on or off), a running batch job,
    its two ranks on node-03 and node-01 (in the job's Slurm cgroup unless not ``in_job``: then
    processes of the same user outside the job that report its id); GPU 0 of node-01 takes an
    Xid and its rank is killed.

    Yields (collector, Slurm job id) once gpu_hang_culprit fires on node-01's GPU 0.
    """
    job = slurm.submit(None, "-x", SPARES, "--requeue")
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
    proc = ProcOverlay(tmp_path / "proc")
    cluster = SimCluster(
        [OTHER, CULPRIT],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.1,
        heartbeat_interval=0.5,
        job_socket_dir=sockets,
        proc_root=proc.root,
    )
    cluster.start()
    go = tmp_path / "go"
    ranks: list[Process] = []
    try:
        await wait_until(
            lambda: all(p.exists() for p in cluster.job_sockets.values()), what="job sockets"
        )
        for rank, node in enumerate((OTHER, CULPRIT)):
            argv = [str(cluster.job_sockets[node]), job, str(rank), "2", str(go)]
            ranks.append(await asyncio.create_subprocess_exec(sys.executable, "-c", RANK, *argv))
            proc.add(ranks[-1].pid, slurm_cgroup(job) if in_job else "0::/user.slice\n")
        go.touch()
        await wait_until(
            lambda: [j for j, _, _ in service.jobs.on_gpu(CULPRIT, 0)] == [job],
            30,
            "rank 1 of the job on node-01 GPU 0",
        )
        owner = service.jobs.jobs[job].owner
        assert owner == (f"Slurm job {job}" if in_job else f"uid {os.getuid()}"), owner
        await wait_until(lambda: _step(service, job) >= 20, 30, "20 steps of the job")
        cluster.nodes[CULPRIT].xid(0, 79)  # the GPU falls off the bus ...
        go.unlink()  # ... every rank waits in the collective ...
        os.kill(ranks[1].pid, signal.SIGKILL)  # ... and rank 1's process dies without a word
        await wait_until(lambda: _firing(service), 90, "gpu_hang_culprit firing on node-01")
        yield service, job
    finally:
        for child in ranks:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
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
    node-01 besides what it excluded, is released (not held), and the journal says so; node-01
    is drained first."""
    async with hardware_fault_kills_a_rank(slurm, collector_config, tmp_path, requeue=True) as (
        service,
        job,
    ):
        row = await _requeue_row(service)
        assert (row.state, row.params) == ("succeeded", {"exclude_node": True, "job": job})
        # Slurm shows the requeued job COMPLETING while its old run's processes are killed; it
        # must then be queued again (or already running on another node).
        after = slurm.wait_for_job(
            job,
            lambda j: j.restarts == 1 and not j.held and j.state in ("PENDING", "RUNNING"),
        )
        assert after.excluded == f"{SPARES},{CULPRIT}", after.excluded
        assert row.detail.startswith(f"slurm: job {job} requeued (restart 1), excluding {CULPRIT}")
        assert "released" in row.detail
        assert slurm.node(CULPRIT).drained or slurm.node(CULPRIT).draining
        tally = {(a, o) for (a, o, _), _, _ in service.dispatcher.tally.snapshot()}
        assert ("requeue_job", "succeeded") in tally


@pytest.mark.timeout(180)
async def test_with_requeue_off_the_job_is_left_alone(slurm, collector_config, tmp_path):
    """With ``requeue`` off (the default) the same fault drains node-01 but the job keeps
    running where it was, nothing more excluded; the journal says the requeue was skipped."""
    async with hardware_fault_kills_a_rank(slurm, collector_config, tmp_path, requeue=False) as (
        service,
        job,
    ):
        row = await _requeue_row(service)
        assert (row.state, row.params.get("job")) == ("skipped", job)
        assert row.detail.startswith("requeue is off")
        await wait_until(lambda: slurm.node(CULPRIT).draining, 20, "node-01 draining")
        untouched = slurm.job(job)
        assert (untouched.state, untouched.restarts, untouched.excluded) == ("RUNNING", 0, SPARES)


@pytest.mark.timeout(180)
async def test_ranks_that_only_claim_the_job_id_requeue_nothing(slurm, collector_config, tmp_path):
    """Ranks outside the Slurm job (same user, no Slurm cgroup) report under its job id: the
    collector knows their job only as the uid's, so requeue_job has no Slurm job to requeue
    and the real job runs on untouched (any user could name anyone's job id)."""
    async with hardware_fault_kills_a_rank(
        slurm, collector_config, tmp_path, requeue=True, in_job=False
    ) as (service, job):
        row = await _requeue_row(service)
        assert row.state == "skipped", row
        assert row.detail.startswith(f"no Slurm job is known on {CULPRIT}/gpu/0"), row.detail
        assert "job" not in row.params, row.params
        untouched = slurm.job(job)
        assert (untouched.state, untouched.restarts, untouched.excluded) == ("RUNNING", 0, SPARES)
