"""Three collectors on one PostgreSQL journal, one killed (SIGKILL) mid-run: agents move,
nothing is lost, nothing is done twice.

Nine simulated nodes, each with its real agent holding the three collectors in its list; every
agent starts on the collector its node name picks. Xid events are raised on every node before,
during and after the SIGKILL of collector c1, which runs in a process of its own. Then every node
streams to a survivor, the journal holds every event exactly once, and each node whose GPU fell
off the bus was drained once, however many collectors saw it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import socket
import subprocess
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from agent.link.collector_list import start_index
from agent.sim.cluster import SimCluster
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_for_more, wait_until
from tests.integration.fleet_harness import actions

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.config import CollectorConfig

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


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on the loopback ``port``."""
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def start_victim(port: int, dsn: str, receiver_url: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """Collector c1 in a process of its own, to be killed with SIGKILL."""
    secret = tmp_path / "secret"  # written by actions()
    config = tmp_path / "c1.toml"
    hook = f'url = "{receiver_url}/hooks"\nsecret_file = "{secret}"\nmax_attempts = 2\n'
    config.write_text(
        f'[collector]\nlisten = "127.0.0.1:{port}"\nhttp = "127.0.0.1:0"\n'
        f'journal_dsn = "{dsn}"\nname = "c1"\nheartbeat_interval = 0.3\nrules_interval = 0.1\n'
        "[collector.actions]\nmax_drained_nodes = 100\nmax_drained_share = 1.0\n"
        "breaker_max_drains = 100\n"
        f"[collector.actions.drain_webhook]\n{hook}"
        f"[collector.actions.notify.default]\n{hook}"
    )
    with (tmp_path / "c1.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", "collector", "--config", str(config)],
            stdout=log,
            stderr=log,
        )


async def test_three_collectors_one_killed(  # noqa: C901, PLR0915 - one story, start to end
    collector_config: Callable[..., CollectorConfig],
    pg_dsn: str,
    receiver: WebhookReceiver,
    tmp_path: Path,
) -> None:
    # Every drain may run (the cap and the breaker are fleet-wide, and tested elsewhere).
    acts = actions(
        receiver, tmp_path, max_drained_nodes=100, max_drained_share=1.0, breaker_max_drains=100
    )
    victim_port = free_port()
    victim = start_victim(victim_port, pg_dsn, receiver.url, tmp_path)
    # Agents start on the collector their name picks only if it listens: one that is still
    # starting (a loaded machine) sends them to a survivor, where they stay.
    await wait_until(
        lambda: victim.poll() is not None or listening(victim_port),
        timeout=60,
        what="collector c1 listening",
    )
    assert victim.poll() is None, (tmp_path / "c1.log").read_text()[-2000:]
    survivors: list[CollectorService] = []
    for name in ("c2", "c3"):
        cfg = collector_config(
            journal_dsn=pg_dsn, name=name, actions=acts, rules_interval=0.1, heartbeat_interval=0.3
        )
        survivors.append(CollectorService(cfg, SystemClock()))
        await survivors[-1].start()
    addresses = [f"127.0.0.1:{victim_port}", *(f"127.0.0.1:{s.grpc_port}" for s in survivors)]
    on_victim = sorted(n for n in NODES if start_index(n, 3) == 0)
    assert on_victim  # the names spread over all three collectors
    # Built off the loop: writing nine simulated sysfs trees takes seconds on a loaded machine,
    # which the survivors, on this loop, should not spend stalled.
    cluster = await asyncio.to_thread(
        SimCluster,
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

    def victim_holds() -> list[str]:
        rows = query(pg_dsn, "SELECT name FROM nodes WHERE collector = 'c1' ORDER BY name")
        return [str(name) for (name,) in rows]

    try:
        await wait_until(
            lambda: (
                victim_holds() == on_victim
                and len(holders(survivors)) == len(NODES) - len(on_victim)
            ),
            timeout=30,
            what="every node on the collector its name picks",
        )
        elsewhere = sorted(holders(survivors))
        drained_before, drained_after = on_victim[0], elsewhere[0]
        xid(drained_before, 0, 79)  # drained through the victim, before it dies
        for node in NODES:
            xid(node, 2, 13)  # an application Xid: journaled and notified, nothing drained
        await wait_until(lambda: drains(receiver)[drained_before] == 1, what="first drain")
        # Its outcome journaled too: a kill between the webhook's answer and that write leaves
        # the action running, which only the victim's own restart settles (docs/storage.md).
        await wait_until(
            lambda: query(pg_dsn, DRAINS_RUN) == [(drained_before, 1)], what="drain journaled"
        )

        for node in on_victim:  # in flight while the victim dies
            xid(node, 3, 13)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        for node in NODES:  # raised while the victim's nodes are moving
            xid(node, 4, 13)
        await wait_until(
            lambda: set(holders(survivors)) == set(NODES), what="every node on a survivor"
        )
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
        for service in survivors:  # later ticks on any collector must not drain again
            await wait_for_more(
                functools.partial(getattr, service.incidents, "ticks"), 5, what="rule ticks"
            )
        assert drains(receiver) == Counter({drained_before: 1, drained_after: 1})
        assert query(pg_dsn, DRAINS_RUN) == sorted([(drained_before, 1), (drained_after, 1)])
        assert query(pg_dsn, UNREACHABLE) == [(0,)]  # the survivors saw moves, not silences
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        await cluster.stop()
        for service in survivors:
            with contextlib.suppress(Exception):
                await service.stop(grace=None)
