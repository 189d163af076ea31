"""The PostgreSQL server under two collectors goes down (SIGKILL, then a clean stop) and comes back.

A server of the test's own (durable, as in production), one database shared by two collectors,
four simulated nodes streaming Xid events with unique markers throughout. The collectors are not
restarted: they ride the outages out, their agents keep what was not acked and send it again once
the journal is back. Every marker ends up journaled once, and every GPU that had a fault gets its
notification once. A collector that starts while the server is down waits for it instead of
exiting as if its configuration were wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from agent.sim.cluster import SimCluster
from cli.dev.pg_server import PgServer
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until
from tests.integration.fleet_harness import actions

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

NODES = [f"node-{i}" for i in range(1, 5)]
MARKER = re.compile(r"db-restart-(\d+)")


@pytest.fixture
def own_server() -> Iterator[PgServer]:
    """A server this test may kill (the session's is shared by other tests)."""
    server = PgServer(durable=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def markers(dsn: str) -> Counter[int]:
    with contextlib.suppress(psycopg.Error), psycopg.connect(dsn, connect_timeout=3) as conn:
        rows = conn.execute("SELECT detail FROM events WHERE detail LIKE '%db-restart-%'")
        return Counter(int(m[1]) for (d,) in rows.fetchall() if (m := MARKER.search(str(d))))
    return Counter()


def notified(receiver: WebhookReceiver) -> Counter[str]:
    return Counter(
        d.body["payload"]["target"]
        for d in receiver.deliveries()
        if d.body["kind"] == "notification" and d.body["payload"]["rule"] == "xid_application_error"
    )


def failed_commits(services: list[CollectorService]) -> list[int]:
    return [sum(s.stats.journal.failures.values()) for s in services]


async def failing_since(services: list[CollectorService], before: list[int]) -> None:
    """Every collector failed to journal what its agents sent since ``before``."""
    await wait_until(
        lambda: all(n > b for n, b in zip(failed_commits(services), before, strict=True)),
        60,
        "every collector's commits failing",
    )


async def test_collectors_ride_out_database_restarts(
    collector_config: Callable[..., CollectorConfig],
    own_server: PgServer,
    receiver: WebhookReceiver,
    tmp_path: Path,
) -> None:
    dsn = own_server.create_database("restarts")
    acts = actions(receiver, tmp_path)
    services: list[CollectorService] = []
    for name in ("c1", "c2"):
        cfg = collector_config(journal_dsn=dsn, name=name, actions=acts, rules_interval=0.1)
        service = CollectorService(cfg, SystemClock())
        await service.start()
        services.append(service)
    clusters = [
        SimCluster(
            NODES[i::2],
            tmp_path / f"nodes-{i}",
            SystemClock(),
            f"127.0.0.1:{services[i].grpc_port}",
            poll_interval=0.05,
            heartbeat_interval=0.3,
            backoff_initial=0.05,
            backoff_max=0.5,
        )
        for i in range(2)
    ]
    for cluster in clusters:
        cluster.start()
    injected: list[str] = []  # marker number -> node
    faulted: set[str] = set()

    async def inject(count: int) -> None:
        for _ in range(count):
            node = NODES[len(injected) % len(NODES)]
            gpu = (len(injected) // len(NODES)) % 8
            cluster = clusters[NODES.index(node) % 2]
            cluster.nodes[node].xid(gpu, 13, f"db-restart-{len(injected)}")
            injected.append(node)
            faulted.add(f"{node}/gpu/{gpu}")
            await asyncio.sleep(0.02)  # events spread over time, as a fleet sends them

    try:
        await wait_until(
            lambda: all(a.link.connected for c in clusters for a in c.agents.values()),
            60,
            "agents connected",
        )
        await inject(20)
        before = failed_commits(services)
        own_server.kill()  # SIGKILL: no checkpoint, the server recovers from its WAL
        await inject(20)  # while it is down: held by the agents
        await failing_since(services, before)
        await asyncio.to_thread(own_server.restart)
        await inject(20)
        before = failed_commits(services)
        await asyncio.to_thread(own_server.shut_down)  # a clean stop this time
        await inject(20)
        await failing_since(services, before)
        await asyncio.to_thread(own_server.restart)
        await inject(20)
        want = set(range(len(injected)))
        await wait_until(lambda: set(markers(dsn)) >= want, 90, "every marker journaled")
        await wait_until(lambda: set(notified(receiver)) >= faulted, 60, "every GPU notified")
        # the services were never restarted: they are the ones that started
        assert all(s.grpc_port for s in services)
    finally:
        for cluster in clusters:
            await cluster.stop()
        for service in services:
            await service.stop(grace=None)
    counts = markers(dsn)
    assert [m for m, n in counts.items() if n > 1] == []
    assert sorted(counts) == list(range(len(injected)))
    per_target = notified(receiver)
    assert {t: n for t, n in per_target.items() if n > 1} == {}
    assert set(per_target) == faulted


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_collector_started_while_the_database_is_down_waits_for_it(
    own_server: PgServer, tmp_path: Path
) -> None:
    dsn = own_server.create_database("late")
    own_server.shut_down()
    port = free_port()
    config = tmp_path / "c.toml"
    config.write_text(
        f'[collector]\nlisten = "127.0.0.1:{port}"\nhttp = "127.0.0.1:0"\n'
        f'journal_dsn = "{dsn}"\nname = "late"\n'
    )
    log = tmp_path / "c.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "collector", "--config", str(config)],
            stdout=out,
            stderr=out,
        )
    try:
        asyncio.run(_wait_for(lambda: "journal_unreachable" in log.read_text() or proc.poll()))
        assert proc.poll() is None, log.read_text()[-2000:]  # still there, waiting
        assert "journal_unreachable" in log.read_text()
        own_server.restart()
        asyncio.run(_wait_for(lambda: listening(port) or proc.poll() is not None))
        assert proc.poll() is None, log.read_text()[-2000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


async def _wait_for(predicate: Callable[[], Any]) -> None:
    await wait_until(predicate, 60, "the collector")
