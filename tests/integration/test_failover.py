"""An agent with several collectors: it starts on its own, fails over when that one dies, and
replays its outbox on the next, so every event is journaled once across the collectors."""

import asyncio
import contextlib
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent.agent import Agent
from agent.config import AgentConfig
from agent.link.collector_list import start_index
from agent.link.stream import (
    AWAY_SIGNAL,
    CONNECT_FAILED,
    FAILOVERS_SIGNAL,
    INDEX_SIGNAL,
    STREAM_LOST,
)
from agent.main import build_agent
from agent.sim.cluster import sim_hardware
from agent.sim.hardware import SimNode
from collector.config import CollectorConfig
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until
from tests.tls_pki import make_pki

pytestmark = pytest.mark.integration

NODE = "gpu-node-017"


def placed(node: str, order: list[str]) -> list[str]:
    """``order`` as a collector list in which ``node`` starts on ``order[0]``, then goes on in
    ``order``'s order (a node's start depends on its name)."""
    start = start_index(node, len(order))
    return [order[(i - start) % len(order)] for i in range(len(order))]


def address(service: CollectorService) -> str:
    return f"127.0.0.1:{service.grpc_port}"


class Collectors:
    """Collectors on loopback, each with its own journal; stopped at the test's end if running."""

    def __init__(self, make: Callable[..., CollectorConfig]) -> None:
        self._make = make
        self.running: list[CollectorService] = []

    async def start(self, **values: Any) -> CollectorService:
        service = CollectorService(self._make(**values), SystemClock())
        await service.start()
        self.running.append(service)
        return service

    async def kill(self, service: CollectorService) -> None:
        """Stop at once: every stream is cut, as when the host dies."""
        self.running.remove(service)
        await service.stop(grace=None)


@pytest.fixture
async def collectors(
    collector_config: Callable[..., CollectorConfig],
) -> AsyncIterator[Collectors]:
    started = Collectors(collector_config)
    try:
        yield started
    finally:
        for service in list(started.running):
            await started.kill(service)


def journaled(journal: Path) -> list[tuple[str, str, int, str]]:
    """(node, boot, seq, marker) of every Xid event in a collector's SQLite journal."""
    with contextlib.closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True)) as conn:
        rows = conn.execute(
            "SELECT node, boot_id, seq, detail FROM events WHERE kind = 'xid'"
        ).fetchall()
    return [(node, boot, seq, detail.rsplit(", ", 1)[-1]) for node, boot, seq, detail in rows]


def markers(journal: Path) -> set[str]:
    return {row[3] for row in journaled(journal)} if journal.exists() else set()


@contextlib.asynccontextmanager
async def running_agent(
    tmp_path: Path, targets: list[str], **values: Any
) -> AsyncIterator[tuple[SimNode, Agent]]:
    """A simulated node whose agent streams to ``targets``."""
    clock = SystemClock()
    sim = SimNode(NODE, tmp_path / "nodes" / NODE / "sys", clock)
    cfg = AgentConfig(
        collectors=tuple(targets),
        node=NODE,
        poll_interval=0.05,
        heartbeat_interval=0.2,
        # The default first window (0.5 s) and a ceiling far above the test's waits: a
        # failover must not wait for the backoff to grow.
        backoff_initial=0.5,
        backoff_max=30.0,
        counter_interval=1.0,
        state_dir=None,
        job_socket=None,
        memory_max_bytes=0,
        poll_cpu_max_share=0.0,
        **values,
    )
    agent = build_agent(cfg, sim_hardware(sim), clock)
    task = asyncio.create_task(agent.run())
    try:
        yield sim, agent
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_failover_past_a_dead_collector_replays_each_event_once(
    collectors: Collectors, tmp_path: Path
):
    """The node's own collector dies; the next in its list is dead too; the agent reaches the
    third and sends there what was raised meanwhile. Each collector has its own journal: what
    the first acked is not sent again, nothing unacked is lost, and the third hears where the
    agent is (its list position, away from home, two moves)."""
    first = await collectors.start(journal=tmp_path / "a.db")
    third = await collectors.start(journal=tmp_path / "c.db")
    dead = f"127.0.0.1:{free_port()}"
    targets = placed(NODE, [address(first), dead, address(third)])
    injected: list[str] = []

    def raise_xids(sim: SimNode, count: int) -> list[str]:
        new = [f"marker-{len(injected) + i}" for i in range(count)]
        for marker in new:
            sim.xid(len(injected) % 8, 13, marker)
            injected.append(marker)
        return new

    with capture_logs() as logs:
        async with running_agent(tmp_path, targets) as (sim, agent):
            await wait_until(lambda: agent.link.connected, what="connected")
            assert agent.link.target == address(first)
            before = raise_xids(sim, 20)
            await wait_until(
                lambda: markers(tmp_path / "a.db") == set(before) and not agent.outbox,
                what="the first collector journaled and acked them",
            )
            await collectors.kill(first)
            during = raise_xids(sim, 20)  # while the agent moves on
            await wait_until(
                lambda: agent.link.connected and agent.link.target == address(third),
                what="connected to the third collector",
            )
            after = raise_xids(sim, 5)
            await wait_until(
                lambda: markers(tmp_path / "c.db") == set(during + after) and not agent.outbox,
                what="the third collector journaled and acked the rest",
            )
            node = third.fleet.snapshot()[NODE]
            assert node.signals[INDEX_SIGNAL] == targets.index(address(third))
            assert (node.signals[AWAY_SIGNAL], node.signals[FAILOVERS_SIGNAL]) == (1, 2)
    rows = journaled(tmp_path / "a.db") + journaled(tmp_path / "c.db")
    assert max(Counter(row[:3] for row in rows).values()) == 1  # once per (node, boot, seq)
    assert sorted(row[3] for row in rows) == sorted(injected)
    assert {row[3] for row in journaled(tmp_path / "a.db")} == set(before)
    moves = [(e["from"], e["to"], e["reason"]) for e in logs if e["event"] == "collector_failover"]
    assert moves == [
        (address(first), dead, STREAM_LOST),
        (dead, address(third), CONNECT_FAILED),
    ]


async def test_each_collector_is_verified_for_its_own_host_name(
    collectors: Collectors, tmp_path: Path
):
    """With mTLS and no tls_server_name, each collector's certificate is checked for the host
    the agent dials: one certified for 127.0.0.1 only, the next for localhost only; the agent
    streams to both in turn."""
    pki = make_pki(tmp_path / "pki")
    first = await collectors.start(journal=tmp_path / "a.db", **pki.collector("127.0.0.1"))
    second = await collectors.start(journal=tmp_path / "b.db", **pki.collector("localhost"))
    second_address = f"localhost:{second.grpc_port}"
    targets = placed(NODE, [address(first), second_address])
    async with running_agent(tmp_path, targets, **pki.node(NODE)) as (sim, agent):
        await wait_until(lambda: agent.link.connected, what="connected")
        assert agent.link.target == address(first)
        await collectors.kill(first)
        sim.xid(0, 13, "marker-tls")
        await wait_until(
            lambda: agent.link.connected and agent.link.target == second_address,
            what="connected to the second collector",
        )
        await wait_until(lambda: not agent.outbox, what="the Xid acked by the second")
        assert agent.link.connections == 2
    assert [row[3] for row in journaled(tmp_path / "b.db")] == ["marker-tls"]
