"""A collector whose journal goes back in time (restored from a backup) and agents that had
already had later events acked: the agents' Hello declares the numbers below what they still
hold as settled, so their streams may start past what the journal holds (a stream that skips
numbers without that is refused), and nothing new is lost or refused."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import TYPE_CHECKING

import pytest

from agent.sim.cluster import SimCluster
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

NODES = ["node-1", "node-2"]


def backup(journal: Path, to: Path) -> None:
    """The online backup docs/deploy.md describes (WAL mode allows it while the collector runs)."""
    with (
        contextlib.closing(sqlite3.connect(journal)) as source,
        contextlib.closing(sqlite3.connect(to)) as target,
    ):
        source.backup(target)


def xids(collector: CollectorService, node: str) -> list[tuple[int, int]]:
    """(seq, xid) of the node's Xid events in the journal, in journal order."""
    return [(r.seq or 0, r.xid) for r in collector.reader.events(node=node, kind="xid")]


async def test_agents_follow_on_from_a_journal_restored_from_a_backup(
    collector_config: Callable[..., CollectorConfig], tmp_path: Path
) -> None:
    """Each node's Xid 13 is journaled and backed up; Xids 31 and 43 are journaled and acked
    after the backup; the collector is stopped and the backup put in place. The agents, which
    hold no event any more, declare 4 as the first number they may send; their next event (4)
    starts past the restored journal's 1 and is taken: journaled, acked, the gap counted and
    logged, no stream refused."""
    port = free_port()
    journal, saved = tmp_path / "journal.db", tmp_path / "journal.backup.db"
    first = CollectorService(collector_config(listen=f"127.0.0.1:{port}"), SystemClock())
    await first.start()
    cluster = SimCluster(
        NODES,
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{port}",
        poll_interval=0.05,
        heartbeat_interval=0.2,
        backoff_initial=0.05,
        backoff_max=0.3,
        state_dir=tmp_path / "state",
    )
    cluster.start()
    running: CollectorService | None = first
    try:
        for i, name in enumerate(NODES):
            cluster.nodes[name].xid(i, 13)
        await wait_until(lambda: all(len(xids(first, n)) == 1 for n in NODES), what="Xid 13")
        backup(journal, saved)
        for i, name in enumerate(NODES):
            cluster.nodes[name].xid(i, 31)
            cluster.nodes[name].xid(i, 43)
        await wait_until(lambda: all(len(xids(first, n)) == 3 for n in NODES), what="3 Xids")
        await wait_until(lambda: cluster.unacked() == 0, what="every event acked")
        assert all(a.outbox.acked_seq == 3 for a in cluster.agents.values())
        await first.stop(grace=None)
        running = None
        saved.replace(journal)
        for suffix in ("-wal", "-shm"):
            journal.with_name(journal.name + suffix).unlink(missing_ok=True)
        restored = CollectorService(collector_config(listen=f"127.0.0.1:{port}"), SystemClock())
        await restored.start()
        running = restored
        assert all(xids(restored, n) == [(1, 13)] for n in NODES)
        await wait_until(
            lambda: sum(n.connected for n in restored.fleet.snapshot().values()) == len(NODES),
            what="agents back",
        )
        for i, name in enumerate(NODES):
            cluster.nodes[name].xid(i, 48)
        await wait_until(lambda: all(len(xids(restored, n)) == 2 for n in NODES), what="Xid 48")
        await wait_until(lambda: cluster.unacked() == 0, what="every new event acked")
        assert all(xids(restored, n) == [(1, 13), (4, 48)] for n in NODES)
        assert restored.stats.rejected["seq_gap"] == 0
        assert restored.stats.seq_gaps == len(NODES)
        assert all(a.outbox.acked_seq == 4 for a in cluster.agents.values())
    finally:
        await cluster.stop()
        if running is not None:
            await running.stop(grace=None)
