"""The journal as the asyncio side sees it: group commit on one writer thread.

Sessions ``await append(row)``; rows that arrive while a commit is running wait and go together
in the next transaction, so one fsync covers many agents' events. ``append`` returns only after
the commit, which is what lets the session ack.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Final, TypeVar

import structlog

from collector.store.postgres import PostgresReader, PostgresStore
from collector.store.sqlite import JournalReader, SqliteStore

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from collector.store.events import EventReader, EventRow, EventStore, NodeRow
    from collector.store.journal_config import JournalConfig

log = structlog.get_logger("collector.store.journal")

MAX_BATCH: Final = 1000
T = TypeVar("T")


def open_store(cfg: JournalConfig, environ: Mapping[str, str]) -> tuple[EventStore, EventReader]:
    """The journal ``cfg`` names (PostgreSQL with a DSN, else the SQLite file).

    Raises:
        JournalError: it cannot be opened or migrated; ConfigError: its password cannot be read.
    """
    if cfg.dsn is None:
        return SqliteStore(cfg.path, cfg.collector), JournalReader(cfg.path)
    password = cfg.password(environ)
    store = PostgresStore(cfg.dsn, password=password, collector=cfg.collector)
    return store, PostgresReader(cfg.dsn, password=password)


class Journal:
    """Async facade over an :class:`EventStore`; every store call runs on one thread."""

    def __init__(self, store: EventStore) -> None:
        """Own the store; the writer task starts on first use."""
        self.store = store
        self.where = store.where  # for logs: a path, or postgresql://host:port/db
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal")
        self._queue: asyncio.Queue[tuple[EventRow, asyncio.Future[int]]] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self.commits = 0

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def append(self, row: EventRow) -> int:
        """Journal one event; return its id once committed, or 0 if it was already there."""
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_loop(), name="journal-writer")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        await self._queue.put((row, future))
        return await future

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            rows = [row for row, _ in batch]
            try:
                ids = await self._run(partial(self.store.insert_events, rows))
            except Exception as exc:  # noqa: BLE001 - handed to every waiter, not swallowed
                log.error("journal_commit_failed", rows=len(rows), error=str(exc))
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.commits += 1
            for (_, future), row_id in zip(batch, ids, strict=True):
                if not future.done():
                    future.set_result(row_id)

    async def do(self, fn: Callable[[EventStore], T]) -> T:
        """Run ``fn(store)`` on the writer thread (for the incident, action and silence tables)."""
        return await self._run(partial(fn, self.store))

    async def high_seq(self, node: str, boot_id: str) -> int:
        """Highest journaled sequence number of a node's boot."""
        return await self._run(lambda: self.store.high_seq(node, boot_id))

    async def save_node(self, row: NodeRow) -> None:
        """Remember a node's Hello and reachability."""
        await self._run(lambda: self.store.save_node(row))

    async def set_reachable(self, name: str, *, reachable: bool, last_seen_ms: int) -> None:
        """Record a reachability change."""
        await self._run(
            lambda: self.store.set_reachable(name, reachable=reachable, last_seen_ms=last_seen_ms),
        )

    async def load_nodes(self) -> list[NodeRow]:
        """Every node ever seen."""
        return await self._run(self.store.load_nodes)

    async def close(self) -> None:
        """Stop the writer and close the store."""
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        await self._run(self.store.close)
        self._executor.shutdown(wait=True)
