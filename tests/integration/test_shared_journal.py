"""Several collectors on one PostgreSQL journal: one fleet, one drain cap, one action per fault.

Real collectors (in this process, each with its own gRPC and HTTP ports), a real PostgreSQL
server, simulated nodes with their real agents, and a real signed-webhook receiver that both
collectors' drains and notifications go to.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

import pytest

from agent.sim.cluster import SimCluster
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_for_more, wait_until
from tests.integration.fleet_harness import actions, api, start

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.config import CollectorConfig
    from collector.main import CollectorService
    from collector.store.incidents import ActionRow

pytestmark = pytest.mark.integration


def drains(receiver: WebhookReceiver) -> list[str]:
    return [
        d.body["payload"]["node"]
        for d in receiver.deliveries()
        if d.body["kind"] == "drain_request"
    ]


async def more_ticks(services: list[CollectorService], more: int) -> None:
    """Wait until each of ``services`` ran ``more`` rule ticks from now."""
    for service in services:
        await wait_for_more(
            functools.partial(getattr, service.incidents, "ticks"),
            more,
            what=f"{service.peers.name} ticks",
        )


def on_shared(
    collector_config: Callable[..., CollectorConfig], dsn: str, name: str
) -> Callable[..., CollectorConfig]:
    def make(**overrides: Any) -> CollectorConfig:
        return collector_config(journal_dsn=dsn, name=name, **overrides)

    return make


async def two_collectors(
    collector_config: Callable[..., CollectorConfig],
    pg_dsn: str,
    receiver: WebhookReceiver,
    tmp_path: Path,
    **safety: Any,
) -> list[tuple[CollectorService, SimCluster]]:
    acts = actions(receiver, tmp_path, **safety)
    out = []
    for name, nodes in (("c1", ["node-1", "node-2"]), ("c2", ["node-3", "node-4"])):
        (tmp_path / name).mkdir()
        make = on_shared(collector_config, pg_dsn, name)
        out.append(await start(make, tmp_path / name, acts, nodes=nodes))
    return out


async def stop_all(running: list[tuple[CollectorService, SimCluster]]) -> None:
    for service, cluster in running:
        await cluster.stop()
        await service.stop(grace=None)


class TestOneFleet:
    async def test_the_drain_cap_counts_every_collectors_drains(
        self, collector_config, pg_dsn, receiver, tmp_path
    ):
        """Cap 1 over the whole fleet: node-1 (on c1) is drained; node-3's drain (on c2) waits,
        though c2 itself has drained nothing; both collectors show both actions."""
        running = await two_collectors(
            collector_config, pg_dsn, receiver, tmp_path, max_drained_nodes=1
        )
        (c1, n12), (c2, n34) = running
        try:
            n12.nodes["node-1"].xid(0, 79)
            await wait_until(lambda: drains(receiver) == ["node-1"], what="node-1 drained")
            n34.nodes["node-3"].xid(0, 79)
            await wait_until(lambda: len(c2.dispatcher.waiting) == 1, what="node-3 waits")
            await more_ticks([c1, c2], 5)  # each settles what waits: none may drain node-3
            assert drains(receiver) == ["node-1"]
            for service in (c1, c2):
                status, rows = api(service, "GET", "/api/v1/actions?limit=50")
                assert status == 200
                seen = {(r["action"], r["node"], r["state"]) for r in rows["actions"]}
                assert ("drain_node", "node-1", "succeeded") in seen
                assert ("drain_node", "node-3", "deferred") in seen
            (waiting,) = [
                r
                for r in await c2.journal.do(lambda s: s.incidents.actions(node="node-3"))
                if r.action == "drain_node"
            ]
            assert "drain cap reached: 1 of 4 nodes" in waiting.detail
        finally:
            await stop_all(running)

    async def test_the_breaker_opens_for_every_collector(
        self, collector_config, pg_dsn, receiver, tmp_path
    ):
        """One drain per window fleet-wide: c1's drain fills it, so c2's waits on the breaker."""
        running = await two_collectors(
            collector_config,
            pg_dsn,
            receiver,
            tmp_path,
            max_drained_nodes=10,
            max_drained_share=1.0,
            breaker_max_drains=1,
        )
        (_, n12), (c2, n34) = running
        try:
            n12.nodes["node-2"].xid(1, 79)
            await wait_until(lambda: drains(receiver) == ["node-2"], what="node-2 drained")
            n34.nodes["node-4"].xid(1, 79)
            await wait_until(lambda: len(c2.dispatcher.waiting) == 1, what="node-4 waits")
            rows = await c2.journal.do(lambda s: s.incidents.actions(node="node-4"))
            (waiting,) = [r for r in rows if r.action == "drain_node"]
            assert waiting.detail.startswith("circuit breaker opened")
            assert drains(receiver) == ["node-2"]
        finally:
            await stop_all(running)


class TestNodeThatMoved:
    async def test_a_node_drained_through_one_collector_is_not_drained_again_by_another(
        self, collector_config, pg_dsn, receiver, tmp_path
    ):
        """node-1 is drained through c1; c1 dies and node-1's agent moves to c2, which had
        started before that drain. Another GPU of node-1 falls off the bus: c2 opens its own
        incident, and the journal, not c2's memory, says the node is drained already."""
        running = await two_collectors(collector_config, pg_dsn, receiver, tmp_path)
        (c1, n12), (c2, n34) = running
        moved = None
        try:
            n12.nodes["node-1"].xid(0, 79)
            await wait_until(lambda: drains(receiver) == ["node-1"], what="drained via c1")
            assert "node-1" not in c2.dispatcher.drained
            await n12.stop()
            await c1.stop(grace=None)
            # Built off the loop: writing a node's simulated sysfs tree takes a second or more on
            # a loaded machine, long enough for c2 to find node-3 and node-4 silent.
            moved = await asyncio.to_thread(
                SimCluster,
                ["node-1"],
                tmp_path / "moved",
                SystemClock(),
                f"127.0.0.1:{c2.grpc_port}",
                poll_interval=0.05,
                heartbeat_interval=0.2,
            )
            moved.start()
            await wait_until(lambda: "node-1" in c2.fleet.view(), what="node-1 on c2")
            moved.nodes["node-1"].xid(1, 79)

            async def c2_decided() -> list[ActionRow]:
                rows = await c2.journal.do(lambda s: s.incidents.actions(node="node-1"))
                return [r for r in rows if r.action == "drain_node" and r.node == "node-1"]

            for _ in range(100):
                if len(await c2_decided()) == 2:
                    break
                await asyncio.sleep(0.1)
            first, second = reversed(await c2_decided())
            assert first.state == "succeeded"
            assert second.incident_id.startswith("gpu_lost:node-1/gpu/1:")
            assert second.state == "skipped"
            assert second.detail == f"node-1 is already drained by {first.incident_id}"
            await more_ticks([c2], 5)  # later ticks must not drain node-1 again
            assert drains(receiver) == ["node-1"]
        finally:
            if moved is not None:
                await moved.stop()
            await n34.stop()
            await c2.stop(grace=None)
