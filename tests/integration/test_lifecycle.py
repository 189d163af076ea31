"""A node's lifecycle end to end: a real collector, simulated nodes, real webhooks, the CLI.

in service -> suspect (a warning fires) -> in service (it resolves); in service -> drained (a lost
GPU's drain) -> in repair -> RMA -> (repaired) in service, each move journaled with who made it,
shown by ``fleetwatch lifecycle`` and ``nodes``, counted in /metrics, and kept over a restart.
"""

from __future__ import annotations

import asyncio
import urllib.request
from typing import TYPE_CHECKING

import pytest

from cli.main import main
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import actions, api, start

if TYPE_CHECKING:
    from pathlib import Path

    from agent.sim.cluster import SimCluster
    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

RULES = """\
version: 1
rules:
  - name: gpu_hot
    scope: gpu
    when: 'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 85'
    severity: warning
    actions: [notify]
  - name: lost_gpu
    scope: gpu
    when: '!gpu.present || events("gpu_lost", "10m") > 0'
    severity: critical
    actions: [drain_node]
"""


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


async def walk(service: CollectorService, cluster: SimCluster, capsys, url: str) -> None:
    """Suspect and back, drained, in repair, RMA: each move through the hooks or the CLI."""
    # A warning makes node-2 suspect; once it clears, node-2 is in service again.
    cluster.nodes["node-2"].thermal(1, 92)
    await wait_until(lambda: service.lifecycle.state("node-2") == "suspect", what="node-2 suspect")
    cluster.nodes["node-2"].thermal(1, None)
    await wait_until(lambda: service.lifecycle.state("node-2") == "in_service", what="node-2 back")
    # A lost GPU drains node-1.
    cluster.nodes["node-1"].xid(0, 79)
    await wait_until(lambda: service.lifecycle.state("node-1") == "drained", what="drained")
    code, out, _ = await cli(capsys, "nodes", url)
    assert code == 0
    line = next(row for row in out.splitlines() if row.startswith("node-1 "))
    assert line.split()[2] == "drained", line
    # A person takes it into repair, then sends it back to the vendor.
    code, out, err = await cli(capsys, "lifecycle", "node-1", "repair", "--reason=GPU 0 swap", url)
    assert (code, out.strip()) == (0, "node-1: in repair (was drained)"), err
    code, out, _ = await cli(capsys, "lifecycle", "node-1", "rma", "--reason=board", url)
    assert (code, out.strip()) == (0, "node-1: RMA (was in repair)")
    # A move the lifecycle does not allow is refused with where the node stands.
    status, body = api(service, "POST", "/api/v1/nodes/node-3/lifecycle", {"move": "fix"})
    assert status == 400
    assert "move must be one of repair, repaired, rma" in body["error"]
    status, body = api(service, "POST", "/api/v1/nodes/node-33/lifecycle", {"move": "rma"})
    assert status == 404
    assert "node-3" in body["error"]  # the close one named
    await service.lifecycle.idle()
    metrics = await asyncio.to_thread(scrape, service.http_port)
    assert 'fleetwatch_nodes_lifecycle{state="rma"} 1.0' in metrics
    assert 'fleetwatch_nodes_lifecycle{state="in_service"} 3.0' in metrics
    assert 'fleetwatch_lifecycle_moves_total{previous="drained",state="in_repair"} 1.0' in metrics
    assert 'fleetwatch_node_lifecycle_since_timestamp_seconds{node="node-1",state="rma"}' in metrics


async def after_restart(again: CollectorService, capsys) -> None:
    """The states taken back; the repaired node released; every move journaled, in order.

    node-1's GPU is still lost (its incident, taken back, still fires: no agent says otherwise),
    so the node put back in service is suspect at once.
    """
    assert again.lifecycle.state("node-1") == "rma"
    assert again.lifecycle.state("node-2") == "in_service"
    url = f"--api=http://127.0.0.1:{again.http_port}"
    code, out, _ = await cli(capsys, "lifecycle", "node-1", "repaired", url)
    assert (code, out.strip()) == (0, "node-1: suspect (was RMA)")
    assert "node-1" not in again.dispatcher.drained  # released: no longer under the cap
    await again.lifecycle.idle()
    code, out, _ = await cli(capsys, "lifecycle", "node-1", url)
    assert code == 0
    assert out.splitlines()[0].startswith("node-1: suspect since ")
    assert len([row for row in out.splitlines() if row[:2] == "20"]) == 6, out  # 6 moves
    rows = await again.journal.do(lambda s: s.lifecycle.history("node-1"))
    # The lost GPU's incident fires (suspect), then its drain succeeds (drained).
    assert [(r.previous, r.state) for r in rows] == [
        ("in_service", "suspect"),
        ("suspect", "drained"),
        ("drained", "in_repair"),
        ("in_repair", "rma"),
        ("rma", "in_service"),
        ("in_service", "suspect"),
    ]
    assert (rows[0].actor, rows[1].actor) == ("rule:lost_gpu", "action:drain_node")
    assert rows[1].incident.startswith("lost_gpu:node-1/gpu/0")
    assert rows[2].actor.startswith("person:")
    assert rows[2].reason == "GPU 0 swap"
    assert rows[4].actor.startswith("person:")
    assert (rows[5].actor, rows[5].reason) == (
        "rule:lost_gpu",
        "put back in service while this still fires",
    )
    suspect = await again.journal.do(lambda s: s.lifecycle.history("node-2"))
    assert [(r.state, r.actor) for r in suspect] == [
        ("suspect", "rule:gpu_hot"),
        ("in_service", "rule:gpu_hot"),
    ]


async def test_a_node_moves_through_its_lifecycle_and_keeps_it_over_a_restart(
    collector_config, receiver: WebhookReceiver, tmp_path: Path, capsys
):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    acts = actions(receiver, tmp_path, max_drained_share=1.0)

    # Re-qualification off: a repaired node is released at once (test_requalify.py has it on).
    def make(**kw: object) -> CollectorConfig:
        return collector_config(requalify="", **kw)  # type: ignore[no-any-return]

    service, cluster = await start(make, tmp_path, acts, rules=(rules,))
    try:
        await walk(service, cluster, capsys, f"--api=http://127.0.0.1:{service.http_port}")
    finally:
        await cluster.stop()
        await service.stop(grace=None)
    # A restart on the same journal takes each node's state back.
    again = CollectorService(service.cfg, SystemClock())
    await again.start()
    try:
        await after_restart(again, capsys)
    finally:
        await again.stop(grace=None)
