"""A second double-bit ECC error drains the node, though the collector restarted in between.

The old rule escalated on a base it kept in memory (the DBE counter's value when its incident
fired): a collector started again took the incident back from the journal without one, and the
first growth after the restart only set it, so a DBE that came while the collector was down
never drained. ``double_bit_ecc_recurring`` reads its windows alone.

A real collector, stopped and started again on the same journal and port, a simulated node
whose agent keeps running (it holds the events the collector did not acknowledge in its outbox
and sends them when it is back), and real signed webhooks, as in test_escalation.py.
"""

from collections.abc import Callable

import pytest

from agent.sim.cluster import SimCluster
from cli.dev.webhook_receiver import WebhookReceiver
from collector.config import CollectorConfig
from collector.main import CollectorService
from collector.model.target_keys import gpu_key
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until
from tests.integration.fleet_harness import actions, builtin_rules, dbe_counter_known

pytestmark = pytest.mark.integration

NODE, GPU = "node-1", 2
DAY_S = 24 * 3600.0


def firing(service: CollectorService, rule: str) -> list[str]:
    return [
        i.id
        for i in service.evaluator.engine.open_incidents()
        if i.rule == rule and i.phase == "firing" and i.node == NODE
    ]


async def actions_of(service: CollectorService) -> set[tuple[str, str, str]]:
    """(incident, action, state) of every action journaled for the node."""
    rows = await service.journal.do(lambda s: s.incidents.actions(node=NODE))
    return {(r.incident_id, r.action, r.state) for r in rows}


async def test_a_dbe_while_the_collector_is_down_drains_once_it_is_back(
    collector_config: Callable[..., CollectorConfig], receiver: WebhookReceiver, tmp_path
):
    """DBE, double_bit_ecc fires and resets the GPU; the collector stops; a second DBE on the
    same GPU while it is down; the collector starts again on the same journal, the agent comes
    back and replays the second Xid 48: double_bit_ecc_recurring drains the node.

    What carries it is the Xid 48 half of the rule. The restarted collector reads the event
    windows back from the journal (collector/incidents/history_restore.py), so the first Xid 48
    is in its window beside the replayed second, but not the counter's samples: it knows the
    DBE counter only from the reconnected agent's first report, already at 2, with no rise
    measured (the test checks that too). Under the rules before rises() and the Xid branch, the
    taken-back incident had no base and the node was never drained.
    """
    rules = builtin_rules(tmp_path, "double_bit_ecc", "double_bit_ecc_recurring")
    cfg = collector_config(
        listen=f"127.0.0.1:{free_port()}",
        actions=actions(receiver, tmp_path),
        rules_interval=0.1,
        rules=(rules,),
    )
    first = CollectorService(cfg, SystemClock())
    await first.start()
    cluster = SimCluster(
        [NODE],
        tmp_path / "nodes",
        SystemClock(),
        cfg.listen,
        poll_interval=0.05,
        heartbeat_interval=0.2,
        backoff_initial=0.05,
        backoff_max=0.3,
    )
    cluster.start()
    running = [first]
    try:
        node, agent = cluster.nodes[NODE], cluster.agents[NODE]
        await wait_until(lambda: dbe_counter_known(first, NODE, GPU), what="the first report")
        node.ecc_errors(GPU, dbe=1)
        await wait_until(lambda: bool(firing(first, "double_bit_ecc")), what="the first DBE fires")
        (incident_id,) = firing(first, "double_bit_ecc")

        async def reset_done() -> bool:
            return (incident_id, "reset_gpu", "succeeded") in await actions_of(first)

        await wait_until(reset_done, what="the GPU reset journaled")
        await wait_until(lambda: cluster.unacked() == 0, what="the first Xid 48 acknowledged")
        await first.incidents.idle()
        assert NODE not in first.dispatcher.drained
        assert firing(first, "double_bit_ecc_recurring") == []

        running.remove(first)
        await first.stop(grace=None)
        node.ecc_errors(GPU, dbe=1)  # the counter goes to 2, the kernel logs Xid 48 again
        await wait_until(lambda: cluster.unacked() > 0, what="the second Xid 48 in the outbox")
        streams = agent.link.connections

        again = CollectorService(cfg, SystemClock())
        running.append(again)
        await again.start()
        await wait_until(
            lambda: agent.link.connected and agent.link.connections > streams,
            what="the agent connected to the restarted collector",
        )
        await wait_until(
            lambda: NODE in again.dispatcher.drained, what="the drain after the restart"
        )
        (recurring_id,) = firing(again, "double_bit_ecc_recurring")

        async def drain_journaled() -> bool:
            return (recurring_id, "drain_node", "succeeded") in await actions_of(again)

        await wait_until(drain_journaled, what="the drain's outcome journaled")
        assert firing(again, "double_bit_ecc") == [incident_id]  # taken back, not opened again
        done = await actions_of(again)
        assert [a for a in done if a[1] == "reset_gpu"] == [(incident_id, "reset_gpu", "succeeded")]
        assert not [a for a in done if a[1].startswith("escalated_")], done
        drains = [d for d in receiver.deliveries() if d.body["kind"] == "drain_request"]
        assert [d.body["payload"]["node"] for d in drains] == [NODE]

        # What held: two Xid 48 in the GPU's window; the counter's window shows no rise.
        history, now = again.evaluator.history, again.evaluator.clock.monotonic()
        key = gpu_key(NODE, GPU)
        assert [x for x in history.xids(key, now - DAY_S) if x == 48] == [48, 48]
        assert dbe_counter_known(again, NODE, GPU)
        assert history.rises(key, "ecc_dbe_aggregate_total", now - DAY_S, now) == 0
    finally:
        await cluster.stop()
        for service in running:
            await service.stop(grace=None)
