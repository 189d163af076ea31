"""Escalation and waiting drains against what happens while an incident still fires.

A real collector, simulated nodes and real signed webhooks, as in test_actions.py.
"""

import asyncio
import urllib.request

import pytest

from collector.main import CollectorService
from fleetwatch.testing import wait_for_more, wait_until
from tests.integration.fleet_harness import actions, builtin_rules, dbe_counter_known, kinds, start

pytestmark = pytest.mark.integration

# A port rule that stays firing for an hour after its port came back, as keep_firing_for does.
LINGERING_RULES = """\
version: 1
rules:
  - name: ib_port_lost
    scope: ib_port
    when: 'port.state != "" && port.state != "ACTIVE"'
    keep_firing_for: 1h
    severity: critical
    actions: [drain_node]
"""


def scrape(service: CollectorService) -> str:
    url = f"http://127.0.0.1:{service.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


async def test_a_second_dbe_while_the_first_fires_drains(collector_config, receiver, tmp_path):
    """Two double-bit ECC errors on one GPU within minutes: the first fires double_bit_ecc,
    which resets and notifies; the second opens no incident of that rule (the first still
    fires) and fires double_bit_ecc_recurring (two DBEs in 24 h), which drains the node. The
    first incident does not escalate: one DBE pair drains once."""
    rules = builtin_rules(tmp_path, "double_bit_ecc", "double_bit_ecc_recurring")
    service, cluster = await start(
        collector_config, tmp_path, actions(receiver, tmp_path), rules=(rules,)
    )
    try:
        node = cluster.nodes["node-1"]
        await wait_until(
            lambda: dbe_counter_known(service, "node-1", 2), what="node-1's first report"
        )
        node.ecc_errors(2, dbe=1)

        def firing(rule: str) -> list[str]:
            return [
                i.id
                for i in service.evaluator.engine.open_incidents()
                if i.rule == rule and i.phase == "firing"
            ]

        await wait_until(lambda: bool(firing("double_bit_ecc")), what="the first DBE fires")
        await wait_until(
            lambda: ("notification", "node-1") in kinds(receiver), what="first notification"
        )
        await service.incidents.idle()
        assert "node-1" not in service.dispatcher.drained
        assert firing("double_bit_ecc_recurring") == []
        (incident_id,) = firing("double_bit_ecc")

        node.ecc_errors(2, dbe=1)
        await wait_until(lambda: "node-1" in service.dispatcher.drained, what="the drain")
        assert firing("double_bit_ecc") == [incident_id]  # the same incident: no new one opened
        (recurring_id,) = firing("double_bit_ecc_recurring")

        async def outcomes() -> set[tuple[str, str, str]]:
            rows = await service.journal.do(lambda s: s.incidents.actions(node="node-1"))
            return {(r.incident_id, r.action, r.state) for r in rows}

        async def drain_journaled() -> bool:
            return (recurring_id, "drain_node", "succeeded") in await outcomes()

        # The node counts as drained once the webhook answered, before the outcome is journaled.
        await wait_until(drain_journaled, what="the drain's outcome journaled")
        done = await outcomes()
        assert (incident_id, "reset_gpu", "succeeded") in done
        assert not [a for a in done if a[1].startswith("escalated_")], done
        drains = [d for d in receiver.deliveries() if d.body["kind"] == "drain_request"]
        assert len(drains) == 1, drains
        rows = await service.journal.do(lambda s: s.incidents.incidents(open_only=True))
        assert {(r.id, r.escalated) for r in rows} == {(incident_id, False), (recurring_id, False)}
    finally:
        await cluster.stop()
        await service.stop(grace=None)


async def test_a_waiting_drain_whose_fault_cleared_is_dropped(collector_config, receiver, tmp_path):
    """Two ports down, room for one drain: the second waits. Its port comes back while
    keep_firing_for keeps the incident firing for an hour; the waiting drain checks the rule's
    condition itself, finds the fault gone and is dropped (journaled, counted). When room comes
    back, nothing is drained for the fault that is gone."""
    rules = tmp_path / "lingering.yaml"
    rules.write_text(LINGERING_RULES)
    acts = actions(receiver, tmp_path, max_drained_nodes=1, max_drained_share=1.0)
    service, cluster = await start(collector_config, tmp_path, acts, rules=(rules,))
    try:
        for name in ("node-1", "node-2"):
            cluster.nodes[name].ib_port_down(0)
        await wait_until(
            lambda: len(service.dispatcher.waiting) == 1 and len(service.dispatcher.drained) == 1,
            what="one drain done and one waiting",
        )
        (drained,) = service.dispatcher.drained
        (waiting_node,) = {"node-1", "node-2"} - {drained}
        cluster.nodes[waiting_node].ib_port_up(0)
        await wait_until(lambda: not service.dispatcher.waiting, what="the waiting drain dropped")
        still = [
            i
            for i in service.evaluator.engine.open_incidents()
            if i.node == waiting_node and i.phase == "firing"
        ]
        assert still, "keep_firing_for keeps the incident firing"
        rows = await service.journal.do(lambda s: s.incidents.actions(node=waiting_node))
        (row,) = [r for r in rows if r.action == "drain_node"]
        assert row.state == "skipped"
        assert row.detail.startswith("the fault cleared while the drain_node waited")
        assert service.dispatcher.dropped_cleared == 1
        metrics = await asyncio.to_thread(scrape, service)
        assert "fleetwatch_waiting_drains_dropped_total 1.0" in metrics

        assert await service.dispatcher.release(drained, "repaired")  # room for one again
        await service.incidents.tick()
        await service.incidents.idle()
        # Later ticks, and what they start, would drain it if anything did.
        await wait_for_more(lambda: service.incidents.ticks, 3, what="three more rule ticks")
        await service.incidents.idle()
        assert waiting_node not in service.dispatcher.drained
        assert ("drain_request", waiting_node) not in kinds(receiver)
    finally:
        await cluster.stop()
        await service.stop(grace=None)
