"""The journal's events and nodes, in SQL both backends run (:mod:`collector.store.sql`).

Events are deduplicated by (node, boot, sequence): an agent that replays its outbox, to the same
collector or to another one sharing the journal, never journals an event twice. Nodes remember
their last Hello, reachability and, in a shared journal, which collector holds their stream.
Collectors sharing a journal each keep a heartbeat row, so one can tell a node that moved to a
live peer from a node that went silent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

from collector.store.incidents import IncidentStore
from collector.store.lifecycle import LifecycleStore
from collector.store.preflight import PreflightStore
from collector.store.sql import where
from fleetwatch.clock import unix_ms

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from collector.store.sql import SqlConn
    from fleetwatch.clock import Clock
    from fleetwatch.model import EventKind

T = TypeVar("T")


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


def collector_event(node: str, kind: EventKind, clock: Clock, detail: str) -> EventRow:
    """An event the collector raises itself (no boot id, no sequence number)."""
    now = unix_ms(clock)
    return EventRow(
        node=node,
        boot_id="",
        seq=None,
        time_ms=now,
        received_ms=now,
        kind=kind.value,
        target_kind="node",
        detail=detail,
    )


@dataclass(frozen=True, slots=True)
class NodeRow:
    """A node the collector has heard from, as remembered across restarts."""

    name: str
    boot_id: str
    hello: bytes
    last_seen_ms: int
    reachable: bool
    collector: str = ""  # the collector that holds (or last held) its stream


EVENT_COLUMNS: Final = (
    "node, boot_id, seq, time_ms, received_ms, kind, target_kind, gpu_uuid, target_index, "
    "device, xid, xid_class, detail"
)


INSERT_EVENT: Final = (
    f"INSERT INTO events ({EVENT_COLUMNS}) "  # noqa: S608 - constant
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT (node, boot_id, seq) DO NOTHING RETURNING id"
)


SAVE_NODE: Final = (
    "INSERT INTO nodes (name, boot_id, hello, last_seen_ms, reachable, collector) "
    "VALUES (?,?,?,?,?,?) ON CONFLICT (name) DO UPDATE SET boot_id=excluded.boot_id, "
    "hello=excluded.hello, last_seen_ms=excluded.last_seen_ms, "
    "reachable=excluded.reachable, collector=excluded.collector"
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


def event_from_db(values: Sequence[object]) -> EventRow:
    """An :class:`EventRow` from ``id`` and the :data:`EVENT_COLUMNS`, as a query gives them."""
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


def select_events(  # noqa: PLR0913 - the API's filters
    db: SqlConn,
    *,
    node: str | None = None,
    kind: str | None = None,
    after_id: int = 0,
    limit: int = 100,
    newest_first: bool = False,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> list[EventRow]:
    """Events matching the filters, ordered by journal id (the HTTP API's reads).

    ``since_ms`` and ``until_ms`` bound when each happened (``time_ms``, both included).
    """
    clauses, params = where(
        ("id > ?", after_id),
        ("node = ?", node),
        ("kind = ?", kind),
        ("time_ms >= ?", since_ms),
        ("time_ms <= ?", until_ms),
    )
    order = "DESC" if newest_first else "ASC"
    sql = f"SELECT id, {EVENT_COLUMNS} FROM events{clauses} ORDER BY id {order} LIMIT ?"  # noqa: S608
    return [event_from_db(r) for r in db.rows(sql, (*params, limit))]


class EventReader:
    """Reads for the HTTP API and the CLI, off the journal's writer thread.

    Each backend says how a read gets a connection (:meth:`_run`); the queries are shared.
    """

    def _run(self, fn: Callable[[SqlConn], T]) -> T:
        raise NotImplementedError

    def events(  # noqa: PLR0913 - the API's filters
        self,
        *,
        node: str | None = None,
        kind: str | None = None,
        after_id: int = 0,
        limit: int = 100,
        newest_first: bool = False,
        since_ms: int | None = None,
        until_ms: int | None = None,
    ) -> list[EventRow]:
        """Events matching the filters, ordered by journal id (:func:`select_events`)."""
        return self._run(
            lambda db: select_events(
                db,
                node=node,
                kind=kind,
                after_id=after_id,
                limit=limit,
                newest_first=newest_first,
                since_ms=since_ms,
                until_ms=until_ms,
            )
        )

    def node_names(self) -> list[str]:
        """Every node the journal knows (every collector's, where several share it)."""
        return [str(r[0]) for r in self._run(lambda db: db.rows("SELECT name FROM nodes"))]

    def node_row(self, name: str) -> NodeRow | None:
        """What the journal remembers of node ``name`` (its last Hello), or None."""
        rows = self._run(
            lambda db: db.rows(
                "SELECT name, boot_id, hello, last_seen_ms, reachable, collector FROM nodes "
                "WHERE name = ?",
                (name,),
            )
        )
        if not rows:
            return None
        n, b, h, t, r, c = rows[0]
        return NodeRow(str(n), str(b), bytes(h), int(t), bool(r), str(c))

    def read(self, fn: Callable[[IncidentStore], T]) -> T:
        """Run a read of the incident, action or silence tables."""
        return self._run(lambda db: fn(IncidentStore(db)))

    def read_preflight(self, fn: Callable[[PreflightStore], T]) -> T:
        """Run a read of the pre-flight tables."""
        return self._run(lambda db: fn(PreflightStore(db)))

    def read_lifecycle(self, fn: Callable[[LifecycleStore], T]) -> T:
        """Run a read of the lifecycle table."""
        return self._run(lambda db: fn(LifecycleStore(db)))

    def held_by_others(self, collector: str, alive_since_ms: int) -> list[str]:
        """Nodes whose stream another collector holds, one that beat since ``alive_since_ms``."""
        rows = self._run(
            lambda db: db.rows(
                "SELECT n.name FROM nodes n JOIN collectors c ON c.name = n.collector "
                "WHERE n.collector <> ? AND c.last_seen_ms >= ?",
                (collector, alive_since_ms),
            )
        )
        return [str(r[0]) for r in rows]

    def count(self) -> int:
        """How many events the journal holds."""
        return self._run(lambda db: int(db.rows("SELECT COUNT(*) FROM events")[0][0]))

    def close(self) -> None:
        """Let go of any connection it holds."""


class EventStore:
    """Synchronous journal operations on one connection (the journal's writer thread)."""

    def __init__(self, db: SqlConn, collector: str = "", where: str = "") -> None:
        """Use ``db`` (schema already migrated); ``collector`` names this collector's rows.

        ``where`` says which journal it is, for logs: a path, or postgresql://host:port/db.
        """
        self.db = db
        self.collector = collector
        self.where = where
        self.incidents = IncidentStore(db)
        self.preflight = PreflightStore(db)
        self.lifecycle = LifecycleStore(db)

    @property
    def shared(self) -> bool:
        """Whether other collectors may write to this journal too."""
        return self.db.shared

    def close(self) -> None:
        """Close the connection."""
        self.db.close()

    def insert_events(self, rows: Sequence[EventRow]) -> list[int]:
        """Insert rows in one transaction; return each row's new id, or 0 for a duplicate."""
        with self.db.transaction():
            results = self.db.rows_many(INSERT_EVENT, [_row_values(row) for row in rows])
        return [int(got[0][0]) if got else 0 for got in results]

    def insert_each(self, rows: Sequence[EventRow]) -> list[int | Exception]:
        """Insert rows in one transaction, each under a savepoint of its own.

        A row the database refuses is undone alone (its error stands in its place) and the
        others commit: the group commit's second try after :meth:`insert_events` failed, so
        that one bad row costs only its own stream. Raises when the transaction as a whole
        fails (a lost connection, a full disk): then no row is known to be journaled.
        """
        out: list[int | Exception] = []
        with self.db.transaction():
            for row in rows:
                try:
                    with self.db.savepoint():
                        got = self.db.rows(INSERT_EVENT, _row_values(row))
                except Exception as exc:  # noqa: BLE001 - this row's error, handed to its waiter
                    out.append(exc)
                else:
                    out.append(int(got[0][0]) if got else 0)
        return out

    def high_seq(self, node: str, boot_id: str) -> int:
        """Return the highest journaled sequence number of a node's boot (0 when none)."""
        ((high,),) = self.db.rows(
            "SELECT COALESCE(MAX(seq), 0) FROM events WHERE node = ? AND boot_id = ?",
            (node, boot_id),
        )
        return int(high)

    def received_since(self, since_ms: int, limit: int) -> list[EventRow]:
        """Events journaled at or after ``since_ms``, oldest first, at most the newest ``limit``."""
        rows = self.db.rows(
            f"SELECT id, {EVENT_COLUMNS} FROM events WHERE received_ms >= ? "  # noqa: S608
            "ORDER BY id DESC LIMIT ?",
            (since_ms, limit),
        )
        return [event_from_db(r) for r in reversed(rows)]

    def save_node(self, row: NodeRow) -> None:
        """Remember a node's latest Hello, last contact, reachability and collector."""
        self.db.run(SAVE_NODE, self._node_values(row))

    def _node_values(self, row: NodeRow) -> tuple[object, ...]:
        return (
            row.name,
            row.boot_id,
            row.hello,
            row.last_seen_ms,
            int(row.reachable),
            row.collector or self.collector,
        )

    def open_streams(self, rows: Sequence[NodeRow]) -> list[int]:
        """Save each node's Hello and read its boot's highest sequence number, in one commit.

        What a stream's Hello needs from the journal, for many nodes at once: after a collector
        restart thousands of Hellos come together, and one commit (one fsync) for each was what
        kept the fleet out of the model for minutes.
        """
        with self.db.transaction():
            for row in rows:
                self.db.run(SAVE_NODE, self._node_values(row))
            return [self.high_seq(row.name, row.boot_id) for row in rows]

    def set_reachable(self, name: str, *, reachable: bool, last_seen_ms: int) -> None:
        """Record a reachability change (only while this collector holds the node)."""
        self.db.run(
            "UPDATE nodes SET reachable = ?, last_seen_ms = ? WHERE name = ? AND collector = ?",
            (int(reachable), last_seen_ms, name, self.collector),
        )

    def load_nodes(self) -> list[NodeRow]:
        """Return every node ever seen."""
        rows = self.db.rows(
            "SELECT name, boot_id, hello, last_seen_ms, reachable, collector FROM nodes "
            "ORDER BY name",
        )
        return [
            NodeRow(str(n), str(b), bytes(h), int(t), bool(r), str(c)) for n, b, h, t, r, c in rows
        ]

    def node_holder(self, name: str) -> tuple[str, int] | None:
        """(collector, last seen ms) of the collector that last took ``name``'s stream."""
        rows = self.db.rows("SELECT collector, last_seen_ms FROM nodes WHERE name = ?", (name,))
        return (str(rows[0][0]), int(rows[0][1])) if rows else None

    def beat(self, now_ms: int, version: str) -> None:
        """This collector is alive (its row in ``collectors``)."""
        self.db.run(
            "INSERT INTO collectors (name, last_seen_ms, started_ms, version) VALUES (?,?,?,?) "
            "ON CONFLICT (name) DO UPDATE SET last_seen_ms = excluded.last_seen_ms, "
            "version = excluded.version",
            (self.collector, now_ms, now_ms, version),
        )

    def collectors(self) -> list[tuple[str, int, str]]:
        """Every collector that wrote to this journal: (name, last seen ms, version)."""
        rows = self.db.rows("SELECT name, last_seen_ms, version FROM collectors ORDER BY name")
        return [(str(n), int(t), str(v)) for n, t, v in rows]
