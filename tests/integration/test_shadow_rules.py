"""Shadow mode: a rule with ``mode: shadow`` fires on a live fleet and acts on nothing.

A real collector and simulated nodes, as in test_actions.py; a real signed-webhook receiver
stands for the drain endpoint and the pager.
"""

from __future__ import annotations

import asyncio
import urllib.request
from typing import TYPE_CHECKING

import pytest

from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import actions, api, start

if TYPE_CHECKING:
    from pathlib import Path

    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.main import CollectorService

pytestmark = pytest.mark.integration

# A new drain rule being proven in shadow, beside an enforcing one on another kind of fault, and a
# shadow rule that would suppress its node's others if it acted.
RULES = """\
version: 1
rules:
  - name: lost_gpu_candidate
    scope: gpu
    when: '!gpu.present || events("gpu_lost", "10m") > 0'
    severity: critical
    mode: shadow
    actions: [drain_node, notify]
  - name: port_down
    scope: ib_port
    when: 'port.state != "" && port.state != "ACTIVE"'
    for: 1s
    severity: critical
    actions: [drain_node, notify]
  - name: node_quiet_candidate
    scope: node
    when: 'node.reachable'
    severity: critical
    suppresses: true
    mode: shadow
    actions: [notify]
"""


def scrape(service: CollectorService) -> str:
    url = f"http://127.0.0.1:{service.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


async def test_a_shadow_rule_fires_journals_what_it_would_do_and_acts_on_nothing(
    collector_config, receiver: WebhookReceiver, tmp_path: Path
):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    acts = actions(receiver, tmp_path, max_drained_share=1.0)
    service, cluster = await start(collector_config, tmp_path, acts, rules=(rules,))
    try:
        cluster.nodes["node-1"].xid(2, 79)

        async def shadow_actions() -> list[tuple[str, str, str]]:
            rows = await service.journal.do(lambda s: s.incidents.actions(node="node-1"))
            return sorted((r.action, r.state, r.detail) for r in rows)

        async def both_journaled() -> bool:
            return {a for a, _, _ in await shadow_actions()} == {"drain_node", "notify"}

        await wait_until(both_journaled, what="the shadow rule's two actions journaled")
        # lost_gpu_candidate's drain and notify, node_quiet_candidate's notify: all in shadow.
        assert set(await shadow_actions()) == {
            ("drain_node", "shadow", "shadow mode: would run, nothing was done"),
            ("notify", "shadow", "shadow mode: would run, nothing was done"),
        }
        assert "node-1" not in service.dispatcher.drained
        status, body = api(service, "GET", "/api/v1/incidents?node=node-1")
        assert status == 200
        shown = {(i["rule"], i["phase"], i["mode"]) for i in body["incidents"]}
        assert ("lost_gpu_candidate", "firing", "shadow") in shown
        assert ("node_quiet_candidate", "firing", "shadow") in shown
        metrics = await asyncio.to_thread(scrape, service)
        assert (
            'fleetwatch_actions_total{action="drain_node",node="node-1",outcome="shadow"} 1.0'
            in metrics
        )

        # An enforcing rule on node-2 still acts, and the shadow rule that would suppress every
        # node's others (it fires on all at once; port_down waits 1 s) holds nothing back.
        cluster.nodes["node-2"].ib_port_down(0)
        await wait_until(lambda: "node-2" in service.dispatcher.drained, what="node-2's drain")
        # Nothing of the shadow rules reached the receiver: only node-2's drain and notification.
        await wait_until(lambda: len(receiver.deliveries()) >= 2, what="node-2's webhooks")
        await service.incidents.idle()
        sent = {(d.body["kind"], d.body["payload"].get("rule", "")) for d in receiver.deliveries()}
        assert ("notification", "lost_gpu_candidate") not in sent
        assert ("notification", "node_quiet_candidate") not in sent
        assert ("notification", "port_down") in sent
        assert all(d.body["payload"].get("node") == "node-2" for d in receiver.deliveries())
    finally:
        await cluster.stop()
        await service.stop(grace=None)
