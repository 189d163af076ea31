"""A simulated training job on 16 nodes: real agents, job sockets, gRPC and collector.

The job reports its steps through the real client to each node's agent; faults on the simulated
hardware slow it the way they would a real job. The collector must name the node to blame, or
say that none is (a workload change, a congested fabric).
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from agent.sim.training import SimTrainingJob
from cli.main import main
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import api, job_fleet

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from agent.sim.cluster import SimCluster
    from collector.main import CollectorService

NODES = [f"node-{i:02d}" for i in range(1, 17)]
JOB = "llm-pretrain"
RANKS_PER_NODE = 2


class JobFleet:
    """The collector, its 16 nodes and the job running on them."""

    def __init__(self, service: CollectorService, cluster: SimCluster, job: SimTrainingJob):
        self.service = service
        self.cluster = cluster
        self.job = job

    def node(self, name: str) -> Any:
        return self.cluster.nodes[name]

    def job_view(self) -> dict[str, Any]:
        status, body = api(self.service, "GET", f"/api/v1/jobs/{JOB}")
        assert status == 200, body
        return dict(body)

    def firing(self) -> dict[tuple[str, str], str]:
        """(rule, target) -> evidence of the firing incidents."""
        _, body = api(self.service, "GET", "/api/v1/incidents?open=1")
        return {
            (i["rule"], i["target"]): i.get("evidence", "")
            for i in body["incidents"]
            if i["phase"] == "firing"
        }

    async def steady(self) -> None:
        """Wait until the job has run long enough for its baseline to be learned."""
        await wait_until(
            lambda: self.job.step > 60 and self.service.jobs.jobs.get(JOB) is not None,
            timeout=30,
            what="the job's first 60 steps",
        )


@pytest.fixture
async def fleet(collector_config: Any, receiver: Any, tmp_path: Path) -> AsyncIterator[JobFleet]:
    async with job_fleet(collector_config, receiver, tmp_path, NODES, poll_interval=0.1) as (
        service,
        cluster,
    ):
        job = SimTrainingJob.on_nodes(
            JOB,
            [cluster.nodes[n] for n in NODES],
            cluster.job_sockets,
            SystemClock(),
            ranks_per_node=RANKS_PER_NODE,
            compute_s=0.04,
            comm_s=0.01,
        )
        runner = asyncio.create_task(job.run(pace=2.0))
        try:
            yield JobFleet(service, cluster, job)
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner


class TestJobScenarios:
    async def test_the_collector_learns_where_each_rank_runs(self, fleet: JobFleet):
        """Step reports travel rank -> agent socket -> stream -> collector, placing each rank."""
        await fleet.steady()
        view = fleet.job_view()
        assert view["ranks"] == len(NODES) * RANKS_PER_NODE
        assert view["nodes"] == len(NODES)
        assert view["tokens_per_s"] > 0
        assert 0 < view["mfu"] < 1
        placed = {(r["rank"], r["node"], r["gpu"]) for r in view["rank_detail"]}
        assert (5, "node-03", 1) in placed
        assert fleet.firing() == {}

    async def test_people_see_the_job_in_the_cli_and_in_prometheus(
        self, fleet: JobFleet, capsys: pytest.CaptureFixture[str]
    ):
        """`fleetwatch jobs` lists the job and its ranks; /metrics has its throughput."""
        await fleet.steady()
        url = f"http://127.0.0.1:{fleet.service.http_port}"
        assert await asyncio.to_thread(main, ["jobs", "--api", url]) == 0
        listing = capsys.readouterr().out
        assert JOB in listing
        assert "TOKENS/S" in listing
        assert await asyncio.to_thread(main, ["jobs", JOB, "--api", url]) == 0
        ranks = capsys.readouterr().out
        assert "node-16" in ranks
        assert len([line for line in ranks.splitlines() if " node-" in line]) == 32
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:  # noqa: S310
            text = resp.read().decode()
        assert f'fleetwatch_job_tokens_per_second{{training_job="{JOB}"}}' in text
        assert f'fleetwatch_job_gpus{{training_job="{JOB}"}} 32.0' in text

    async def test_a_slow_gpu_makes_its_node_the_straggler(self, fleet: JobFleet):
        """A GPU computing 40% slower: its rank straggles and the incident names node and GPU."""
        await fleet.steady()
        fleet.node("node-05").slow(1, 1.4)
        await wait_until(
            lambda: ("gpu_straggler", "node-05/gpu/1") in fleet.firing(),
            timeout=20,
            what="a straggler incident on node-05 GPU 1",
        )
        evidence = fleet.firing()["gpu_straggler", "node-05/gpu/1"]
        assert "node-05" in evidence
        assert "GPU-hours per hour" in evidence
        assert [k for k in fleet.firing() if k[0] == "gpu_straggler"] == [
            ("gpu_straggler", "node-05/gpu/1")
        ]
        assert fleet.job_view()["straggler_nodes"] == ["node-05"]

    async def test_thermal_throttling_is_named_as_the_straggler_s_cause(self, fleet: JobFleet):
        """A throttled GPU's rank straggles; the evidence shows the throttling and the clock."""
        await fleet.steady()
        fleet.node("node-07").thermal(0, 91)
        await wait_until(
            lambda: ("gpu_straggler", "node-07/gpu/0") in fleet.firing(),
            timeout=20,
            what="a straggler incident on node-07 GPU 0",
        )
        evidence = fleet.firing()["gpu_straggler", "node-07/gpu/0"]
        assert "throttled" in evidence
        assert "thermal" in evidence
        await wait_until(
            lambda: fleet.job_view()["suspects"][:1] == ["node-07"],
            timeout=20,
            what="node-07 first among the drop's suspects",
        )

    async def test_nvlink_errors_make_their_node_the_first_suspect(self, fleet: JobFleet):
        """NVLink errors slow every rank's collectives: no straggler, but a drop naming the node."""
        await fleet.steady()
        fleet.node("node-09").nvlink_errors(0, 3, replay=5000, recovery=2, crc=800)
        await wait_until(
            lambda: ("job_throughput_drop", f"job/{JOB}") in fleet.firing(),
            timeout=20,
            what="a throughput drop incident",
        )
        view = fleet.job_view()
        assert view["drop_cause"] == "hardware"
        assert view["suspects"][0] == "node-09"
        assert "NVLink errors" in fleet.firing()["job_throughput_drop", f"job/{JOB}"]
        assert view["stragglers"] == 0

    async def test_a_workload_slowdown_blames_no_node(self, fleet: JobFleet):
        """Every rank slowing alike is a drop with no hardware cause, and no straggler."""
        await fleet.steady()
        fleet.job.workload = 1.3
        await wait_until(
            lambda: ("job_throughput_drop", f"job/{JOB}") in fleet.firing(),
            timeout=20,
            what="a throughput drop incident",
        )
        view = fleet.job_view()
        assert view["drop_cause"] == "none"
        assert view["suspects"] == []
        assert "no hardware cause found" in fleet.firing()["job_throughput_drop", f"job/{JOB}"]
        assert not [k for k in fleet.firing() if k[0].startswith("gpu_straggler")]

    async def test_fabric_congestion_is_a_fabric_incident_not_a_drain(self, fleet: JobFleet):
        """Congestion on many of the job's nodes: a fabric incident, no suspects, no drain."""
        await fleet.steady()
        for name in NODES[:6]:
            fleet.node(name).ib_congestion(0, 250_000.0)
        await wait_until(
            lambda: ("job_fabric_degraded", f"job/{JOB}") in fleet.firing(),
            timeout=20,
            what="a fabric incident for the job",
        )
        await wait_until(
            lambda: fleet.job_view()["drop"],
            timeout=20,
            what="the throughput drop",
        )
        view = fleet.job_view()
        assert view["drop_cause"] == "fabric"
        assert view["suspects"] == []
        assert set(view["fabric_nodes"]) == set(NODES[:6])
        _, acted = api(fleet.service, "GET", "/api/v1/actions")
        assert not [a for a in acted["actions"] if a["action"] == "drain_node"]
