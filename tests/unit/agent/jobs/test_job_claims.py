import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from agent.config import AgentConfig, load_agent_config
from agent.exceptions import ConfigError
from agent.jobs.claims import (
    MAX_JOBS_PER_POD,
    MAX_JOBS_PER_UID,
    MAX_RANKS_PER_OWNER,
    NODE_SHARES,
    RESCAN_S,
    JobClaims,
    Owner,
    owner_of,
)
from agent.jobs.peer_identity import Peer, PeerResolver, SchedulerJob
from agent.jobs.report import JobReportError
from agent.main import build_agent
from agent.sim.cluster import sim_hardware
from agent.sim.hardware import SimNode
from fleetwatch.testing import FakeClock

POD = "8f2c1a4e-3b7d-4c1e-9a0f-1d2e3f4a5b6c"


def peer(pid: int, uid: int, scheduler: SchedulerJob | None = None) -> Peer:
    return Peer(pid, uid, uid, start_ticks=pid * 10, start_unix_ms=0, scheduler=scheduler)


class Processes:
    """Which (pid, start) run, and how often the claims asked."""

    def __init__(self) -> None:
        self.gone: set[int] = set()
        self.asked = 0

    def alive(self, pid: int, start: int) -> bool:
        self.asked += 1
        return pid not in self.gone and start == pid * 10


@pytest.fixture
def procs():
    return Processes()


@pytest.fixture
def claims(procs):
    return JobClaims(procs.alive)


def reason(claims: JobClaims, job: str, sender: Peer, now: float = 0.0, rank: int = 0) -> str:
    with pytest.raises(JobReportError) as caught:
        claims.admit(job, sender, now, rank)
    return caught.value.reason


def agent_claims(tmp_path: Path, setting: str) -> tuple[AgentConfig, JobClaims, Peer]:
    """A real agent built from an agent.toml holding ``setting``: its config, its job claims,
    and this process as a sender."""
    toml = tmp_path / "agent.toml"
    toml.write_text(f"[agent]\n{setting}\n")
    cfg = load_agent_config(toml, {})
    clock = FakeClock()
    node = SimNode("node-a", tmp_path / "sys", clock, gpus=1, nvlinks=1, ib_ports=1)
    agent = build_agent(
        replace(cfg, job_socket=tmp_path / "j.sock", state_dir=None), sim_hardware(node), clock
    )
    assert agent.jobs is not None
    me = Peer(os.getpid(), 1000, 1000, PeerResolver(Path("/proc")).started(os.getpid()), 0, None)
    return cfg, agent.jobs.senders.claims, me


def test_owners_are_the_slurm_job_pods_of_a_uid_or_a_uid():
    assert owner_of(peer(1, 1000, SchedulerJob("slurm", "12"))) == Owner("slurm", "12")
    assert owner_of(peer(1, 1000, SchedulerJob("k8s", POD))) == Owner("k8s", "1000")
    assert owner_of(peer(1, 1000)) == Owner("uid", "1000")
    assert Owner("k8s", "0").describe() == "pods of uid 0"


def test_the_first_uid_owns_a_job_id_and_other_uids_are_refused(claims):
    claims.admit("llama", peer(100, 1000), 0.0)
    claims.admit("llama", peer(101, 1000), 0.0)  # another rank of the same user
    assert reason(claims, "llama", peer(200, 1001)) == "job_owned"
    assert claims.holder("llama") == Owner("uid", "1000")


def test_a_job_id_is_free_once_every_process_that_reported_it_is_gone(claims, procs):
    claims.admit("llama", peer(100, 1000), 0.0)
    claims.admit("llama", peer(101, 1000), 0.0)
    procs.gone.add(100)
    assert reason(claims, "llama", peer(200, 1001)) == "job_owned"  # 101 still runs
    procs.gone.add(101)
    claims.admit("llama", peer(200, 1001), 0.0)
    assert claims.holder("llama") == Owner("uid", "1001")


def test_a_slurm_rank_may_report_only_its_own_job(claims):
    slurm = SchedulerJob("slurm", "1234")
    assert reason(claims, "llama", peer(100, 1000, slurm)) == "job_mismatch"
    assert reason(claims, "1235", peer(100, 1000, slurm)) == "job_mismatch"
    claims.admit("1234", peer(100, 1000, slurm), 0.0)
    assert claims.holder("1234") == Owner("slurm", "1234")


def test_a_slurm_job_takes_its_id_back_from_a_uid_that_claimed_it_first(claims):
    claims.admit("1234", peer(200, 1001), 0.0)  # a user outside the job, first
    claims.admit("1234", peer(100, 1000, SchedulerJob("slurm", "1234")), 0.0)
    assert claims.holder("1234") == Owner("slurm", "1234")
    assert reason(claims, "1234", peer(200, 1001)) == "job_owned"
    # the same uid outside the job's cgroup is not the job either
    assert reason(claims, "1234", peer(300, 1000)) == "job_owned"


def test_pods_of_one_uid_share_a_job_and_nobody_else_joins(claims):
    claims.admit("run7", peer(100, 0, SchedulerJob("k8s", POD)), 0.0)
    other_pod = SchedulerJob("k8s", "00000000-1111-2222-3333-444444444444")
    claims.admit("run7", peer(101, 0, other_pod), 0.0)  # a second pod of the job on this node
    assert reason(claims, "run7", peer(102, 0)) == "job_owned"  # not in a pod
    assert reason(claims, "run7", peer(103, 1000, other_pod)) == "job_owned"


def test_one_uid_holds_at_most_its_share_of_job_ids(claims):
    """A flood of made-up job ids stops at the uid's share; another user's job still gets in."""
    flood = peer(200, 1001)
    reasons: Counter[str] = Counter()
    for i in range(1100):
        try:
            claims.admit(f"fake-{i}", flood, i / 2000)
        except JobReportError as exc:
            reasons[exc.reason] += 1
    assert reasons == {"uid_jobs_full": 1100 - MAX_JOBS_PER_UID}
    claims.admit("real", peer(100, 1000), 1.0)
    assert claims.holder("real") == Owner("uid", "1000")


def test_a_full_table_looks_for_gone_processes_at_most_once_a_second(claims, procs):
    for i in range(MAX_JOBS_PER_UID):
        claims.admit(f"old-{i}", peer(200 + i, 1001), 0.0)
    asked = procs.asked
    for i in range(100):
        assert reason(claims, f"fake-{i}", peer(300, 1001), now=0.5) == "uid_jobs_full"
    assert procs.asked - asked <= MAX_JOBS_PER_UID  # one scan, not one per datagram
    procs.gone.update(range(200, 200 + MAX_JOBS_PER_UID))
    assert reason(claims, "new", peer(300, 1001), now=0.5 + RESCAN_S / 2) == "uid_jobs_full"
    claims.admit("new", peer(300, 1001), 0.5 + RESCAN_S)
    assert len(claims) == 1


def test_all_uids_together_hold_at_most_the_nodes_share(procs):
    claims = JobClaims(procs.alive, per_uid=2, per_node=3)
    claims.admit("a1", peer(100, 1000), 0.0)
    claims.admit("a2", peer(100, 1000), 0.0)
    claims.admit("b1", peer(200, 1001), 0.0)
    assert reason(claims, "c1", peer(300, 1002)) == "node_jobs_full"


def test_slurm_jobs_are_not_held_to_a_uids_share(procs):
    claims = JobClaims(procs.alive, per_uid=1, per_node=1)
    claims.admit("x", peer(100, 1000), 0.0)
    for job in range(5):
        claims.admit(str(job), peer(200 + job, 1000, SchedulerJob("slurm", str(job))), 0.0)
    assert len(claims) == 6


def test_each_pod_holds_its_own_share_whatever_its_uid():
    """Pods of one uid (often all of a node's) are bounded per pod, not per uid: eight
    single-GPU pods of uid 0 each get their job; one pod cannot take more than its share."""
    claims = JobClaims(Processes().alive, per_node=64)
    pods = [SchedulerJob("k8s", f"00000000-0000-0000-0000-{i:012d}") for i in range(8)]
    for i, pod in enumerate(pods):
        claims.admit(f"job-{i}", peer(100 + i, 0, pod), 0.0)
    for extra in range(MAX_JOBS_PER_POD - 1):
        claims.admit(f"more-{extra}", peer(100, 0, pods[0]), 0.0)
    assert reason(claims, "one-too-many", peer(100, 0, pods[0])) == "pod_jobs_full"
    assert len(claims) == 8 + MAX_JOBS_PER_POD - 1


def test_the_node_bound_defaults_to_four_uids_worth(procs):
    claims = JobClaims(procs.alive, per_uid=2)
    for uid in range(4):
        for job in range(2):
            claims.admit(f"{uid}-{job}", peer(100 + uid, 1000 + uid), 0.0)
    assert reason(claims, "x", peer(200, 2000)) == "node_jobs_full"


def test_jobs_per_uid_is_an_agent_setting_that_reaches_the_claims(tmp_path):
    """``jobs_per_uid`` in agent.toml bounds a uid's job ids on the node; nonsense is refused."""
    cfg, claims, me = agent_claims(tmp_path, "jobs_per_uid = 2")
    assert cfg.jobs_per_uid == 2
    claims.admit("a", me, 0.0)
    claims.admit("b", me, 0.0)
    assert reason(claims, "c", me) == "uid_jobs_full"
    for bad in (0, 2.5, "4", True):
        with pytest.raises(ConfigError, match="jobs_per_uid"):
            AgentConfig(jobs_per_uid=bad)  # type: ignore[arg-type]


def test_one_uid_reports_at_most_its_ranks_on_the_node(claims):
    """Issue 38's rank flood: one process of uid 65534 names 100,000 ranks of its one job; it
    keeps MAX_RANKS_PER_OWNER of them, the rest are refused, and another uid's job still gets
    all its ranks. The ranks it holds report on."""
    flood = peer(200, 65534)
    reasons: Counter[str] = Counter()
    for rank in range(100_000):
        try:
            claims.admit("mine", flood, rank / 1e6, rank)
        except JobReportError as exc:
            reasons[exc.reason] += 1
    assert reasons == {"owner_ranks_full": 100_000 - MAX_RANKS_PER_OWNER}
    assert claims.ranks_held(Owner("uid", "65534")) == MAX_RANKS_PER_OWNER
    claims.admit("mine", flood, 1.0, 0)  # a rank it holds
    for rank in range(8):
        claims.admit("real", peer(100 + rank, 1000), 1.0, rank)
    assert claims.ranks_held() == MAX_RANKS_PER_OWNER + 8


def test_a_rank_whose_sender_is_gone_frees_its_place(claims, procs):
    """A job that restarted on the node with other ranks (an elastic job): the old ranks' processes
    are gone, so the new ranks get their places, after at most one scan a RESCAN_S."""
    for rank in range(MAX_RANKS_PER_OWNER):
        claims.admit("elastic", peer(100 + rank, 1000), 0.0, rank)
    assert reason(claims, "elastic", peer(300, 1000), 0.5, 99) == "owner_ranks_full"
    procs.gone.update(range(100, 100 + MAX_RANKS_PER_OWNER))
    assert reason(claims, "elastic", peer(300, 1000), 0.6, 99) == "owner_ranks_full"
    claims.admit("elastic", peer(300, 1000), 0.5 + RESCAN_S, 99)
    assert claims.ranks_held() == 1


def test_all_owners_together_hold_at_most_the_nodes_ranks(procs):
    claims = JobClaims(procs.alive, per_uid=1, per_node=64, ranks_per_owner=2)
    for uid in range(NODE_SHARES):
        for rank in range(2):
            claims.admit(f"job-{uid}", peer(100 + uid, 1000 + uid), 0.0, rank)
    slurm = peer(500, 1000, SchedulerJob("slurm", "77"))
    assert reason(claims, "77", slurm, 0.0, 0) == "node_ranks_full"


def test_ranks_per_uid_is_an_agent_setting_that_reaches_the_claims(tmp_path):
    cfg, claims, me = agent_claims(tmp_path, "ranks_per_uid = 2")
    assert cfg.ranks_per_uid == 2
    claims.admit("a", me, 0.0, 0)
    claims.admit("a", me, 0.0, 1)
    assert reason(claims, "a", me, 0.0, 2) == "owner_ranks_full"
    for bad in (0, 2.5, "4", True):
        with pytest.raises(ConfigError, match="ranks_per_uid"):
            AgentConfig(ranks_per_uid=bad)  # type: ignore[arg-type]
