"""A collector restarted on a shared journal still drains its own nodes after its peers drained.

Two collectors on one PostgreSQL journal, two nodes each, the drain cap at the whole fleet. The
peer drains both of its nodes, this collector one of its own; then this collector restarts (as
after a crash). Its own second node's fault must still be drained: the peer's drains count
fleet-wide, but must not fill this collector's own cap (which counts its own nodes). Before the
fix they did, and ``bench/chaos.py --journal postgres`` lost 29 of 64 drains that way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from agent.sim.cluster import SimCluster
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until
from tests.integration.fleet_harness import actions

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

XID_CONTACT_SUPPORT = 61  # the built-in xid_needs_reboot_or_rma drains the node


def drained(receiver: WebhookReceiver) -> list[str]:
    return sorted(
        d.body["payload"]["node"]
        for d in receiver.deliveries()
        if d.body["kind"] == "drain_request"
    )


def cluster(nodes: list[str], root: Path, port: int) -> SimCluster:
    return SimCluster(
        nodes,
        root,
        SystemClock(),
        f"127.0.0.1:{port}",
        poll_interval=0.05,
        heartbeat_interval=0.3,
        backoff_initial=0.05,
        backoff_max=0.3,
    )


async def test_a_restarted_collector_still_drains_its_own_nodes(
    collector_config: Callable[..., CollectorConfig],
    pg_dsn: str,
    receiver: WebhookReceiver,
    tmp_path: Path,
) -> None:
    acts = actions(receiver, tmp_path, max_drained_nodes=100, max_drained_share=1.0)
    port = free_port()

    def config(name: str, listen: str) -> CollectorConfig:
        return collector_config(
            journal_dsn=pg_dsn, name=name, actions=acts, rules_interval=0.1, listen=listen
        )

    ours, theirs = ["own-1", "own-2"], ["peer-1", "peer-2"]
    here = CollectorService(config("here", f"127.0.0.1:{port}"), SystemClock())
    peer = CollectorService(config("peer", "127.0.0.1:0"), SystemClock())
    await here.start()
    await peer.start()
    own_nodes = cluster(ours, tmp_path / "own", port)
    peer_nodes = cluster(theirs, tmp_path / "peer", peer.grpc_port)
    own_nodes.start()
    peer_nodes.start()
    services = [here, peer]
    try:
        await wait_until(
            lambda: all(
                a.link.connected for c in (own_nodes, peer_nodes) for a in c.agents.values()
            ),
            30,
            "agents connected",
        )
        for name in theirs:
            peer_nodes.nodes[name].xid(0, XID_CONTACT_SUPPORT, "peer fault")
        own_nodes.nodes["own-1"].xid(0, XID_CONTACT_SUPPORT, "own fault")
        await wait_until(lambda: len(drained(receiver)) == 3, 30, "three drains")

        await here.stop(grace=None)  # this collector goes down, and comes back
        services.remove(here)
        here = CollectorService(config("here", f"127.0.0.1:{port}"), SystemClock())
        await here.start()
        services.append(here)
        await wait_until(
            lambda: all(a.link.connected for a in own_nodes.agents.values()), 30, "reconnected"
        )
        own_nodes.nodes["own-2"].xid(0, XID_CONTACT_SUPPORT, "own fault after the restart")
        await wait_until(lambda: len(drained(receiver)) == 4, 30, "the fourth drain")
    finally:
        await own_nodes.stop()
        await peer_nodes.stop()
        for service in services:
            await service.stop(grace=None)
    assert drained(receiver) == ["own-1", "own-2", "peer-1", "peer-2"]
