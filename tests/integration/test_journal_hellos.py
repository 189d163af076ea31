"""A stream's Hello in the journal: saved with its boot's highest sequence, many in one commit.

After a collector restart thousands of agents say Hello together; one commit (one fsync) per
Hello kept a 2,048-node fleet out of the model for over a minute. Both backends for the store's
batch; the SQLite journal for the batching of concurrent Hellos.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from collector.store.events import EventRow, EventStore, NodeRow
from collector.store.journal import Journal
from collector.store.postgres import PostgresStore
from collector.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStore]:
    if request.param == "sqlite":
        opened: EventStore = SqliteStore(tmp_path / "journal.db", "c1")
    else:
        opened = PostgresStore(request.getfixturevalue("pg_dsn"), collector="c1")
    yield opened
    opened.close()


def hello(node: str, boot: str = "b1", seen_ms: int = 5) -> NodeRow:
    return NodeRow(node, boot, f"hello {node}".encode(), seen_ms, reachable=True)


def event(node: str, seq: int, boot: str = "b1") -> EventRow:
    return EventRow(node, boot, seq, 1000 + seq, 2000, "xid", "gpu", "GPU-1", xid=79)


def test_open_streams_saves_each_hello_and_reads_each_boots_high_seq(store: EventStore):
    store.insert_events([event("n1", 1), event("n1", 3), event("n2", 2, boot="old")])
    highs = store.open_streams([hello("n1"), hello("n2"), hello("n3")])
    assert highs == [3, 0, 0]  # n2's events are of another boot
    saved = {row.name: row for row in store.load_nodes()}
    assert set(saved) == {"n1", "n2", "n3"}
    assert saved["n2"].hello == b"hello n2"
    assert saved["n1"].collector == "c1"


def test_concurrent_hellos_share_commits_and_each_gets_its_own_high_seq(tmp_path: Path):
    nodes = [f"n{i}" for i in range(200)]

    async def main() -> tuple[list[int], int, int]:
        journal = Journal(SqliteStore(tmp_path / "journal.db", "c1"))
        try:
            for i, node in enumerate(nodes[:50]):
                await journal.append(event(node, i + 1))
            highs = await asyncio.gather(*(journal.open_stream(hello(n)) for n in nodes))
            saved = len(await journal.load_nodes())
            return list(highs), journal.hello_commits, saved
        finally:
            await journal.close()

    highs, commits, saved = asyncio.run(main())
    assert highs == [i + 1 for i in range(50)] + [0] * 150
    assert saved == len(nodes)
    # One commit per Hello was the old cost; the first Hello's commit runs alone, the rest wait
    # and go together.
    assert commits <= 3


def test_a_refused_hello_fails_only_its_own_stream(tmp_path: Path):
    bad = NodeRow("bad", None, b"x", 5, reachable=True)  # type: ignore[arg-type]

    async def main() -> tuple[list[int | BaseException], list[str]]:
        journal = Journal(SqliteStore(tmp_path / "journal.db", "c1"))
        try:
            await journal.append(event("n2", 4))
            results = await asyncio.gather(
                journal.open_stream(hello("n1")),
                journal.open_stream(bad),
                journal.open_stream(hello("n2")),
                return_exceptions=True,
            )
            return list(results), sorted(r.name for r in await journal.load_nodes())
        finally:
            await journal.close()

    results, saved = asyncio.run(main())
    assert results[0] == 0
    assert isinstance(results[1], Exception)
    assert "NOT NULL" in str(results[1])
    assert results[2] == 4
    assert saved == ["n1", "n2"]
