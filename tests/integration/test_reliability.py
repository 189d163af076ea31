"""Reliability figures and lemon nodes end to end: a real collector, simulated nodes, webhooks.

node-1 runs hot four times: each time a rule drains it, it cools, and a person releases it
(``POST /api/v1/drains/node-1/release``, as ``fleetwatch drains release`` does). The fifth time
it only runs warm, a warning: its fifth incident episode in a week makes it a lemon, and the
built-in ``lemon_node`` drains it, with the counts in the drain's reason. The API, the CLI and
/metrics give the figures (four repairs, four times between incidents, one under way); a
person's release ends the lemon without draining it again; the next fault makes it one again;
and a restart takes the counts back from the journal.
"""

from __future__ import annotations

import asyncio
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cli.main import main
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from rules.engine import Phase
from tests.integration.fleet_harness import BUILTIN_RULES, actions, api, start

if TYPE_CHECKING:
    from pathlib import Path

    from agent.sim.cluster import SimCluster
    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.config import CollectorConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RULES = """\
version: 1
rules:
  - name: gpu_too_hot
    scope: gpu
    when: 'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 85'
    severity: critical
    actions: [drain_node]
  - name: gpu_warm
    scope: gpu
    when: >-
      has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 70
      && gpu.signals.temperature_celsius <= 85
    severity: warning
    actions: [notify]
"""


def lemon_rule(tmp_path: Path) -> Path:
    """The built-in lemon_node as shipped, but for keep_firing_for (5m: 1s here)."""
    data = yaml.safe_load(BUILTIN_RULES.read_text("utf-8"))
    (rule,) = [r for r in data["rules"] if r["name"] == "lemon_node"]
    rule["keep_firing_for"] = "1s"
    path = tmp_path / "lemon.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "rules": [rule]}))
    return path


def samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def firing(service: CollectorService, rule: str) -> list[str]:
    return [
        i.id
        for i in service.evaluator.engine.open_incidents()
        if i.rule == rule and i.phase == Phase.FIRING
    ]


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(main, list(argv))
    return code, capsys.readouterr().out


async def release(service: CollectorService) -> None:
    status, body = await asyncio.to_thread(
        api, service, "POST", "/api/v1/drains/node-1/release", {"reason": "looked at it"}
    )
    assert (status, body.get("released")) == (200, "node-1"), body
    await wait_until(lambda: service.lifecycle.state("node-1") == "in_service", what="released")


async def hot_then_released(service: CollectorService, cluster: SimCluster) -> None:
    """node-1 overheats, is drained, cools down (its incident resolves), and is released."""
    node = cluster.nodes["node-1"]
    node.thermal(0, 92)
    await wait_until(lambda: service.lifecycle.state("node-1") == "drained", what="drained")
    node.thermal(0, None)
    await wait_until(lambda: not firing(service, "gpu_too_hot"), what="cooled")
    await release(service)


async def lemon(service: CollectorService, cluster: SimCluster, receiver, capsys) -> None:
    for _ in range(4):
        await hot_then_released(service, cluster)
    assert not firing(service, "lemon_node")
    assert service.reliability.recent.fields("node-1") == {
        "remediations_7d": 4,
        "incidents_7d": 4,
        "seen_by_person": True,
    }
    # A fifth episode, a mere warning: node-1 is a lemon, and lemon_node drains it.
    cluster.nodes["node-1"].thermal(0, 75)
    await wait_until(lambda: bool(firing(service, "lemon_node")), what="lemon_node fires")
    await wait_until(lambda: service.lifecycle.state("node-1") == "drained", what="lemon drain")
    reasons = [
        d.body["payload"]["reason"]
        for d in receiver.deliveries()
        if d.body["kind"] == "drain_request" and "lemon_node" in d.body["payload"]["reason"]
    ]
    assert len(reasons) == 1
    assert reasons[0].startswith(
        "fleetwatch: lemon_node: node node-1: 4 remediations and 5 incident episodes in 7 days"
    )
    cluster.nodes["node-1"].thermal(0, None)
    await service.lifecycle.idle()
    await figures(service, capsys)
    # A person releases the lemon: it is not drained again, and its incident ends.
    await release(service)
    await wait_until(lambda: not firing(service, "lemon_node"), what="lemon_node ends")
    await asyncio.sleep(1.0)
    assert service.lifecycle.state("node-1") == "in_service"
    assert "node-1" not in service.dispatcher.drained
    assert service.reliability.recent.fields("node-1")["seen_by_person"] is True
    # Something new happens to it: a lemon again (its drain is the hot rule's, done first).
    first = firing(service, "lemon_node")
    cluster.nodes["node-1"].thermal(0, 92)
    await wait_until(lambda: firing(service, "lemon_node") != first, what="a lemon again")
    await wait_until(lambda: service.lifecycle.state("node-1") == "drained", what="drained")
    cluster.nodes["node-1"].thermal(0, None)


async def figures(service: CollectorService, capsys) -> None:
    """The API, the CLI and the metrics, while the lemon is drained."""
    status, body = await asyncio.to_thread(api, service, "GET", "/api/v1/reliability?node=node-1")
    assert status == 200, body
    node: dict[str, Any] = body["node"]
    assert body["window_s"] == 30 * 86400
    assert node["incident_episodes"] == 5
    assert len(node["time_between_incidents_s"]) == 4
    assert node["repairs"] == 4
    assert all(0 < t < 30 for t in node["time_to_repair_s"]), node
    assert node["open_repair_s"] is not None
    assert node["state"] == "drained"
    assert node["gpu_time_lost_ratio"] > 0
    assert node["last_7d"]["remediations"] == node["last_7d"]["drains"] == 5
    assert node["last_7d"]["incident_episodes"] == 5
    assert node["lemon"] is True
    assert node["rules_see"] == {"remediations_7d": 5, "incidents_7d": 5, "seen_by_person": False}
    status, body = await asyncio.to_thread(api, service, "GET", "/api/v1/reliability?window=1d")
    assert status == 200, body
    assert body["fleet"]["lemon_nodes"] == ["node-1"]
    assert body["fleet"]["repairs"] == 4
    assert [n["node"] for n in body["nodes"]] == ["node-1"]
    status, body = await asyncio.to_thread(api, service, "GET", "/api/v1/reliability?node=nope")
    assert status == 404
    status, body = await asyncio.to_thread(api, service, "GET", "/api/v1/reliability?window=1m")
    assert (status, body["error"]) == (400, "query parameter window='1m' must be from 1h to 365d")
    url = f"--api=http://127.0.0.1:{service.http_port}"
    code, out = await cli(capsys, "reliability", "node-1", url)
    assert code == 0
    assert out.splitlines()[0] == "node-1, last 30 days: drained, 8 GPUs"
    assert "lemon: yes (the rules see remediations_7d 5, incidents_7d 5" in out
    code, out = await cli(capsys, "reliability", url)
    assert code == 0
    assert "lemon nodes: node-1" in out
    assert "last 7 days: 5 remediations (5 drains), 5 incident episodes" in out
    await service.reliability.refresh()
    m = await asyncio.to_thread(samples, service.http_port)
    assert m["fleetwatch_node_repair_seconds_count", ()] == 4
    assert m["fleetwatch_node_time_between_incidents_seconds_count", ()] == 4
    assert m["fleetwatch_node_lemon", (("node", "node-1"),)] == 1
    assert m["fleetwatch_node_remediations", (("node", "node-1"),)] == 5
    assert m["fleetwatch_fleet_lemon_nodes", ()] == 1
    assert 0 < m["fleetwatch_fleet_gpu_time_lost_ratio", ()] < 0.001
    assert 0 < m["fleetwatch_fleet_mean_time_to_repair_seconds", ()] < 30
    assert 0 < m["fleetwatch_fleet_mean_time_between_incidents_seconds", ()] < 60
    assert ("fleetwatch_node_remediations", (("node", "node-2"),)) not in m  # nothing there


async def test_a_node_drained_again_and_again_is_a_lemon(
    collector_config, receiver: WebhookReceiver, tmp_path: Path, capsys
):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    acts = actions(receiver, tmp_path, max_drained_share=1.0, breaker_max_drains=50)

    def make(**kw: object) -> CollectorConfig:
        return collector_config(requalify="", **kw)  # type: ignore[no-any-return]

    service, cluster = await start(make, tmp_path, acts, rules=(rules, lemon_rule(tmp_path)))
    try:
        await lemon(service, cluster, receiver, capsys)
        await service.lifecycle.idle()
        kept = dict(service.reliability.recent.fields("node-1"))
    finally:
        await cluster.stop()
        await service.stop(grace=None)
    assert kept["remediations_7d"] >= 6  # the hot rule's sixth drain (the lemon's was skipped)
    again = CollectorService(service.cfg, SystemClock())
    await again.start()
    try:
        assert dict(again.reliability.recent.fields("node-1")) == kept
    finally:
        await again.stop(grace=None)
