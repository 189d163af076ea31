"""The API's filtered reads and the silences' created_by on both journal backends (issue 42).

The same SQL runs on SQLite and PostgreSQL: every filter must be valid, and mean the same, on
both; a PostgreSQL journal of schema 2 must take the new column.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg
import pytest

from collector.store.events import EventRow, NodeRow
from collector.store.incidents import ActionRow, IncidentRow, SilenceRow
from collector.store.lifecycle import TransitionRow
from collector.store.postgres import MIGRATIONS, SCHEMA_VERSION, PostgresReader, PostgresStore

if TYPE_CHECKING:
    from tests.integration.store_backend import Open

pytestmark = pytest.mark.integration


def incident(iid: str, rule: str, node: str, started: int, resolved: int | None) -> IncidentRow:
    phase = "firing" if resolved is None else "resolved"
    updated = resolved if resolved is not None else started
    return IncidentRow(
        iid, rule, node, node, "critical", phase, started, updated, started, resolved
    )


class TestFilteredReads:
    def test_incidents_actions_silences_events(self, backend: Open):
        open_store, open_reader = backend
        store = open_store("c1")
        for row in (
            incident("a", "r1", "n1", 1000, 2000),
            incident("b", "r1", "n2", 3000, None),
            incident("c", "r2", "n1", 5000, 6000),
        ):
            store.incidents.upsert_incident(row)
        for key, node, created in (("k1", "n1", 1000), ("k2", "n2", 2000), ("k3", "n1", 3000)):
            store.incidents.add_action(
                ActionRow(key, "i", "drain_node", node, node, "deferred", created, {})
            )
        for node, by in (("n1", "token"), ("*", "loopback"), ("n2", "token")):
            store.incidents.add_silence(SilenceRow(node, "*", 0, 100, "", 0, created_by=by))
        for seq, node, t in ((1, "n1", 1000), (2, "n2", 2000), (3, "n1", 3000)):
            store.insert_events([EventRow(node, "b", seq, t, t, "xid", "gpu", xid=79)])
        store.save_node(NodeRow("n1", "b", b"", 1, reachable=True))
        reader = open_reader()
        try:
            read = reader.read
            assert [i.id for i in read(lambda s: s.incidents(node="n1", limit=1))] == ["c"]
            assert [i.id for i in read(lambda s: s.incidents(rule="r1", limit=1))] == ["b"]
            window = read(lambda s: s.incidents(since_ms=2500, until_ms=4000))
            assert [i.id for i in window] == ["b"]
            window = read(lambda s: s.incidents(open_only=True, node="n2", since_ms=9000))
            assert [i.id for i in window] == ["b"]
            got = read(lambda s: s.actions(node="n1", since_ms=500, until_ms=2500))
            assert [a.idempotency_key for a in got] == ["k1"]
            ids = [a.id for a in read(lambda s: s.actions())]
            assert read(lambda s: s.action_nodes(ids)) == dict(
                zip(ids, ["n1", "n2", "n1"], strict=True)
            )
            assert read(lambda s: s.action_nodes([])) == {}
            covering = read(lambda s: s.silences(active_at_ms=50, node="n1"))
            assert [(s.node, s.created_by) for s in covering] == [
                ("n1", "token"),
                ("*", "loopback"),
            ]
            got_events = reader.events(node="n1", since_ms=2000, until_ms=3000)
            assert [e.seq for e in got_events] == [3]
            assert reader.node_names() == ["n1"]
        finally:
            reader.close()


class TestPostgresSchema3:
    def test_a_schema_2_journal_gains_created_by(self, pg_dsn: str):
        """A journal the release before migrated (schema 2), with a silence: it opens, the
        silence stays (created_by ""), a new one records who added it."""
        assert SCHEMA_VERSION >= 3
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE fleetwatch_schema (version INTEGER NOT NULL)")
            for step in MIGRATIONS[:2]:
                conn.execute(step)
            conn.execute("INSERT INTO fleetwatch_schema (version) VALUES (2)")
            conn.execute(
                "INSERT INTO silences (node, rule, starts_ms, ends_ms, reason, created_ms) "
                "VALUES ('node-3', '*', 0, 100, 'cable swap', 0)"
            )
        store = PostgresStore(pg_dsn, collector="c1")
        store.incidents.add_silence(SilenceRow("n2", "r", 0, 10, "", 5, created_by="token"))
        store.close()
        PostgresStore(pg_dsn, collector="c2").close()  # a second start migrates nothing
        reader = PostgresReader(pg_dsn)
        try:
            rows = reader.read(lambda s: s.silences())
        finally:
            reader.close()
        assert [(r.node, r.created_by) for r in rows] == [("node-3", ""), ("n2", "token")]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT version FROM fleetwatch_schema").fetchall() == [
                (SCHEMA_VERSION,)
            ]

    def test_a_schema_3_journal_gains_the_lifecycle_table(self, pg_dsn: str):
        """Schema 4 adds the lifecycle table; the moves a collector journals are read back."""
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE fleetwatch_schema (version INTEGER NOT NULL)")
            for step in MIGRATIONS[:3]:
                conn.execute(step)
            conn.execute("INSERT INTO fleetwatch_schema (version) VALUES (3)")
        store = PostgresStore(pg_dsn, collector="c1")
        store.lifecycle.add(TransitionRow("n1", "drained", "in_service", 5, "action:drain_node"))
        store.lifecycle.add(
            TransitionRow("n1", "in_repair", "drained", 9, "person:ana", reason="x")
        )
        store.lifecycle.add(TransitionRow("n2", "suspect", "in_service", 7, "rule:gpu_hot"))
        store.close()
        reader = PostgresReader(pg_dsn)
        try:
            current = reader.read_lifecycle(lambda s: s.current())
            history = reader.read_lifecycle(lambda s: s.history("n1"))
        finally:
            reader.close()
        assert {n: r.state for n, r in current.items()} == {"n1": "in_repair", "n2": "suspect"}
        assert [(r.state, r.actor, r.reason) for r in history] == [
            ("drained", "action:drain_node", ""),
            ("in_repair", "person:ana", "x"),
        ]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT version FROM fleetwatch_schema").fetchall() == [(4,)]
