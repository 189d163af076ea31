"""A BMC fault end to end: simulated BMC -> agent (Redfish reader) -> gRPC -> journal -> rules.

Real agents on simulated nodes stream to a real collector on the built-in rules (their times
divided by 60, as the demo does); the webhook receiver sees what the rules decided.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.sim.scenario import Fault, FaultKind
from cli.demo.wiring import demo_rules
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import actions, api, kinds, start

if TYPE_CHECKING:
    from pathlib import Path

    from cli.dev.webhook_receiver import WebhookReceiver


def notified(receiver: WebhookReceiver) -> set[str]:
    """The rules notifications were sent for."""
    return {
        d.body["payload"]["rule"] for d in receiver.deliveries() if d.body["kind"] == "notification"
    }


async def test_a_failed_supply_with_no_spare_drains_and_a_lost_feed_only_notifies(
    collector_config, receiver: WebhookReceiver, tmp_path: Path
):
    rules = demo_rules(tmp_path, 60.0).path
    service, cluster = await start(
        collector_config, tmp_path, actions(receiver, tmp_path), rules=(rules,)
    )
    try:
        # node-2: a feed is lost (no spare left, nothing broken), then a supply fails.
        await cluster.inject(Fault(0, "node-2", FaultKind.PSU_REDUNDANCY_LOST, {}))
        await wait_until(
            lambda: "bmc_psu_redundancy_lost" in notified(receiver), what="the feed's notification"
        )
        assert ("drain_request", "node-2") not in kinds(receiver)
        await cluster.inject(Fault(0, "node-2", FaultKind.PSU_FAILURE, {"psu": 1}))
        # The rule's notification goes out beside its drain, not after it: wait for both.
        await wait_until(
            lambda: (
                "bmc_psu_failed_no_redundancy" in notified(receiver)
                and ("drain_request", "node-2") in kinds(receiver)
            ),
            what="the drain's rule: its notification and its drain",
        )
        await wait_until(lambda: "bmc_sel_entry" in notified(receiver), what="the SEL entry")
        status, body = api(service, "GET", "/api/v1/events?node=node-2&kind=psu_failed")
        assert status == 200
        devices = [e["target"]["device"] for e in body["events"]]
        assert devices == ["PSU4", "PSU5", "PSU1"]  # the unfed two, then the broken one
        assert "input lost" in body["events"][0]["detail"]
        assert all(e["target"]["kind"] == "node" for e in body["events"])
        acted_on = {d.body["payload"]["node"] for d in receiver.deliveries()}
        assert acted_on == {"node-2"}  # nobody else
    finally:
        await cluster.stop()
        await service.stop(grace=None)
