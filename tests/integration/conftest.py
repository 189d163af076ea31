"""Fixtures of the integration tests: a webhook receiver, a collector acting through it, the
pre-flight test bed, and a journal on either store backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from agent.sim.cluster import SimCluster
from cli.dev.webhook_receiver import WebhookReceiver
from collector.main import CollectorService
from collector.preflight.plan import PlanTimes
from collector.store.postgres import PostgresReader, PostgresStore
from collector.store.sqlite import JournalReader, SqliteStore
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import SECRET, actions, start
from tests.integration.preflight_bed import NODES, Bed, Fixed, UtilRounds, runners_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

    from collector.config import CollectorConfig
    from collector.store.events import EventStore
    from tests.integration.store_backend import Open


@pytest.fixture
def receiver() -> Any:
    with WebhookReceiver(clock=SystemClock(), secret=SECRET) as hooks:
        yield hooks


@pytest.fixture
async def running(
    collector_config: Callable[..., CollectorConfig],
    receiver: WebhookReceiver,
    tmp_path: Path,
) -> AsyncIterator[tuple[CollectorService, SimCluster]]:
    service, cluster = await start(collector_config, tmp_path, actions(receiver, tmp_path))
    try:
        yield service, cluster
    finally:
        await cluster.stop()
        await service.stop(grace=None)


@pytest.fixture
async def bed(
    collector_config: Callable[..., CollectorConfig],
    receiver: WebhookReceiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Bed]:
    """A collector and four simulated nodes whose measured checks run on fixed figures."""
    config = collector_config(actions=actions(receiver, tmp_path), rules_interval=0.1)
    service = CollectorService(config, SystemClock())
    service.preflight.times = PlanTimes(quick_s=20, node_bandwidth_s=20, ib_s=20, ladder_s=20)
    service.preflight.answer_margin_s = 3.0
    await service.start()
    figures: dict[str, Fixed] = {}
    cluster = SimCluster(
        NODES,
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.1,
        heartbeat_interval=0.3,
        preflight=runners_of(figures, UtilRounds(monkeypatch)),
    )
    cluster.start()
    try:
        # welcomed: the collector's end of each stream took the Hello, tasks may go out
        await wait_until(
            lambda: all(a.link.connected for a in cluster.agents.values()),
            what="agents welcomed",
        )
        yield Bed(service, cluster, figures, receiver)
    finally:
        for f in figures.values():
            if f.hang is not None:
                f.hang.set()
        await cluster.stop()
        await service.stop(grace=0)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Open]:
    """(open a store as collector NAME, open a reader) on one journal of either backend."""
    if request.param == "sqlite":
        path = tmp_path / "journal.db"
        yield (lambda name: SqliteStore(path, name)), (lambda: JournalReader(path))
        return
    dsn: str = request.getfixturevalue("pg_dsn")
    opened: list[EventStore] = []

    def store(name: str) -> EventStore:
        opened.append(PostgresStore(dsn, collector=name))
        return opened[-1]

    yield store, (lambda: PostgresReader(dsn))
    for s in opened:
        s.close()
