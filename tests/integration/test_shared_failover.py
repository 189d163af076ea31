"""Three collectors on one PostgreSQL journal, one killed mid-run: agents move, nothing is lost,
nothing is done twice.

Nine simulated nodes, each with its real agent holding the three collectors in its list; every
agent starts on the collector its node name picks. Xid events are raised on every node before,
during and after the kill of the collector that holds the most nodes. Then every node streams to
a survivor, the journal holds every event exactly once, and each node whose GPU fell off the bus
was drained once, however many collectors saw it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from agent.sim.cluster import SimCluster
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import actions

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from collector.config import CollectorConfig
    from fleetwatch.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.integration

NODES = [f"node-{i}" for i in range(1, 10)]


def holders(services: list[CollectorService]) -> dict[str, str]:
    """node -> the collector it streams to now."""
    return {
        name: service.peers.name
        for service in services
        for name, node in service.fleet.view().items()
        if node.connected
    }


XIDS_PER_NODE = "SELECT node, COUNT(*) FROM events WHERE xid > 0 GROUP BY node ORDER BY node"
DUPLICATES = (
    "SELECT node, boot_id, seq FROM events WHERE seq IS NOT NULL "
    "GROUP BY node, boot_id, seq HAVING COUNT(*) > 1"
)
DRAINS_RUN = (
    "SELECT node, COUNT(*) FROM actions WHERE action = 'drain_node' AND state = 'succeeded' "
    "GROUP BY node ORDER BY node"
)
UNREACHABLE = "SELECT COUNT(*) FROM events WHERE kind = 'node_unreachable'"


def query(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def drains(receiver: WebhookReceiver) -> Counter[str]:
    return Counter(
        d.body["payload"]["node"]
        for d in receiver.deliveries()
        if d.body["kind"] == "drain_request"
    )


async def test_three_collectors_one_killed(
    collector_config: Callable[..., CollectorConfig],
    pg_dsn: str,
    receiver: WebhookReceiver,
    tmp_path: Path,
) -> None:
    # Every drain may run (the cap and the breaker are fleet-wide, and tested elsewhere).
    acts = actions(
        receiver, tmp_path, max_drained_nodes=100, max_drained_share=1.0, breaker_max_drains=100
    )
    services: list[CollectorService] = []
    for name in ("c1", "c2", "c3"):
        cfg = collector_config(
            journal_dsn=pg_dsn, name=name, actions=acts, rules_interval=0.1, heartbeat_interval=0.3
        )
        services.append(CollectorService(cfg, SystemClock()))
        await services[-1].start()
    addresses = [f"127.0.0.1:{s.grpc_port}" for s in services]
    cluster = SimCluster(
        NODES,
        tmp_path / "nodes",
        SystemClock(),
        addresses,
        poll_interval=0.05,
        heartbeat_interval=0.2,
    )
    cluster.start()
    raised: Counter[str] = Counter()

    def xid(node: str, gpu: int, code: int) -> None:
        cluster.nodes[node].xid(gpu, code)
        raised[node] += 1

    try:
        await wait_until(lambda: len(holders(services)) == len(NODES), what="all connected")
        placement = holders(services)
        assert len(set(placement.values())) == 3  # the names spread over all three
        victim_name = Counter(placement.values()).most_common(1)[0][0]
        victim = next(s for s in services if s.peers.name == victim_name)
        survivors = [s for s in services if s is not victim]
        on_victim = sorted(n for n, c in placement.items() if c == victim_name)
        elsewhere = sorted(n for n, c in placement.items() if c != victim_name)

        drained_before, drained_after = on_victim[0], elsewhere[0]
        xid(drained_before, 0, 79)  # drained through the victim, before it dies
        for node in NODES:
            xid(node, 2, 13)  # an application Xid: journaled and notified, nothing drained
        await wait_until(lambda: drains(receiver)[drained_before] == 1, what="first drain")

        for node in on_victim:  # in flight while the victim dies
            xid(node, 3, 13)
        await victim.stop(grace=None)
        for node in NODES:  # raised while the victim's nodes are moving
            xid(node, 4, 13)
        await wait_until(
            lambda: set(holders(survivors)) == set(NODES), what="every node on a survivor"
        )
        moved = holders(survivors)
        assert {moved[n] for n in on_victim} <= {s.peers.name for s in survivors}
        xid(drained_before, 1, 79)  # again, on the collector it moved to
        xid(drained_after, 1, 79)
        for node in NODES:
            xid(node, 5, 13)
        await wait_until(lambda: drains(receiver)[drained_after] == 1, what="second drain")

        for _ in range(150):
            if query(pg_dsn, XIDS_PER_NODE) == sorted(raised.items()):
                break
            await asyncio.sleep(0.1)
        assert query(pg_dsn, XIDS_PER_NODE) == sorted(raised.items())  # nothing lost
        assert query(pg_dsn, DUPLICATES) == []  # nothing journaled twice
        await asyncio.sleep(0.5)  # later ticks on any collector must not drain again
        assert drains(receiver) == Counter({drained_before: 1, drained_after: 1})
        assert query(pg_dsn, DRAINS_RUN) == sorted([(drained_before, 1), (drained_after, 1)])
        assert query(pg_dsn, UNREACHABLE) == [(0,)]  # the survivors saw moves, not silences
    finally:
        await cluster.stop()
        for service in services:
            with contextlib.suppress(Exception):
                await service.stop(grace=None)
