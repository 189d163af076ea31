"""The journal as the asyncio side sees it: group commit on one writer thread.

Sessions ``await append(row)``; a row that finds nothing being written goes to the writer thread
at once, and rows that arrive while a commit is running wait and go together in the next
transaction, so one fsync covers many agents' events. ``append`` returns only after the commit,
which is what lets the session ack.

One row must not fail its neighbours: when a group commit fails, its rows are tried again in one
transaction, each under a savepoint (:meth:`EventStore.insert_each`). A row the database refuses
fails alone (:class:`RowRefusedError`, and its session refuses the stream that sent it); the
others commit. Only a commit that fails as a whole again (the database is down) fails them all.

A write that fails for want of disk space (SQLite's "database or disk is full", PostgreSQL's
``disk_full``, ``ENOSPC``) raises :class:`JournalFullError`: nothing of it is committed, so nothing
is acked, and the agents keep the events and send them again. The journal says so once
(``journal_disk_full``, an error) and in :class:`collector.stats.JournalHealth` (the
``fleetwatch_collector_journal_full`` gauge), and once a write commits again
(``journal_space_back``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Final, TypeVar

import structlog

from collector.exceptions import JournalFullError, RowRefusedError
from collector.stats import JournalHealth
from collector.store.postgres import PostgresReader, PostgresStore
from collector.store.sqlite import JournalReader, SqliteStore

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from collector.store.events import EventReader, EventRow, EventStore, NodeRow
    from collector.store.journal_config import JournalConfig

log = structlog.get_logger("collector.store.journal")

MAX_BATCH: Final = 1000
T = TypeVar("T")
PG_DISK_FULL: Final = "53100"  # PostgreSQL's SQLSTATE disk_full


def out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the disk had no room for the write."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlite3.Error) and (
            getattr(seen, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
            or "database or disk is full" in str(seen)
        ):
            return True
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        if getattr(seen, "sqlstate", None) == PG_DISK_FULL or "No space left on device" in str(
            seen
        ):
            return True
        seen = seen.__cause__
    return False


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


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


class Journal:
    """Async facade over an :class:`EventStore`; every store call runs on one thread."""

    def __init__(self, store: EventStore, health: JournalHealth | None = None) -> None:
        """Own the store; the writer task starts on first use.

        ``health`` is where the journal says whether it can commit (the collector's metrics
        read it).
        """
        self.store = store
        self.where = store.where  # for logs: a path, or postgresql://host:port/db
        self.health = health if health is not None else JournalHealth()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal")
        self._queue: asyncio.Queue[tuple[EventRow, asyncio.Future[int]]] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._writing = 0  # commits of events on their way to the writer thread, or on it
        self._hellos: asyncio.Queue[tuple[NodeRow, asyncio.Future[int]]] = asyncio.Queue()
        self._hello_writer: asyncio.Task[None] | None = None
        self.hello_commits = 0
        self._full_since: float | None = None
        self.commits = 0

    async def _run(self, fn: Callable[[], T], *, write: bool = False) -> T:
        """Run ``fn`` on the writer thread.

        A call that fails for want of space raises :class:`JournalFullError`; a ``write`` that
        commits says the space is back.
        """
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except JournalFullError:
            raise
        except Exception as exc:
            if out_of_space(exc):
                raise self._full(exc) from exc
            raise
        if write:
            self._space_back()
        return result

    def _full(self, exc: BaseException) -> JournalFullError:
        """Note a write refused for want of space; the error to hand its waiters."""
        self.health.failures["disk_full"] += 1
        error = _first_line(exc)
        if not self.health.full:
            self.health.full = True
            self._full_since = time.monotonic()
            log.error(
                "journal_disk_full",
                journal=self.where,
                error=error,
                effect="nothing is acked until a commit succeeds; agents keep their events",
            )
        return JournalFullError(f"the journal at {self.where} has no disk space: {error}")

    def _space_back(self) -> None:
        if self.health.full:
            self.health.full = False
            full_s = time.monotonic() - (self._full_since or time.monotonic())
            log.warning("journal_space_back", journal=self.where, full_s=round(full_s, 1))

    async def append(self, row: EventRow) -> int:
        """Journal one event; return its id once committed, or 0 if it was already there.

        With nothing else being written, the row is committed at once; otherwise it waits and
        goes with the rows that came meanwhile, in one commit (a group commit). Going straight
        to the writer thread saves the writer task's two turns of the event loop, which at
        4,096 nodes were a good part of an event's way to its incident.

        Raises:
            RowRefusedError: the database refused this row (the rest of its commit went in);
            another exception: the commit failed as a whole.
        """
        if not self._writing and self._queue.empty():
            self._writing += 1
            try:
                (result,) = await self._commit([row])
            finally:
                self._writing -= 1
            if isinstance(result, Exception):
                raise result
            return result
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
            self._writing += 1
            try:
                results = await self._commit([row for row, _ in batch])
            finally:
                self._writing -= 1
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    async def _commit(self, rows: list[EventRow]) -> list[int | Exception]:
        """Commit ``rows`` together: each one's id (0: already there) or its error."""
        results: list[int | Exception]
        try:
            results = list(await self._run(partial(self.store.insert_events, rows), write=True))
        except JournalFullError as exc:  # row by row would not find room either
            return [exc] * len(rows)
        except Exception as exc:  # noqa: BLE001 - tried again row by row, then handed on
            log.warning("journal_commit_failed", rows=len(rows), error=str(exc))
            return await self._row_by_row(rows)
        self.commits += 1
        return results

    async def _row_by_row(self, rows: list[EventRow]) -> list[int | Exception]:
        """Try a failed group commit again, each row on its own.

        Only a row the database refuses fails (:class:`RowRefusedError`); its neighbours
        commit. When the commit fails as a whole again (the database is down), every row gets
        that error.
        """
        try:
            results = await self._run(partial(self.store.insert_each, rows), write=True)
        except JournalFullError as exc:
            return [exc] * len(rows)
        except Exception as exc:  # noqa: BLE001 - handed to every waiter, not swallowed
            self.health.failures["other"] += 1
            log.error("journal_commit_failed", rows=len(rows), error=str(exc))
            return [exc] * len(rows)
        self.commits += 1
        out: list[int | Exception] = []
        for row, result in zip(rows, results, strict=True):
            if not isinstance(result, Exception):
                out.append(result)
                continue
            error = f"{type(result).__name__}: {_first_line(result)}"
            log.error(
                "journal_row_refused",
                node=row.node,
                boot_id=row.boot_id,
                seq=row.seq,
                error=error,
            )
            refused = RowRefusedError(f"the journal refused the row ({error})")
            refused.__cause__ = result
            out.append(refused)
        return out

    async def do(self, fn: Callable[[EventStore], T]) -> T:
        """Run ``fn(store)`` on the writer thread (for the incident, action and silence tables)."""
        return await self._run(partial(fn, self.store))

    async def high_seq(self, node: str, boot_id: str) -> int:
        """Highest journaled sequence number of a node's boot."""
        return await self._run(lambda: self.store.high_seq(node, boot_id))

    async def open_stream(self, row: NodeRow) -> int:
        """Save a node's Hello; return its boot's highest journaled sequence number.

        Hellos that arrive while a commit is running wait and go together in the next one
        (a reconnect storm costs a commit per batch, not per node). A batch that fails as a
        whole is tried again node by node, so one node's row fails only its own stream.
        """
        if self._hello_writer is None or self._hello_writer.done():
            self._hello_writer = asyncio.create_task(self._hello_loop(), name="journal-hellos")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        await self._hellos.put((row, future))
        return await future

    async def _hello_loop(self) -> None:
        while True:
            batch = [await self._hellos.get()]
            while len(batch) < MAX_BATCH and not self._hellos.empty():
                batch.append(self._hellos.get_nowait())
            rows = [row for row, _ in batch]
            results: list[int | Exception]
            try:
                results = list(await self._run(partial(self.store.open_streams, rows), write=True))
                self.hello_commits += 1
            except Exception as exc:  # noqa: BLE001 - tried again one by one, then handed on
                if len(rows) == 1:
                    results = [exc]
                else:
                    log.warning("journal_hello_batch_failed", rows=len(rows), error=str(exc))
                    results = [await self._one_hello(row) for row in rows]
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    async def _one_hello(self, row: NodeRow) -> int | Exception:
        try:
            (high,) = await self._run(partial(self.store.open_streams, [row]), write=True)
        except Exception as exc:  # noqa: BLE001 - handed to this node's stream
            return exc
        self.hello_commits += 1
        return high

    async def save_node(self, row: NodeRow) -> None:
        """Remember a node's Hello and reachability."""
        await self._run(lambda: self.store.save_node(row), write=True)

    async def set_reachable(self, name: str, *, reachable: bool, last_seen_ms: int) -> None:
        """Record a reachability change."""
        await self._run(
            lambda: self.store.set_reachable(name, reachable=reachable, last_seen_ms=last_seen_ms),
            write=True,
        )

    async def load_nodes(self) -> list[NodeRow]:
        """Every node ever seen."""
        return await self._run(self.store.load_nodes)

    async def close(self) -> None:
        """Stop the writers and close the store."""
        for writer in (self._writer, self._hello_writer):
            if writer is not None:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
        await self._run(self.store.close)
        self._executor.shutdown(wait=True)
