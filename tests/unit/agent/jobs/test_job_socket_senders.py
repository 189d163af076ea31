"""The job socket ties each report to its sender: real processes of other uids, a real socket."""

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from agent.jobs.claims import MAX_JOBS_PER_UID, SenderCheck
from agent.jobs.listener import CONNECTIONS_PER_UID, JobQueue, serve_job_socket
from agent.jobs.peer_identity import PeerResolver
from agent.jobs.report import JobReportError
from fleetwatch import jobclient
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import WireError
from fleetwatch.wire.validate_jobs import MAX_DATAGRAM_BYTES, validate_job_step
from tests.job_node import INVENTORY, open_job_socket
from tests.rank_process import (
    cgroup_root,
    deliver,
    in_cgroup,
    pod_uid,
    ranks,
    shared_dir,
    step_reports,
)

VICTIM, ATTACKER = 2001, 2002


@pytest.fixture(autouse=True)
def _clean_client(monkeypatch):
    jobclient._unsent[0] = 0
    for name in ("LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def agent_socket():
    """A real job socket at a path every uid can reach, feeding a queue that looks in /proc."""
    async with open_job_socket() as opened:
        yield opened


def read(queue: JobQueue):
    return lambda: queue.received + sum(queue.refused.values())


def by_uid(steps: list[pb.JobStep]) -> dict[int, set[tuple[str, int]]]:
    out: dict[int, set[tuple[str, int]]] = {}
    for s in steps:
        out.setdefault(s.sender_uid, set()).add((s.job_id, s.rank))
    return out


# ---- the queue's share per uid ------------------------------------------------------------------


def _step(n: int) -> pb.JobStep:
    return pb.JobStep(job_id="j", rank=0, step=n, time_unix_ms=1, step_time_s=1.0)


def test_a_full_queue_drops_from_the_uid_holding_the_most():
    """One uid's flood pushes out its own oldest reports, never another uid's."""
    queue = JobQueue(limit=10)
    for n in range(3):
        queue.add(_step(n), uid=VICTIM)
    for n in range(100, 200):
        queue.add(_step(n), uid=ATTACKER)
    assert queue.held_by(VICTIM) == 3
    assert queue.held_by(ATTACKER) == 7
    assert queue.dropped == 93
    steps = queue.take()
    assert [s.step for s in steps] == [0, 1, 2, *range(193, 200)]
    assert len(queue) == 0


def test_a_lone_uid_may_use_the_whole_queue():
    queue = JobQueue(limit=10)
    for n in range(10):
        queue.add(_step(n), uid=VICTIM)
    assert (len(queue), queue.dropped) == (10, 0)


def test_shedding_for_events_takes_the_biggest_holders_reports_first():
    queue = JobQueue()
    queue.add(_step(1), uid=VICTIM)
    for n in range(5):
        queue.add(_step(10 + n), uid=ATTACKER)
    for _ in range(3):
        assert queue.shed(1) > 0  # one report each
    assert [s.step for s in queue.take()] == [1, 13, 14]


def test_many_evictions_leave_the_queue_in_order_and_small():
    """Holes left by evictions are compacted: the order survives a long flood."""
    queue = JobQueue(limit=4)
    queue.add(_step(0), uid=VICTIM)
    for n in range(1, 10_000):
        queue.add(_step(n), uid=ATTACKER)
    assert len(queue._order) < 100
    assert [s.step for s in queue.take()] == [0, 9997, 9998, 9999]


def test_refusals_become_node_signals_by_reason():
    queue = JobQueue()
    queue.add(_step(1), uid=VICTIM)
    queue.reject(JobReportError("job_owned", "x"))
    queue.reject(JobReportError("job_owned", "x"))
    queue.reject(JobReportError("too_large", "x"))
    assert queue.samples() == {
        "agent_job_reports": 1,
        "agent_job_reports_lost": 3,
        "agent_job_reports_refused_job_owned": 2,
        "agent_job_reports_refused_too_large": 1,
    }


def test_a_connection_the_kernel_names_no_process_for_is_refused():
    """SO_PEERCRED gives pid 0 for a process in a pid namespace the agent cannot see."""
    check = SenderCheck(PeerResolver(Path("/proc")), SystemClock())
    with pytest.raises(JobReportError) as caught:
        check.sender(None)
    assert caught.value.reason == "no_credentials"


# ---- datagram size ----------------------------------------------------------------------------


def padded(size: int) -> bytes:
    report = {"v": 1, "job": "j", "rank": 0, "step": 1, "time": 1.7e9, "step_time": 1.0}
    base = len(json.dumps(dict(report, pad="")).encode())
    data = json.dumps(dict(report, pad="x" * (size - base))).encode()
    assert len(data) == size
    return data


async def test_datagrams_over_2_kib_are_refused_as_too_large(agent_socket):
    """2048 bytes is the documented limit: a byte more is refused and counted, whatever it says."""
    path, queue = agent_socket
    assert MAX_DATAGRAM_BYTES == jobclient.MAX_DATAGRAM == 2048
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sender:
        sender.connect(str(path))
        sender.send(padded(2048))
        sender.send(padded(2049))
        sender.send(padded(200_000))
        await wait_until(lambda: read(queue)() == 3, 5)
    assert queue.received == 1
    assert queue.refused == {"too_large": 2}


# ---- real senders under other uids ------------------------------------------------------------


async def test_another_user_cannot_report_for_a_job_a_user_runs_here(agent_socket):
    """The impersonation of issue 18 on one node: uid 2002 sends steps for ranks 4-11 of uid
    2001's job with half the step time; every one is refused as job_owned and counted, and only
    the owner's reports, marked with its uid, reach the queue."""
    path, queue = agent_socket
    with ranks(VICTIM, ATTACKER) as (victim, attacker):
        await deliver(
            victim,
            step_reports("victim", range(4), range(2), path, step_time=2.0, world_size=12),
            read(queue),
        )
        await deliver(
            attacker,
            step_reports("victim", range(4, 12), range(2), path, step_time=1.0, world_size=12),
            read(queue),
        )
    assert queue.refused == {"job_owned": 16}
    steps = queue.take()
    assert by_uid(steps) == {VICTIM: {("victim", r) for r in range(4)}}
    assert {s.sender_start_unix_ms > 0 for s in steps} == {True}
    assert {s.scheduler_job for s in steps} == {""}


async def test_one_user_cannot_fill_the_node_with_made_up_jobs(agent_socket):
    """1,100 made-up job ids from one uid: it holds its share; another user's job still gets in."""
    path, queue = agent_socket
    with ranks(ATTACKER, VICTIM) as (attacker, victim):
        flood = [((f"fake-{i}", 0, 1, 1.0), {"socket_path": str(path)}) for i in range(1100)]
        await deliver(attacker, flood, read(queue))
        await deliver(victim, step_reports("real-job", range(2), range(1), path), read(queue))
    assert queue.refused == {"uid_jobs_full": 1100 - MAX_JOBS_PER_UID}
    held = by_uid(queue.take())
    assert len({job for job, _ in held[ATTACKER]}) == MAX_JOBS_PER_UID
    assert held[VICTIM] == {("real-job", 0), ("real-job", 1)}
    assert queue.samples()["agent_job_reports_refused_uid_jobs_full"] == 1100 - MAX_JOBS_PER_UID


async def test_a_sender_gone_before_its_report_is_read_is_refused(agent_socket):
    """Its cgroup cannot be read any more: refused (sender_gone), never taken on trust."""
    path, queue = agent_socket
    with ranks(VICTIM) as (rank,):
        assert rank.send(step_reports("j", range(1), range(1), path)) == [True]
        rank.stop()  # the loop has not run: the datagram waits in the kernel
    await wait_until(lambda: read(queue)() == 1, 5)
    assert queue.refused == {"sender_gone": 1}


# ---- the sender's scheduler job ---------------------------------------------------------------


async def test_slurm_identity_from_an_injected_proc_root(tmp_path):
    """A real sender, looked up under a proc root whose cgroup says Slurm job 1234 (v1 layout):
    only job 1234 is accepted, and a report naming no job is taken as job 1234."""
    with shared_dir() as where, ranks(VICTIM) as (rank,):
        real = Path(f"/proc/{rank.pid}")
        (tmp_path / str(rank.pid)).mkdir()
        (tmp_path / str(rank.pid) / "stat").write_text((real / "stat").read_text())
        (tmp_path / str(rank.pid) / "cgroup").write_text(
            "4:memory:/slurm/uid_2001/job_1234/step_0/task_0\n0::/\n"
        )
        (tmp_path / "stat").write_text(Path("/proc/stat").read_text())
        queue = JobQueue(senders=SenderCheck(PeerResolver(tmp_path), SystemClock()))
        path = where / "jobs.sock"
        reader = await serve_job_socket(path, 0o666, queue, lambda: INVENTORY)
        try:
            await deliver(rank, step_reports("llama", range(1), range(1), path), read(queue))
            await deliver(rank, step_reports(None, range(2), range(1), path), read(queue))
            await deliver(rank, step_reports("1234", range(2, 3), range(1), path), read(queue))
        finally:
            reader.close()
    assert queue.refused == {"job_mismatch": 1}
    steps = queue.take()
    assert [(s.job_id, s.rank, s.scheduler_job) for s in steps] == [
        ("1234", 0, "slurm:1234"),
        ("1234", 1, "slurm:1234"),
        ("1234", 2, "slurm:1234"),
    ]


@pytest.fixture
def cgroups():
    root = cgroup_root()
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    return root


async def test_a_rank_in_a_real_slurm_cgroup_reports_only_its_job(agent_socket, cgroups):
    """The kernel puts the rank in /system.slice/slurmstepd.scope/job_<id>/... (Slurm's cgroup
    v2 layout): its job is that id; another user outside the job cannot report for it."""
    path, queue = agent_socket
    job = "7" + str(abs(hash(path)) % 10**8)
    cgroup = f"/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0"
    with ranks(VICTIM, ATTACKER) as (rank, other), in_cgroup(cgroups, cgroup, rank.pid):
        assert f"0::{cgroup}" in Path(f"/proc/{rank.pid}/cgroup").read_text()
        await deliver(rank, step_reports(None, range(2), range(1), path), read(queue))
        await deliver(rank, step_reports("not-my-job", range(1), range(1), path), read(queue))
        await deliver(other, step_reports(job, range(2, 4), range(1), path), read(queue))
    assert queue.refused == {"job_mismatch": 1, "job_owned": 2}
    steps = queue.take()
    assert {(s.job_id, s.rank, s.sender_uid) for s in steps} == {(job, 0, VICTIM), (job, 1, VICTIM)}
    assert {s.scheduler_job for s in steps} == {f"slurm:{job}"}


async def test_a_rank_in_a_real_pod_cgroup_reports_as_pods_of_its_uid(agent_socket, cgroups):
    """A rank in a kubelet-style pod cgroup (systemd driver, underscores) carries the pod UID;
    a process of the same uid outside any pod cannot report for the pod's job."""
    path, queue = agent_socket
    pod = pod_uid()
    cgroup = (
        "/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{pod.replace('-', '_')}.slice/cri-containerd-0a1b2c.scope"
    )
    with ranks(VICTIM, VICTIM) as (rank, outside), in_cgroup(cgroups, cgroup, rank.pid):
        await deliver(rank, step_reports("run7", range(1), range(1), path), read(queue))
        await deliver(outside, step_reports("run7", range(1, 2), range(1), path), read(queue))
    assert queue.refused == {"job_owned": 1}
    (step,) = queue.take()
    assert (step.job_id, step.scheduler_job, step.sender_uid) == ("run7", f"k8s:{pod}", VICTIM)


@pytest.mark.parametrize(
    ("fields", "ok"),
    [
        ({"scheduler_job": "slurm:1234"}, True),
        ({"scheduler_job": "k8s:8f2c1a4e-3b7d-4c1e-9a0f-1d2e3f4a5b6c"}, True),
        ({"scheduler_job": "slurm:12a"}, False),
        ({"scheduler_job": "k8s:8f2c1a4e_3b7d_4c1e_9a0f_1d2e3f4a5b6c"}, False),
        ({"scheduler_job": "pbs:77"}, False),
        ({"sender_start_unix_ms": -1}, False),
        ({"sender_start_unix_ms": 1_767_225_600_000, "sender_uid": 0}, True),
    ],
)
def test_the_collector_checks_what_the_agent_says_of_the_sender(fields, ok):
    step = pb.JobStep(job_id="j", rank=0, step=1, time_unix_ms=1, step_time_s=1.0, **fields)
    if ok:
        validate_job_step(step)
    else:
        with pytest.raises(WireError, match=r"scheduler_job|sender_start"):
            validate_job_step(step)


async def busy_agent() -> None:
    """The agent's loop as its polls keep it: busy 5 ms of every 10 (reading NVML, sysfs)."""
    while True:
        time.sleep(0.005)
        await asyncio.sleep(0.005)


async def test_one_users_flood_does_not_drop_another_users_reports(agent_socket):
    """Issue 38 #5: uid 2002 floods its connection as fast as it can, while uid 2001's rank
    sends 320 reports a millisecond apart and the agent's loop is busy half the time. Each
    connection has its own kernel queue: the flooder's own sends find theirs full, and every
    one of the victim's is sent and taken. (With one datagram socket, whose kernel queue all
    senders share, the victim's sends failed as the flooder's did.)"""
    path, queue = agent_socket
    polling = asyncio.create_task(busy_agent())
    with ranks(ATTACKER, VICTIM) as (attacker, victim):
        attacker.flood(("flood", 0, 0, 1.0), {"socket_path": str(path)})
        await wait_until(lambda: queue.held_by(ATTACKER) > 0, 30, "the flood's first reports")
        real = step_reports("real", range(1), range(320), path)
        sent_real = await asyncio.to_thread(victim.send, real, 0.001)
        _, full = await asyncio.to_thread(attacker.end_flood)
        await wait_until(lambda: queue.held_by(VICTIM) == 320, 30, "the victim's 320 reports")
    polling.cancel()
    assert full > 0  # the flooder's own queue was full at times
    assert sent_real == [True] * 320
    steps = []
    while batch := queue.take():
        steps += batch
    assert sorted(s.step for s in steps if s.sender_uid == VICTIM) == list(range(320))


async def test_a_user_holds_at_most_its_share_of_connections(agent_socket):
    """Connections beyond CONNECTIONS_PER_UID from one uid are closed at once and counted; the
    ones it holds, and another uid's, still report."""
    path, queue = agent_socket
    mine = []
    try:
        for _ in range(CONNECTIONS_PER_UID + 3):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.connect(str(path))
            mine.append(conn)
        await wait_until(lambda: queue.refused["uid_connections_full"] == 3, 5, "3 refusals")
        for conn in mine[:CONNECTIONS_PER_UID]:
            conn.send(
                json.dumps(
                    {"v": 1, "job": "j", "rank": 0, "step": 1, "time": 1.7e9, "step_time": 1.0}
                ).encode()
            )
        await wait_until(lambda: queue.received == CONNECTIONS_PER_UID, 5, "their reports")
        with ranks(VICTIM) as (victim,):
            await deliver(victim, step_reports("other", range(1), range(2), path), read(queue))
        assert queue.held_by(VICTIM) == 2
    finally:
        for conn in mine:
            conn.close()
