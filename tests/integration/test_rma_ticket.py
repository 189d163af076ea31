"""rma_ticket and the reboot webhook end to end: simulated faults, a real collector, the real
signed webhook receiver; the ticket's evidence bundle opens as a tar holding the incident."""

import base64
import dataclasses
import hashlib
import io
import json
import tarfile
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from collector.actions.config import WebhookConfig
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import SECRET, actions, journaled, later_ticks, start

pytestmark = pytest.mark.integration

RULES = """\
version: 1
rules:
  - name: gpu_off_the_bus
    scope: gpu
    when: '!gpu.present'
    severity: critical
    description: The GPU fell off the bus
    actions: [drain_node, rma_ticket]
"""
REBOOT_RULES = """\
version: 1
rules:
  - name: gpu_off_the_bus
    scope: gpu
    when: '!gpu.present'
    severity: critical
    actions: [{reboot_node: {reason: Xid 79}}]
"""


def hook(receiver, tmp_path: Path, path: str) -> WebhookConfig:
    secret = tmp_path / "rma.secret"
    secret.write_bytes(SECRET + b"\n")
    return WebhookConfig(url=f"{receiver.url}{path}", secret_file=secret, max_attempts=2)


async def run(collector_config, receiver, tmp_path: Path, rules: str, **acts: Any):
    path = tmp_path / "rules.yaml"
    path.write_text(rules)
    config = dataclasses.replace(actions(receiver, tmp_path), **acts)
    return await start(collector_config, tmp_path, config, rules=(path,))


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        out = {}
        for info in tar.getmembers():
            if info.isfile():
                member = tar.extractfile(info)
                assert member is not None
                out[info.name.split("/", 1)[1]] = member.read()
    return out


def delivered(receiver, kind: str) -> list[dict[str, Any]]:
    return [d.body for d in receiver.deliveries() if d.body["kind"] == kind]


async def test_a_ticket_carries_the_nodes_evidence(collector_config, receiver, tmp_path: Path):
    """Xid 79 on node-2: the node is drained, then one signed rma_request names the incident,
    the node and the GPU (UUID, bus id), and attaches the node's bundle, whose sha256 matches
    and which opens as a tar holding the incident, the Xid event and the kernel's line. The
    node is in RMA; later ticks send nothing more."""
    service, cluster = await run(
        collector_config, receiver, tmp_path, RULES, rma_webhook=hook(receiver, tmp_path, "/rma")
    )
    try:
        cluster.nodes["node-2"].xid(3, 79)
        outcomes = (("drain_node", "succeeded"), ("rma_ticket", "succeeded"))
        await wait_until(partial(journaled, service, "node-2", *outcomes), what="the ticket")
        await later_ticks(service)
        (envelope,) = delivered(receiver, "rma_request")
        assert envelope["idempotency_key"].startswith("rma_ticket:gpu_off_the_bus:node-2/gpu/3:")
        ticket = envelope["payload"]
        gpu = next(g for g in service.fleet.snapshot()["node-2"].gpus.values() if g.index == 3)
        assert ticket["gpu"] == {
            "index": 3,
            "uuid": gpu.uuid,
            "serial": None,
            "pci_bus_id": gpu.pci_bus_id,
            "model": gpu.model,
        }
        assert (ticket["node"], ticket["rule"], ticket["description"]) == (
            "node-2",
            "gpu_off_the_bus",
            "The GPU fell off the bus",
        )
        bundle = ticket["bundle"]
        assert bundle["attached"] is True
        data = base64.b64decode(bundle["data_base64"])
        assert hashlib.sha256(data).hexdigest() == bundle["sha256"]
        assert len(data) == bundle["bytes"]
        assert bundle["name"].startswith("fleetwatch-evidence-node-2-")
        files = members(data)
        incidents = [json.loads(line) for line in files["incidents.jsonl"].splitlines()]
        assert ticket["incident"] in [i["id"] for i in incidents]
        events = [json.loads(line) for line in files["events.jsonl"].splitlines()]
        assert "gpu_lost" in [e["kind"] for e in events]
        assert b"Xid" in files["kernel.log"]
        assert json.loads(files["manifest.json"]) == bundle["manifest"]
        lifecycle = service.lifecycle.row("node-2")
        assert lifecycle is not None
        assert (lifecycle.state, lifecycle.actor, lifecycle.incident) == (
            "rma",
            "action:rma_ticket",
            ticket["incident"],
        )
    finally:
        await cluster.stop()
        await service.stop(grace=None)


async def test_a_bundle_over_the_limit_goes_as_its_manifest(
    collector_config, receiver, tmp_path: Path
):
    """``max_bundle_bytes`` below the bundle's size: the ticket carries the manifest, the
    digest and where to fetch the whole bundle, and the journal says it was not attached."""
    service, cluster = await run(
        collector_config,
        receiver,
        tmp_path,
        RULES,
        rma_webhook=hook(receiver, tmp_path, "/rma"),
        rma_max_bundle_bytes=100,
    )
    try:
        cluster.nodes["node-3"].xid(1, 79)
        await wait_until(
            partial(journaled, service, "node-3", ("rma_ticket", "succeeded")), what="the ticket"
        )
        (envelope,) = delivered(receiver, "rma_request")
        bundle = envelope["payload"]["bundle"]
        assert bundle["attached"] is False
        assert "data_base64" not in bundle
        assert bundle["bytes"] > 100
        assert "GET /api/v1/nodes/node-3/evidence" in bundle["why"]
        names = [f["name"] for f in bundle["manifest"]["files"]]
        assert "incidents.jsonl" in names
        rows = await service.journal.do(lambda s: s.incidents.actions(node="node-3"))
        (ticket,) = [r for r in rows if r.action == "rma_ticket"]
        assert "no bundle attached: the bundle is" in ticket.detail
    finally:
        await cluster.stop()
        await service.stop(grace=None)


async def test_a_reboot_through_the_webhook(collector_config, receiver, tmp_path: Path):
    """Without Slurm, reboot_node asks the reboot webhook: one signed reboot_request with
    fleetwatch's reason, to drain first and come back down; the node is in repair and held."""
    service, cluster = await run(
        collector_config,
        receiver,
        tmp_path,
        REBOOT_RULES,
        reboot_webhook=hook(receiver, tmp_path, "/reboot"),
    )
    try:
        cluster.nodes["node-4"].xid(0, 79)
        await wait_until(
            partial(journaled, service, "node-4", ("reboot_node", "succeeded")), what="reboot"
        )
        await later_ticks(service)
        (envelope,) = delivered(receiver, "reboot_request")
        payload = envelope["payload"]
        incident = envelope["idempotency_key"].removeprefix("reboot_node:")
        assert payload == {
            "node": "node-4",
            "reason": f"fleetwatch: gpu_off_the_bus: GPU 0: Xid 79 (incident {incident})",
            "drain_first": True,
            "next_state": "down",
        }
        assert service.lifecycle.state("node-4").value == "in_repair"
        assert service.dispatcher.drained == {"node-4": incident}
    finally:
        await cluster.stop()
        await service.stop(grace=None)
