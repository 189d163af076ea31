"""The collector's /metrics against its catalog: names, labels, promtool, budget, node states."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import urllib.request
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.sim.training import SimTrainingJob
from collector.export.catalog import NODE_STATES, SERIES_PER_NODE_BUDGET, by_name
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import job_fleet

if TYPE_CHECKING:
    from collector.main import CollectorService

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(service: CollectorService, path: str) -> str:
    url = f"http://127.0.0.1:{service.http_port}{path}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def scrape_text(service: CollectorService) -> str:
    return get(service, "/metrics")


def samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def exposed_name(family_name: str, family_type: str) -> str:
    return f"{family_name}_total" if family_type == "counter" else family_name


def states(m: Samples, node: str) -> dict[str, float]:
    return {s: m["fleetwatch_node_state", (("node", node), ("state", s))] for s in NODE_STATES}


def firing_state(m: Samples, node: str) -> str:
    (state,) = [s for s, v in states(m, node).items() if v == 1.0]
    return state


def check_against_catalog(text: str) -> None:
    """Every family is in the catalog with its type, and every sample has its labels."""
    for family in text_string_to_metric_families(text):
        name = exposed_name(family.name, family.type)
        assert name in by_name(), f"{name} is exposed but not in the catalog"
        spec = by_name()[name]
        assert family.type == spec.kind, name
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = set(sample.labels) - ({"le"} if sample.name.endswith("_bucket") else set())
            assert tuple(sorted(labels)) == tuple(sorted(spec.labels)), sample


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/ensure-test-deps.sh installs prometheus"
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def test_a_faulty_fleet_matches_the_catalog_and_promtool(running, receiver):
    """Healthy nodes, then a lost GPU: the node turns drained, its incident and actions show as
    series, the failure counts under its category; every series is in the catalog with its
    labels, and promtool finds nothing to complain about."""
    service, cluster = running
    m = samples(await asyncio.to_thread(scrape_text, service))
    assert {firing_state(m, n) for n in cluster.nodes} == {"healthy"}

    cluster.nodes["node-2"].xid(3, 79)
    cluster.nodes["node-3"].nvlink_down(1, 4)  # degraded, not drained: a reset fixes it
    await wait_until(lambda: "node-2" in service.dispatcher.drained, what="drain")
    await wait_until(
        lambda: any(
            a == "notify" and n == "node-2"
            for (a, _, n), _, _ in service.dispatcher.tally.snapshot()
        ),
        what="notify counted",
    )
    text = await asyncio.to_thread(scrape_text, service)
    m = samples(text)
    assert firing_state(m, "node-2") == "drained"
    nodes = json.loads(await asyncio.to_thread(get, service, "/api/v1/nodes"))["nodes"]
    assert {n["name"]: n["state"] for n in nodes}["node-2"] == "drained"
    assert json.loads(await asyncio.to_thread(get, service, "/api/v1/nodes/node-2"))["state"] == (
        "drained"
    )
    assert firing_state(m, "node-1") == "healthy"
    assert firing_state(m, "node-3") in ("degraded", "healthy")  # reset may have fixed it
    firing = (
        ("node", "node-2"),
        ("rule", "gpu_lost"),
        ("scope", "gpu"),
        ("severity", "critical"),
        ("target", "node-2/gpu/3"),
        ("training_job", ""),
    )
    assert m["fleetwatch_incident_firing", firing] == 1.0
    drained = (("action", "drain_node"), ("node", "node-2"), ("outcome", "succeeded"))
    assert m["fleetwatch_actions_total", drained] == 1.0
    assert m["fleetwatch_action_last_timestamp_seconds", drained] > 1.7e9
    failure = (("category", "gpu_lost"), ("node", "node-2"))
    assert m["fleetwatch_node_failures_total", failure] == 1.0
    xid = (("class", "bus"), ("gpu", "3"), ("node", "node-2"), ("xid", "79"))
    assert m["fleetwatch_gpu_xid_errors_total", xid] == 1.0
    check_against_catalog(text)
    promtool_check(text)

    await cluster.crash("node-4")
    await wait_until(
        lambda: not service.fleet.snapshot()["node-4"].reachable, timeout=10, what="unreachable"
    )
    m = samples(await asyncio.to_thread(scrape_text, service))
    assert firing_state(m, "node-4") == "unreachable"


async def test_one_full_node_with_a_job_stays_within_the_series_budget(
    collector_config: Any, receiver: Any, tmp_path: Any
):
    """A node of 8 GPUs (18 NVLinks each) and 8 IB ports running 8 ranks of a job costs at most
    the budgeted series, and every per-GPU signal the agent collects has its series."""
    async with job_fleet(collector_config, receiver, tmp_path, ["node-1"], poll_interval=0.1) as (
        service,
        cluster,
    ):
        job = SimTrainingJob.on_nodes(
            "budget",
            [cluster.nodes["node-1"]],
            cluster.job_sockets,
            SystemClock(),
            ranks_per_node=8,
            compute_s=0.02,
            comm_s=0.005,
        )
        runner = asyncio.create_task(job.run(pace=4.0))
        try:
            await wait_until(
                lambda: len(service.jobs.ranks("budget")) == 8, timeout=30, what="8 ranks"
            )
            text = await asyncio.to_thread(scrape_text, service)
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
    check_against_catalog(text)
    promtool_check(text)
    per_family: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.labels.get("node") == "node-1"
                or sample.labels.get("training_job") == "budget"
            ):
                per_family[sample.name] += 1
    total = sum(per_family.values())
    assert 300 < total <= SERIES_PER_NODE_BUDGET, per_family.most_common()
    assert per_family["fleetwatch_job_rank_step_time_seconds"] == 8
    for gauge in ("temperature_celsius", "memory_utilization_ratio", "pcie_link_width_degraded"):
        assert per_family[f"fleetwatch_gpu_{gauge}"] == 8, gauge
    assert per_family["fleetwatch_gpu_ecc_volatile_errors_total"] == 16
    assert per_family["fleetwatch_ib_port_errors_total"] == 8 * 11
    assert per_family["fleetwatch_ib_port_hw_events_total"] == 8 * 7
