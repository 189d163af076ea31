"""The journal on SQLite: events (deduplicated by node, boot and sequence) and known nodes.

WAL mode lets the HTTP API read while the writer commits; ``synchronous=FULL`` makes a commit
durable before the collector acks it. All writes go through one connection owned by one thread
(see :mod:`collector.journal`); readers open their own read-only connections.
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

from collector.exceptions import JournalError
from collector.store_incidents import SCHEMA_V2, IncidentStore

T = TypeVar("T")

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

SCHEMA_VERSION: Final = 3  # 3: events_by_received (the rules' history is read back at start)

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
    reachable     INTEGER NOT NULL DEFAULT 1
);
"""


@dataclass(frozen=True, slots=True)
class EventRow:
    """One journaled event. ``id`` is 0 until the journal assigns it."""

    node: str
    boot_id: str
    seq: int | None
    time_ms: int
    received_ms: int
    kind: str
    target_kind: str
    gpu_uuid: str = ""
    target_index: int = 0
    device: str = ""
    xid: int = 0
    xid_class: str = ""
    detail: str = ""
    id: int = 0


@dataclass(frozen=True, slots=True)
class NodeRow:
    """A node the collector has heard from, as remembered across restarts."""

    name: str
    boot_id: str
    hello: bytes
    last_seen_ms: int
    reachable: bool


_EVENT_COLUMNS: Final = (
    "node, boot_id, seq, time_ms, received_ms, kind, target_kind, gpu_uuid, target_index, "
    "device, xid, xid_class, detail"
)


def _row_values(row: EventRow) -> tuple[object, ...]:
    return (
        row.node,
        row.boot_id,
        row.seq,
        row.time_ms,
        row.received_ms,
        row.kind,
        row.target_kind,
        row.gpu_uuid,
        row.target_index,
        row.device,
        row.xid,
        row.xid_class,
        row.detail,
    )


def _from_db(values: Sequence[object]) -> EventRow:
    (rid, node, boot, seq, t, rcv, kind, tk, uuid, idx, dev, xid, xcls, detail) = values
    return EventRow(
        id=int(str(rid)),
        node=str(node),
        boot_id=str(boot),
        seq=None if seq is None else int(str(seq)),
        time_ms=int(str(t)),
        received_ms=int(str(rcv)),
        kind=str(kind),
        target_kind=str(tk),
        gpu_uuid=str(uuid),
        target_index=int(str(idx)),
        device=str(dev),
        xid=int(str(xid)),
        xid_class=str(xcls),
        detail=str(detail),
    )


class SqliteStore:
    """Synchronous journal operations on one SQLite file."""

    __slots__ = ("_conn", "incidents", "path")

    def __init__(self, path: Path) -> None:
        """Open (creating if needed) and migrate the journal at ``path``."""
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute("PRAGMA busy_timeout=5000")
            self._migrate()
            self.incidents = IncidentStore(self._conn)
        except (OSError, sqlite3.Error) as exc:
            msg = f"cannot open the journal at {path}: {exc}"
            raise JournalError(msg) from exc

    def _migrate(self) -> None:
        (version,) = self._conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            msg = (
                f"journal {self.path} has schema {version}, newer than this collector's "
                f"{SCHEMA_VERSION}; upgrade fleetwatch"
            )
            raise JournalError(msg)
        if version < SCHEMA_VERSION:  # every step is CREATE ... IF NOT EXISTS: safe to replay
            self._conn.executescript(
                f"BEGIN; {_SCHEMA} {SCHEMA_V2} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;",
            )

    def close(self) -> None:
        """Close the write connection."""
        self._conn.close()

    def insert_events(self, rows: Sequence[EventRow]) -> list[int]:
        """Insert rows in one transaction; return each row's new id, or 0 for a duplicate."""
        ids: list[int] = []
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            for row in rows:
                cur.execute(
                    f"INSERT OR IGNORE INTO events ({_EVENT_COLUMNS}) "  # noqa: S608 - constant
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    _row_values(row),
                )
                ids.append((cur.lastrowid or 0) if cur.rowcount == 1 else 0)
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return ids

    def high_seq(self, node: str, boot_id: str) -> int:
        """Return the highest journaled sequence number of a node's boot (0 when none)."""
        (high,) = self._conn.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM events WHERE node = ? AND boot_id = ?",
            (node, boot_id),
        ).fetchone()
        return int(high)

    def received_since(self, since_ms: int, limit: int) -> list[EventRow]:
        """Events journaled at or after ``since_ms``, oldest first, at most the newest ``limit``."""
        rows = self._conn.execute(
            f"SELECT id, {_EVENT_COLUMNS} FROM events WHERE received_ms >= ? "  # noqa: S608
            "ORDER BY id DESC LIMIT ?",
            (since_ms, limit),
        ).fetchall()
        return [_from_db(r) for r in reversed(rows)]

    def save_node(self, row: NodeRow) -> None:
        """Remember a node's latest Hello, last contact and reachability."""
        self._conn.execute(
            "INSERT INTO nodes (name, boot_id, hello, last_seen_ms, reachable) "
            "VALUES (?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET boot_id=excluded.boot_id, "
            "hello=excluded.hello, last_seen_ms=excluded.last_seen_ms, "
            "reachable=excluded.reachable",
            (row.name, row.boot_id, row.hello, row.last_seen_ms, int(row.reachable)),
        )

    def set_reachable(self, name: str, *, reachable: bool, last_seen_ms: int) -> None:
        """Record a reachability change."""
        self._conn.execute(
            "UPDATE nodes SET reachable = ?, last_seen_ms = ? WHERE name = ?",
            (int(reachable), last_seen_ms, name),
        )

    def load_nodes(self) -> list[NodeRow]:
        """Return every node ever seen."""
        rows = self._conn.execute(
            "SELECT name, boot_id, hello, last_seen_ms, reachable FROM nodes ORDER BY name",
        ).fetchall()
        return [NodeRow(str(n), str(b), bytes(h), int(t), bool(r)) for n, b, h, t, r in rows]


class JournalReader:
    """Read-only queries on a journal file, from any thread (one connection per call)."""

    __slots__ = ("path",)

    def __init__(self, path: Path) -> None:
        """Point at the journal file; nothing is opened yet."""
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5.0)

    def events(
        self,
        *,
        node: str | None = None,
        kind: str | None = None,
        after_id: int = 0,
        limit: int = 100,
        newest_first: bool = False,
    ) -> list[EventRow]:
        """Return events matching the filters, ordered by journal id."""
        clauses: list[str] = ["id > ?"]
        params: list[object] = [after_id]
        if node is not None:
            clauses.append("node = ?")
            params.append(node)
        if kind is not None:
            clauses.append("kind = ?")
            params.append(kind)
        order = "DESC" if newest_first else "ASC"
        sql = (
            f"SELECT id, {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(clauses)} "  # noqa: S608
            f"ORDER BY id {order} LIMIT ?"
        )
        with contextlib.closing(self._connect()) as conn:
            return [_from_db(r) for r in conn.execute(sql, (*params, limit)).fetchall()]

    def read(self, fn: Callable[[IncidentStore], T]) -> T:
        """Run a read of the incident, action or silence tables on a fresh read-only connection."""
        with contextlib.closing(self._connect()) as conn:
            return fn(IncidentStore(conn))

    def count(self) -> int:
        """Return how many events the journal holds."""
        with contextlib.closing(self._connect()) as conn:
            (n,) = conn.execute("SELECT COUNT(*) FROM events").fetchone()
        return int(n)
