"""One small surface over the two journal databases, SQLite and PostgreSQL.

The journal's queries are written once, in the SQL both engines accept (``?`` placeholders,
``INSERT ... ON CONFLICT``, ``RETURNING``); :class:`SqliteConn` and :class:`PgConn` run them.
Only the schemas and their migrations differ (:mod:`collector.store.sqlite`,
:mod:`collector.store.postgres`).

``fleet_lock`` serialises the fleet-wide decisions (the drain cap, the breaker, one action per
node or GPU at a time) across every collector that writes to the same journal: a transaction-
scoped advisory lock on PostgreSQL; on SQLite, where one collector owns the file, the
``BEGIN IMMEDIATE`` of the transaction already excludes every other writer.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import psycopg

# pg_advisory_xact_lock keys (any 64-bit number no other application on the database uses).
MIGRATION_LOCK: Final = 0x666C_7477_0001  # "flw" + 1: one collector migrates at a time
FLEET_LOCK: Final = 0x666C_7477_0002  # fleet-wide action decisions

Row = tuple[Any, ...]


class SqlConn(Protocol):
    """A journal connection, used by one thread at a time."""

    shared: bool  # True when several collectors may write to this journal at once

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        """Run ``sql``; return the rows it gave (none for a statement without results)."""
        ...

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run ``sql``; return how many rows it changed."""
        ...

    def rows_many(self, sql: str, batch: Sequence[Sequence[object]]) -> list[list[Row]]:
        """Run ``sql`` once per parameter tuple of ``batch``; return each run's rows."""
        ...

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """Everything inside commits together, or not at all."""
        ...

    def savepoint(self) -> contextlib.AbstractContextManager[None]:
        """Inside a transaction: if what runs within raises, only it is undone."""
        ...

    def fleet_lock(self) -> None:
        """Inside a transaction: hold the fleet-wide decision lock until it ends."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...


class SqliteConn:
    """An autocommit ``sqlite3`` connection; transactions are ``BEGIN IMMEDIATE``."""

    shared = False

    def __init__(self, conn: sqlite3.Connection) -> None:
        """Wrap ``conn`` (opened with ``isolation_level=None``)."""
        self.conn = conn
        self._depth = 0

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        """Run ``sql``; return its rows."""
        return list(self.conn.execute(sql, params).fetchall())

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run ``sql``; return its row count."""
        return int(self.conn.execute(sql, params).rowcount)

    def rows_many(self, sql: str, batch: Sequence[Sequence[object]]) -> list[list[Row]]:
        """Run ``sql`` per tuple (in-process: no round trips to save)."""
        return [self.conn.execute(sql, params).fetchall() for params in batch]

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (a nested one joins the outer transaction)."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            self.conn.execute("ROLLBACK")
            raise
        self._depth = 0
        self.conn.execute("COMMIT")

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """``SAVEPOINT`` ... ``RELEASE``, or ``ROLLBACK TO`` it when the body raises.

        Refused when no transaction is open: SQLite ends one by itself after some errors (a full
        disk, an I/O error), and what runs next must not commit on its own.
        """
        if not self.conn.in_transaction:
            msg = "no transaction is open (SQLite rolled it back after an error)"
            raise sqlite3.OperationalError(msg)
        self.conn.execute("SAVEPOINT part")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK TO part")
            self.conn.execute("RELEASE part")
            raise
        self.conn.execute("RELEASE part")

    def fleet_lock(self) -> None:
        """Nothing to add: the open write transaction already excludes every other writer."""

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


class PgConn:
    """A psycopg connection in autocommit mode, reopened after the server dropped it.

    ``connect`` opens a new connection; it is called again when the last one broke (a restarted
    server, a failover), so one lost connection costs one failed call, not the collector.
    """

    shared = True

    def __init__(self, connect: Callable[[], psycopg.Connection[Row]]) -> None:
        """Open the first connection now (an unreachable database stops the start)."""
        self._connect = connect
        self._conn = connect()
        self._lock = threading.Lock()  # readers share one PgConn across threads

    def _live(self) -> psycopg.Connection[Row]:
        if self._conn.closed or self._conn.broken:
            self._conn.close()
            self._conn = self._connect()
        return self._conn

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        """Run ``sql``; return its rows."""
        with self._lock:
            cur = self._live().execute(_pg(sql), params)
            return list(cur.fetchall()) if cur.description is not None else []

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run ``sql``; return its row count."""
        with self._lock:
            return int(self._live().execute(_pg(sql), params).rowcount)

    def rows_many(self, sql: str, batch: Sequence[Sequence[object]]) -> list[list[Row]]:
        """Run ``sql`` per tuple in one pipelined round trip; return each run's rows."""
        if not batch:
            return []
        with self._lock:
            cur = self._live().cursor()
            cur.executemany(_pg(sql), batch, returning=True)
            out: list[list[Row]] = []
            while True:
                out.append(list(cur.fetchall()) if cur.description is not None else [])
                if not cur.nextset():
                    return out

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A (possibly nested: a savepoint) transaction on the live connection."""
        with self._lock:
            conn = self._live()
        with conn.transaction():
            yield

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """Inside a transaction, psycopg's nested transaction is a savepoint."""
        with self.transaction():
            yield

    def fleet_lock(self) -> None:
        """Take the fleet-wide decision lock until the transaction ends."""
        self.rows("SELECT pg_advisory_xact_lock(?)", (FLEET_LOCK,))

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


def where(*filters: tuple[str, object], always: Sequence[str] = ()) -> tuple[str, list[object]]:
    """`` WHERE ...`` (or ``""``) and its parameters, for the filters a read was given.

    Each filter is a clause with one ``?`` and its value; a value of None leaves its clause out.
    ``always`` are clauses without parameters, kept whatever the filters.
    """
    clauses = list(always)
    params: list[object] = []
    for clause, value in filters:
        if value is not None:
            clauses.append(clause)
            params.append(value)
    return (f" WHERE {' AND '.join(clauses)}" if clauses else ""), params


def _pg(sql: str) -> str:
    """The journal's SQL with psycopg's placeholders (no query holds a literal ``?`` or ``%``)."""
    return sql.replace("?", "%s")
