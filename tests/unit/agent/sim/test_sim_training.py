"""The simulated training job dies of what kills a real one, and restarts from its checkpoint."""

from collections.abc import Iterable
from pathlib import Path

import pytest

from agent.sim.hardware import SimNode
from agent.sim.training import PID_BASE, SimTrainingJob
from fleetwatch.testing import FakeClock

NODES = ("node-a", "node-b")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def nodes(tmp_path: Path, clock: FakeClock) -> dict[str, SimNode]:
    return {name: SimNode(name, tmp_path / name, clock) for name in NODES}


def job_on(
    nodes: dict[str, SimNode],
    clock: FakeClock,
    *,
    down: set[str] | None = None,
    gpus: Iterable[int] | None = None,
) -> SimTrainingJob:
    sockets = {name: Path(f"/nonexistent/{name}.sock") for name in nodes}
    crashed = down if down is not None else set()
    return SimTrainingJob.on_nodes(
        "train",
        list(nodes.values()),
        sockets,
        clock,
        ranks_per_node=4,
        checkpoint_every=10,
        nccl_timeout_s=30.0,
        restart_after_s=60.0,
        node_up=lambda name: name not in crashed,
        gpus=gpus,
    )


def running(job: SimTrainingJob) -> bool:
    """Read afresh each time (a property mypy would narrow across the steps between)."""
    return job.running


def steps(job: SimTrainingJob, clock: FakeClock, count: int, every: float = 1.0) -> None:
    for _ in range(count):
        job.run_step()
        clock.advance(every)


def test_ranks_hold_their_gpus_so_a_reset_waits(nodes, clock):
    """While the job runs each rank is a compute process on its GPU: the simulated
    nvidia-smi refuses to reset it; once the job is over the reset goes through."""
    job = job_on(nodes, clock)
    steps(job, clock, 3)
    node = nodes["node-a"]
    assert node.gpus[2].processes == [PID_BASE + 2]
    assert node.gpus[5].processes == []  # no rank of this job there
    ok, detail = node.reset_gpu(2)
    assert not ok
    assert "in use" in detail
    job.stop()
    assert node.gpus[2].processes == []
    assert node.reset_gpu(2)[0]


def test_a_lost_gpu_kills_the_job_which_restarts_from_its_checkpoint_elsewhere(nodes, clock):
    """GPU 1 of node-b falls off the bus at step 25: the job dies (its processes leave every
    GPU), reports nothing for restart_after_s, then runs again from step 20 (its last
    checkpoint) on node-a alone: its ranks keep their numbers, node-b's do not run."""
    job = job_on(nodes, clock)
    steps(job, clock, 25)
    assert job.step == 25
    nodes["node-b"].xid(1, 79)
    assert job.run_step() == 0.0
    assert (job.running, job.crashes) == (False, 1)
    assert "node-b GPU 1 lost" in job.last_crash
    assert all(not g.processes for n in nodes.values() for g in n.gpus)
    steps(job, clock, 30)
    assert not running(job)  # 30 s of the 60 s restart delay
    clock.advance(31.0)
    assert job.run_step() > 0
    assert running(job)
    assert job.step == 21  # step 20 again, from the checkpoint, and on
    assert [(p.rank, p.node.name) for p in job.placements] == [(r, "node-a") for r in range(4)]
    assert nodes["node-a"].gpus[0].processes == [PID_BASE]
    assert nodes["node-b"].gpus[0].processes == []


def test_an_ib_port_down_kills_the_job_only_past_the_nccl_timeout(nodes, clock):
    """A port that comes back within the NCCL timeout costs nothing; one down past it does."""
    job = job_on(nodes, clock)
    steps(job, clock, 5)
    nodes["node-a"].ib_port_down(3)
    steps(job, clock, 20)
    nodes["node-a"].ib_port_up(3)
    steps(job, clock, 20)
    assert (job.running, job.crashes) == (True, 0)
    nodes["node-a"].ib_port_down(3)
    steps(job, clock, 29)
    assert running(job)
    steps(job, clock, 2)
    assert not running(job)
    assert "mlx5_3/1 down past the NCCL timeout" in job.last_crash


def test_a_crashed_node_kills_the_job(nodes, clock):
    down: set[str] = set()
    job = job_on(nodes, clock, down=down)
    steps(job, clock, 5)
    down.add("node-a")
    job.run_step()
    assert not job.running
    assert job.last_crash == "node-a crashed"


def test_two_jobs_share_the_nodes_on_their_own_gpus(nodes, clock):
    """Jobs on GPUs 0-5 and 6-7 of every node hold only their own GPUs."""
    big = job_on(nodes, clock, gpus=range(6))
    small = SimTrainingJob.on_nodes(
        "finetune",
        list(nodes.values()),
        {name: Path(f"/nonexistent/{name}.sock") for name in nodes},
        clock,
        gpus=(6, 7),
    )
    big.run_step()
    small.run_step()
    assert len(big.placements) == 12
    assert len(small.placements) == 4
    node = nodes["node-b"]
    assert [bool(g.processes) for g in node.gpus] == [True] * 8
    assert node.gpus[7].processes == [PID_BASE + 3]
    assert node.gpus[5].processes == [PID_BASE + 11]
