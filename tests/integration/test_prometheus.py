"""A real Prometheus server scrapes the collector: fleet and rule metrics answer PromQL."""

import asyncio
import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agent.sim.cluster import SimCluster
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until

pytestmark = pytest.mark.integration


def query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        return list(json.loads(resp.read())["data"]["result"])


async def test_prometheus_scrapes_fleet_and_rule_metrics(collector, tmp_path: Path):
    """Prometheus 2.x, started on loopback with a scrape job for the collector, sees the GPUs the
    agents reported and the incident a lost GPU opened, by PromQL."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: scripts/ensure-test-deps.sh installs it"
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: fleetwatch\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{collector.http_port}']}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("w")
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    cluster = SimCluster(
        ["node-1", "node-2"],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{collector.grpc_port}",
        poll_interval=0.05,
        heartbeat_interval=0.2,
    )
    cluster.start()
    try:
        await wait_until(
            lambda: sum(n.connected for n in collector.fleet.snapshot().values()) == 2,
            what="agents",
        )
        cluster.nodes["node-2"].xid(4, 79)

        async def seen(promql: str) -> list[dict[str, Any]]:
            try:
                return await asyncio.to_thread(query, port, promql)
            except OSError:
                return []  # not up yet

        for promql in (
            'fleetwatch_gpu_present{node="node-1"}',
            'fleetwatch_incidents_open{rule="gpu_lost",phase="firing"}',
        ):
            for _ in range(300):
                if await seen(promql):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"Prometheus never returned {promql}")
        present = await seen('sum(fleetwatch_gpu_present{node="node-1"})')
        assert float(present[0]["value"][1]) == 8.0
        lost = await seen('fleetwatch_gpu_present{node="node-2"} == 0')
        assert [r["metric"]["gpu"] for r in lost] == ["4"]
    finally:
        await cluster.stop()
        server.terminate()
        server.wait(timeout=10)
        log.close()
