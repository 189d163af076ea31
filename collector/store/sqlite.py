"""The journal on SQLite: the default, for one collector (a lab, a few hundred nodes).

WAL mode lets the HTTP API read while the writer commits; ``synchronous=FULL`` makes a commit
durable before the collector acks it. All writes go through one connection owned by one thread
(see :mod:`collector.store.journal`); readers open their own read-only connections. The queries are
shared with the PostgreSQL journal (:mod:`collector.store.events`,
:mod:`collector.store.incidents`); the schema and its migrations are SQLite's own.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from typing import TYPE_CHECKING, Final, TypeVar

from collector.exceptions import JournalError
from collector.store.events import EventReader, EventRow, EventStore, NodeRow
from collector.store.incidents import ADD_CREATED_BY, SCHEMA_V2
from collector.store.lifecycle import SQLITE_SCHEMA as LIFECYCLE_SQLITE
from collector.store.preflight import SQLITE_SCHEMA as PREFLIGHT_SQLITE
from collector.store.sql import SqlConn, SqliteConn

__all__ = ["EventRow", "JournalReader", "NodeRow", "SqliteStore"]

T = TypeVar("T")

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

# 3: events_by_received (the rules' history is read back at start); 4: nodes.collector, and
# the collectors and fleet_state tables (shared with the PostgreSQL schema's queries); 5: the
# pre-flight tables (collector/store/preflight.py); 6: silences.created_by; 7: the lifecycle
# table (collector/store/lifecycle.py).
SCHEMA_VERSION: Final = 7

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS events (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    node          TEXT    NOT NULL,
    boot_id       TEXT    NOT NULL,  -- '' for events the collector raised itself
    seq           INTEGER,           -- NULL for events the collector raised itself
    time_ms       INTEGER NOT NULL,  -- when it happened (agent clock)
    received_ms   INTEGER NOT NULL,  -- when the collector journaled it
    kind          TEXT    NOT NULL,
    target_kind   TEXT    NOT NULL,
    gpu_uuid      TEXT    NOT NULL DEFAULT '',
    target_index  INTEGER NOT NULL DEFAULT 0,
    device        TEXT    NOT NULL DEFAULT '',
    xid           INTEGER NOT NULL DEFAULT 0,
    xid_class     TEXT    NOT NULL DEFAULT '',
    detail        TEXT    NOT NULL DEFAULT '',
    UNIQUE (node, boot_id, seq)
);
CREATE INDEX IF NOT EXISTS events_by_node ON events (node, id);
CREATE INDEX IF NOT EXISTS events_by_kind ON events (kind, id);
CREATE INDEX IF NOT EXISTS events_by_received ON events (received_ms);
CREATE TABLE IF NOT EXISTS nodes (
    name          TEXT PRIMARY KEY,
    boot_id       TEXT    NOT NULL,
    hello         BLOB    NOT NULL,  -- the node's last Hello, serialised
    last_seen_ms  INTEGER NOT NULL,
    reachable     INTEGER NOT NULL DEFAULT 1,
    collector     TEXT    NOT NULL DEFAULT ''  -- the collector holding its stream
);
"""
_V4_ADD_COLUMN: Final = "ALTER TABLE nodes ADD COLUMN collector TEXT NOT NULL DEFAULT '';"
_V4_TABLES: Final = """
CREATE TABLE IF NOT EXISTS collectors (
    name          TEXT PRIMARY KEY,
    last_seen_ms  INTEGER NOT NULL,
    started_ms    INTEGER NOT NULL,
    version       TEXT    NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS fleet_state (
    key           TEXT PRIMARY KEY,
    value         INTEGER NOT NULL
);
"""


class SqliteStore(EventStore):
    """The journal in one SQLite file, owned by one collector."""

    def __init__(self, path: Path, collector: str = "") -> None:
        """Open (creating if needed) and migrate the journal at ``path``."""
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _create_owner_only(path)
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=5000")
            self._migrate(conn)
        except (OSError, sqlite3.Error) as exc:
            msg = f"cannot open the journal at {path}: {exc}"
            raise JournalError(msg) from exc
        super().__init__(SqliteConn(conn), collector, str(path))

    def _migrate(self, conn: sqlite3.Connection) -> None:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            msg = (
                f"journal {self.path} has schema {version}, newer than this collector's "
                f"{SCHEMA_VERSION}; upgrade fleetwatch"
            )
            raise JournalError(msg)
        if version == SCHEMA_VERSION:
            return
        # Versions 1 to 3, 5 and 7 only create tables and indexes (IF NOT EXISTS: safe to
        # replay); versions 4 and 6 add a column, which must happen once (to a table from
        # before them: one created here already has it).
        add_collector = version >= 1 and not _has_column(conn, "nodes", "collector")
        add_created_by = _has_column(conn, "silences", "id") and not _has_column(
            conn, "silences", "created_by"
        )
        conn.executescript(
            f"BEGIN; {_SCHEMA} {SCHEMA_V2} "
            f"{_V4_ADD_COLUMN if add_collector else ''} {_V4_TABLES} {PREFLIGHT_SQLITE} "
            f"{ADD_CREATED_BY if add_created_by else ''} {LIFECYCLE_SQLITE} "
            f"PRAGMA user_version={SCHEMA_VERSION}; COMMIT;",
        )


def _create_owner_only(path: Path) -> None:
    """Create the journal file with mode 0600 unless it exists; SQLite then fills it in.

    SQLite creates a missing file 0644 (less the umask). The units' ``UMask=0077`` covers a
    collector started by systemd, but one started by hand or in a container would leave node
    names, incidents and drain reasons readable by every local user. SQLite gives the ``-wal``
    and ``-shm`` files it creates the mode of the database file, so they are 0600 as well. An
    existing journal keeps the mode it has.
    """
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _has_column(conn: sqlite3.Connection, table: str, column: str) -> bool:
    return any(row[1] == column for row in conn.execute(f"PRAGMA table_info({table})"))


class JournalReader(EventReader):
    """Read-only queries on a journal file, from any thread (one connection per call)."""

    __slots__ = ("path",)

    def __init__(self, path: Path) -> None:
        """Point at the journal file; nothing is opened yet."""
        self.path = path

    def _run(self, fn: Callable[[SqlConn], T]) -> T:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5.0)
        with contextlib.closing(conn):
            return fn(SqliteConn(conn))
