"""A simulated job whose ranks are processes: each rank is a real process the faults act on, the
job holds while its ranks hang, NCCL's watchdog ends it, and a GPU reset waits until it did.

No agent listens here (the reports go nowhere); what the agent reads of these processes is
played through the real agents in tests/integration/test_sim_hangs.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agent.sim.hardware import SimNode
from agent.sim.rank_process import Recorder
from agent.sim.rank_processes import WAIT_FRAMES
from agent.sim.scenario import Fault, FaultKind, apply_fault
from agent.sim.training import SimTrainingJob
from fleetwatch.testing import FakeClock, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

NODES = ("node-a", "node-b")
WATCHDOG_S = 30.0
RESTART_S = 10.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def nodes(tmp_path: Path, clock: FakeClock) -> dict[str, SimNode]:
    return {name: SimNode(name, tmp_path / name, clock) for name in NODES}


@pytest.fixture
def job(nodes: dict[str, SimNode], clock: FakeClock) -> Iterator[SimTrainingJob]:
    """2 ranks on each node, each a process; every process is gone after the test."""
    made = SimTrainingJob.on_nodes(
        "train",
        list(nodes.values()),
        {name: Path(f"/nonexistent/{name}.sock") for name in nodes},
        clock,
        ranks_per_node=2,
        nccl_timeout_s=WATCHDOG_S,
        restart_after_s=RESTART_S,
        processes=True,
    )
    yield made
    made.stop()


def steps(job: SimTrainingJob, clock: FakeClock, count: int, every: float = 1.0) -> int:
    """Run ``count`` steps of ``every`` seconds; how many of them stepped."""
    stepped = 0
    for _ in range(count):
        stepped += job.run_step() > 0
        clock.advance(every)
    return stepped


def pids(job: SimTrainingJob) -> list[int]:
    return [p.node.gpus[p.gpu].processes[0] for p in job.placements]


def state(pid: int) -> str:
    """The process's state letter in /proc ("" once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ""
    return text.rsplit(")", 1)[1].split()[0]


def hit(nodes: dict[str, SimNode], node: str, kind: FaultKind, **params: object) -> None:
    apply_fault(Fault(0.0, node, kind, dict(params)), nodes[node])


def test_each_rank_is_a_process_of_its_own_on_its_gpu(job, clock):
    """Each rank's real pid is the compute process NVML lists on its GPU."""
    steps(job, clock, 2)
    held = pids(job)
    assert len(set(held)) == 4
    assert os.getpid() not in held
    assert all(state(pid) in {"R", "S"} for pid in held)


async def test_a_stopped_rank_holds_the_job_until_the_watchdog_ends_it(job, nodes, clock):
    """rank_stop: the rank is stopped (T), no rank steps; after NCCL's timeout every process
    is gone, the GPUs are free (a reset that waited goes through), and the job starts again
    on new processes."""
    steps(job, clock, 3)
    stopped = pids(job)[3]
    hit(nodes, "node-b", FaultKind.RANK_STOP, gpu=1)
    assert steps(job, clock, 5) == 0
    await wait_until(lambda: state(stopped) == "T", 5.0, "the rank stopped")  # signals are async
    ok, detail = nodes["node-b"].reset_gpu(1)
    assert not ok
    assert "in use" in detail
    assert steps(job, clock, int(WATCHDOG_S)) == 0
    assert job.crashes == 1
    assert "rank 3 on node-b GPU 1: stop" in job.last_crash
    assert "NCCL's watchdog ended the job after 30 s" in job.last_crash
    await wait_until(lambda: state(stopped) == "", 5.0, "the stopped rank killed")
    assert nodes["node-b"].gpus[1].processes == []
    assert nodes["node-b"].reset_gpu(1)[0]
    assert steps(job, clock, int(RESTART_S) + 3) > 0  # restarted on the same nodes
    assert len(job.placements) == 4
    assert stopped not in pids(job)


def test_a_port_back_before_the_watchdog_lets_the_job_go_on(job, nodes, clock):
    """An IB port down holds every rank in the collective; back before NCCL's timeout, the job
    steps again and nothing was ended."""
    steps(job, clock, 3)
    before = pids(job)
    hit(nodes, "node-a", FaultKind.IB_DOWN, port=2)
    assert steps(job, clock, 10) == 0
    hit(nodes, "node-a", FaultKind.IB_UP, port=2)
    assert steps(job, clock, 3) == 3
    assert job.crashes == 0
    assert pids(job) == before


def test_a_port_down_past_the_watchdog_ends_the_job_which_leaves_the_node_out(job, nodes, clock):
    steps(job, clock, 3)
    hit(nodes, "node-a", FaultKind.IB_DOWN, port=2)
    assert steps(job, clock, int(WATCHDOG_S) + 2) == 0
    assert job.crashes == 1
    assert "node-a IB port mlx5_2/1 down; NCCL's watchdog" in job.last_crash
    assert steps(job, clock, int(RESTART_S) + 3) > 0
    assert {p.node.name for p in job.placements} == {"node-b"}


def test_a_stall_holds_every_rank_in_one_frame_then_the_job_goes_on(job, nodes, clock):
    """job_stall: every rank's stack in the filesystem read, no step, no crash; after the
    stall's seconds the job steps again and the stacks are back to the collective's."""
    steps(job, clock, 3)
    hit(nodes, "node-b", FaultKind.JOB_STALL, seconds=20.0)
    assert steps(job, clock, 15) == 0
    for node in nodes.values():
        assert len(node.stacks.stacks) == 2
        assert all(held == WAIT_FRAMES["stall"] for held in node.stacks.stacks.values())
    assert steps(job, clock, 10) > 0
    assert job.crashes == 0
    assert all(not node.stacks.stacks for node in nodes.values())


async def test_a_lost_gpu_ends_its_rank_at_once_and_the_job_at_the_watchdog(job, nodes, clock):
    """gpu_lost: the rank on it dies of a CUDA error (its process exits with status 1, as an
    uncaught exception ends Python); the others wait until the watchdog."""
    steps(job, clock, 3)
    lost = pids(job)[1]
    hit(nodes, "node-a", FaultKind.GPU_LOST, gpu=1)
    steps(job, clock, 1)
    await wait_until(lambda: state(lost) in {"", "Z"}, 5.0, "the lost GPU's rank exited")
    assert job.crashes == 0
    steps(job, clock, int(WATCHDOG_S) + 1)
    assert job.crashes == 1
    assert "node-a GPU 1 lost" in job.last_crash


def test_a_stuck_and_a_desynced_rank_stand_in_their_own_frames(job, nodes, clock):
    steps(job, clock, 3)
    hit(nodes, "node-a", FaultKind.RANK_STUCK, gpu=0)
    steps(job, clock, 1)
    assert nodes["node-a"].stacks.stacks == {pids(job)[0]: WAIT_FRAMES["stuck"]}


def test_a_job_that_ends_ends_its_ranks_normally(nodes, clock, job):
    steps(job, clock, 3)
    held = pids(job)
    job.stop()
    assert all(state(pid) == "" for pid in held)
    assert all(not g.processes for n in nodes.values() for g in n.gpus)


class TestRecorder:
    def test_the_last_collectives_in_torchs_json_format(self):
        """What the agent's reader takes (agent/jobs/flight_recorder.py reads torch's dump)."""
        recorder = Recorder()
        for seq in range(1, 12):
            recorder.record(seq, "all_reduce", "completed")
        recorder.record(12, "broadcast", "started")
        dump = json.loads(json.dumps(recorder.dump()))
        assert dump["pg_status"]["0"] == {
            "last_enqueued_collective": 12,
            "last_started_collective": 12,
            "last_completed_collective": 11,
        }
        entries = dump["entries"]
        assert [e["collective_seq_id"] for e in entries] == list(range(5, 13))
        assert entries[-1]["profiling_name"] == "nccl:broadcast"
        assert entries[-1]["process_group"] == ["0", "default_pg"]

    def test_an_empty_recorder(self):
        dump = json.loads(json.dumps(Recorder().dump()))
        assert dump["pg_status"]["0"]["last_enqueued_collective"] == -1
