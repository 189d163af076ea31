"""Step reports are tied to who sent them: real processes of two users, real agents and collector.

The ranks are forked children that drop to their own uid (``os.setuid``) and report through the
real client to the agents' real job sockets; the agents stream to a real collector on loopback.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.jobs.claims import MAX_JOBS_PER_UID, MAX_RANKS_PER_OWNER
from collector.export.catalog import SERIES_PER_NODE_BUDGET
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import api, job_fleet
from tests.rank_process import deliver, ranks, step_reports

if TYPE_CHECKING:
    from agent.jobs.listener import JobQueue
    from agent.sim.cluster import SimCluster
    from collector.main import CollectorService

pytestmark = pytest.mark.integration

VICTIM, ATTACKER = 2001, 2002
JOB = "victim-run"
AGENT_REFUSED = "fleetwatch_agent_job_reports_refused_total"
COLLECTOR_REFUSED = "fleetwatch_job_reports_refused_total"


def metrics(service: CollectorService) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    url = f"http://127.0.0.1:{service.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric(service: CollectorService, name: str, **labels: str) -> float:
    return metrics(service).get((name, frozenset(labels.items())), 0.0)


async def until_metric(service: CollectorService, value: float, name: str, **labels: str) -> None:
    """Scrape (off the event loop, which the collector serves on) until the series has value."""
    deadline = time.monotonic() + 15
    while (seen := await asyncio.to_thread(metric, service, name, **labels)) != value:
        assert time.monotonic() < deadline, f"{name}{labels} is {seen}, not {value}"
        await asyncio.sleep(0.1)


async def within_series_budget(service: CollectorService, node: str, jobs: set[str]) -> None:
    """``node``'s series and its jobs' hold to the per-node budget (scraped off the loop)."""
    per_family: Counter[str] = Counter()
    for name, labels in await asyncio.to_thread(metrics, service):
        label = dict(labels)
        if label.get("node") == node or label.get("training_job") in jobs:
            per_family[name] += 1
    assert sum(per_family.values()) <= SERIES_PER_NODE_BUDGET, per_family.most_common(12)


def queue(cluster: SimCluster, node: str) -> JobQueue:
    jobs = cluster.agents[node].jobs
    assert jobs is not None
    return jobs


def read(cluster: SimCluster, node: str):
    jobs = queue(cluster, node)
    return lambda: jobs.received + sum(jobs.refused.values())


def open_to_all(cluster: SimCluster) -> None:
    """The sockets' folder is a mkdtemp (0700): let the other users' ranks reach the sockets."""
    for path in cluster.job_sockets.values():
        path.parent.chmod(0o755)


async def test_a_user_cannot_report_steps_for_another_users_job(
    collector_config: Any, receiver: Any, tmp_path: Any
):
    """Issue 18's impersonation: uid 2002 sends steps for ranks 4-11 of uid 2001's job with
    half the step time. On node-a, where the job runs ranks 4-7, its agent refuses them
    (job_owned); from node-c, where the job does not run, the collector refuses them
    (owner_mismatch). Both are counted in /metrics; ranks stay where they run, nobody
    straggles, and no rank 8-11 appears."""
    nodes = ["node-a", "node-b", "node-c"]
    async with job_fleet(collector_config, receiver, tmp_path, nodes, poll_interval=0.1) as (
        service,
        cluster,
    ):
        open_to_all(cluster)
        socket = cluster.job_sockets
        with ranks(VICTIM, ATTACKER) as (victim, attacker):
            for step in range(0, 40, 4):
                steps = range(step, step + 4)
                real = {"world_size": 8, "step_time": 2.0, "compute_time": 1.6}
                fake = {"world_size": 12, "step_time": 1.0, "compute_time": 0.8}
                for node, held in (("node-b", range(4)), ("node-a", range(4, 8))):
                    reports = step_reports(JOB, held, steps, socket[node], **real)
                    await deliver(victim, reports, read(cluster, node))
                fakes = step_reports(JOB, range(4, 12), steps, socket["node-a"], **fake)
                await deliver(attacker, fakes, read(cluster, "node-a"))
                fakes = step_reports(JOB, range(4), steps, socket["node-c"], **fake)
                await deliver(attacker, fakes, read(cluster, "node-c"))
            assert queue(cluster, "node-a").refused == {"job_owned": 40 * 8}
            assert queue(cluster, "node-c").refused == {}
        await wait_until(
            lambda: service.jobs.refusals() == {"owner_mismatch": 40 * 4},
            15,
            "the collector's refusals",
        )
        await wait_until(lambda: len(service.jobs.ranks(JOB)) == 8, 15, "the job's 8 ranks")
        await until_metric(service, 40 * 8, AGENT_REFUSED, node="node-a", reason="job_owned")
        await until_metric(service, 40 * 4, COLLECTOR_REFUSED, reason="owner_mismatch")
        # what node-a's agent took in and lost, as it counts them, reaches /metrics too
        assert queue(cluster, "node-a").received == 40 * 4
        await until_metric(service, 40 * 4, "fleetwatch_agent_job_reports_total", node="node-a")
        await until_metric(
            service, 40 * 8, "fleetwatch_agent_job_reports_lost_total", node="node-a"
        )
        status, view = api(service, "GET", f"/api/v1/jobs/{JOB}")
        assert status == 200, view
        placed = {r["rank"]: r["node"] for r in view["rank_detail"]}
        assert placed == {r: "node-b" if r < 4 else "node-a" for r in range(8)}
        assert (view["world_size"], view["stragglers"]) == (8, 0)


async def test_one_users_flood_of_made_up_jobs_stays_within_the_nodes_series_budget(
    collector_config: Any, receiver: Any, tmp_path: Any
):
    """1,100 made-up job ids from uid 2002 on node-1 beside uid 2001's 8-rank job: node-1 and
    its jobs stay within the per-node series budget, and the real job is still taken."""
    async with job_fleet(collector_config, receiver, tmp_path, ["node-1"], poll_interval=0.1) as (
        service,
        cluster,
    ):
        open_to_all(cluster)
        path = cluster.job_sockets["node-1"]
        with ranks(VICTIM, ATTACKER) as (victim, attacker):
            flood = [((f"fake-{i}", 0, 1, 1.0), {"socket_path": str(path)}) for i in range(1100)]
            await deliver(attacker, flood, read(cluster, "node-1"))
            real = step_reports(JOB, range(8), range(3), path, world_size=8, compute_time=0.8)
            real = [(args, {**kw, "gpu": args[1]}) for args, kw in real]  # rank r on GPU r
            await deliver(victim, real, read(cluster, "node-1"))
        await wait_until(lambda: len(service.jobs.ranks(JOB)) == 8, 15, "the job's 8 ranks")
        flooded = 1100 - MAX_JOBS_PER_UID
        await until_metric(service, flooded, AGENT_REFUSED, node="node-1", reason="uid_jobs_full")
        jobs = {j["id"] for j in service.jobs.publish()}
        assert JOB in jobs
        await within_series_budget(service, "node-1", jobs)


async def test_one_users_flood_of_made_up_ranks_stays_within_the_nodes_series_budget(
    collector_config: Any, receiver: Any, tmp_path: Any
):
    """Issue 38's rank flood: uid 2002's one job names 2,000 ranks (no world size) on node-1,
    beside uid 2001's 8-rank job. The agent keeps the uid's first ranks_per_uid and counts the
    rest (owner_ranks_full); the real job is taken whole and node-1 stays within its budget."""
    async with job_fleet(collector_config, receiver, tmp_path, ["node-1"], poll_interval=0.1) as (
        service,
        cluster,
    ):
        open_to_all(cluster)
        path = cluster.job_sockets["node-1"]
        with ranks(VICTIM, ATTACKER) as (victim, attacker):
            flood = step_reports("flood", range(2000), range(1), path, compute_time=0.8)
            await deliver(attacker, flood, read(cluster, "node-1"))
            real = step_reports(JOB, range(8), range(3), path, world_size=8, compute_time=0.8)
            real = [(args, {**kw, "gpu": args[1]}) for args, kw in real]  # rank r on GPU r
            await deliver(victim, real, read(cluster, "node-1"))
        await wait_until(lambda: len(service.jobs.ranks(JOB)) == 8, 15, "the job's 8 ranks")
        await wait_until(
            lambda: len(service.jobs.ranks("flood")) == MAX_RANKS_PER_OWNER, 15, "the flood's ranks"
        )
        refused = 2000 - MAX_RANKS_PER_OWNER
        reason = "owner_ranks_full"
        await until_metric(service, refused, AGENT_REFUSED, node="node-1", reason=reason)
        jobs = {j["id"] for j in service.jobs.publish()}
        await within_series_budget(service, "node-1", jobs)
