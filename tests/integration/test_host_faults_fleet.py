"""The kernel's other hardware lines end to end: simulated kernel log -> agent -> gRPC ->
journal -> built-in rules -> webhooks.

Real agents on simulated nodes stream to a real collector on the built-in rules (their times
divided by 60, as the demo does).
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


def notified(receiver: WebhookReceiver) -> set[tuple[str, str]]:
    """(rule, node) of every notification sent."""
    return {
        (d.body["payload"]["rule"], d.body["payload"].get("node", ""))
        for d in receiver.deliveries()
        if d.body["kind"] == "notification"
    }


async def test_read_only_filesystem_fatal_sxid_and_uncorrected_mce_drain_a_corrected_notifies(
    collector_config, receiver: WebhookReceiver, tmp_path: Path
):
    rules = demo_rules(tmp_path, 60.0).path
    service, cluster = await start(
        collector_config,
        tmp_path,
        actions(receiver, tmp_path, max_drained_share=1.0),  # both drains may run
        rules=(rules,),
    )
    try:
        await cluster.inject(Fault(0, "node-2", FaultKind.MCE, {"cpu": 40}))
        await wait_until(
            lambda: ("cpu_machine_check", "node-2") in notified(receiver),
            what="the machine check's notification",
        )
        await cluster.inject(Fault(0, "node-1", FaultKind.FS_READ_ONLY, {"device": "nvme0n1p2"}))
        await cluster.inject(Fault(0, "node-3", FaultKind.SXID_FATAL, {"switch": 1, "sxid": 20034}))
        await cluster.inject(Fault(0, "node-4", FaultKind.MCE_UNCORRECTED, {"cpu": 7}))
        drains = {("drain_request", n) for n in ("node-1", "node-3", "node-4")}
        await wait_until(lambda: drains <= set(kinds(receiver)), what="the three drains")
        # A rule's notification goes out beside its drain, not after it: wait for it too.
        await wait_until(
            lambda: (
                {
                    ("filesystem_read_only", "node-1"),
                    ("nvswitch_fatal_error", "node-3"),
                    ("cpu_machine_check_uncorrected", "node-4"),
                }
                <= notified(receiver)
            ),
            what="the three drains' notifications",
        )
        assert ("drain_request", "node-2") not in kinds(receiver)
        status, body = api(service, "GET", "/api/v1/events?node=node-1&kind=fs_read_only")
        assert status == 200
        (event,) = body["events"]
        assert (event["target"]["kind"], event["target"]["device"]) == ("node", "nvme0n1p2")
        assert "Remounting filesystem read-only" in event["detail"]
        status, body = api(service, "GET", "/api/v1/events?node=node-3&kind=sxid_fatal")
        (sxid,) = body["events"]
        assert sxid["xid"] == 20034
        assert sxid["target"]["kind"] == "pci"
        assert sxid["target"]["device"] == "0000:06:00.0"
        status, body = api(service, "GET", "/api/v1/events?node=node-2&kind=machine_check")
        assert [e["target"]["device"] for e in body["events"]] == ["cpu40"]
        status, body = api(
            service, "GET", "/api/v1/events?node=node-4&kind=machine_check_uncorrected"
        )
        assert [e["target"]["device"] for e in body["events"]] == ["cpu7"]
    finally:
        await cluster.stop()
        await service.stop(grace=None)
