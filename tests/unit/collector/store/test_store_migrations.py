"""SQLite journal schemas 6 (who added each silence, ``silences.created_by``, issue 42) and 7
(the nodes' lifecycle, issue 43)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from collector.store.incidents import SilenceRow
from collector.store.lifecycle import TransitionRow
from collector.store.sqlite import SCHEMA_VERSION, JournalReader, SqliteStore

if TYPE_CHECKING:
    from pathlib import Path

# The silences table as schema 2 to 5 created it.
OLD_SILENCES = """
CREATE TABLE silences (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    node        TEXT    NOT NULL DEFAULT '*',
    rule        TEXT    NOT NULL DEFAULT '*',
    starts_ms   INTEGER NOT NULL,
    ends_ms     INTEGER NOT NULL,
    reason      TEXT    NOT NULL DEFAULT '',
    created_ms  INTEGER NOT NULL
);
"""


def columns(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute("PRAGMA table_info(silences)")]
    finally:
        conn.close()


def version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def schema_5_journal(path: Path) -> None:
    """A journal as the release before wrote it, with one silence in it."""
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    conn.executescript(
        f"DROP TABLE silences; {OLD_SILENCES}"  # noqa: S608 - constant
        "INSERT INTO silences (node, rule, starts_ms, ends_ms, reason, created_ms) "
        "VALUES ('node-3', '*', 0, 10000, 'cable swap', 0); PRAGMA user_version=5;"
    )
    conn.close()


class TestCreatedBy:
    def test_a_new_journal_has_the_column(self, tmp_path: Path):
        path = tmp_path / "j.db"
        store = SqliteStore(path)
        store.incidents.add_silence(SilenceRow("n1", "*", 0, 10, "", 0, created_by="token"))
        store.close()
        assert (SCHEMA_VERSION, version(path)) == (7, 7)
        assert columns(path)[-1] == "created_by"
        (row,) = JournalReader(path).read(lambda s: s.silences())
        assert row.created_by == "token"

    def test_a_schema_5_journal_opens_and_upgrades(self, tmp_path: Path):
        """Its silences stay (created_by ""), new ones record who added them, and opening it
        again changes nothing (the column is added once)."""
        path = tmp_path / "j.db"
        schema_5_journal(path)
        assert "created_by" not in columns(path)
        store = SqliteStore(path)
        store.incidents.add_silence(SilenceRow("n2", "r", 0, 10, "", 5, created_by="loopback"))
        store.close()
        assert version(path) == SCHEMA_VERSION
        SqliteStore(path).close()
        rows = JournalReader(path).read(lambda s: s.silences())
        assert [(r.node, r.reason, r.created_by) for r in rows] == [
            ("node-3", "cable swap", ""),
            ("n2", "", "loopback"),
        ]

    def test_a_schema_1_journal_gets_the_silences_table_with_the_column(self, tmp_path: Path):
        """Silences came with schema 2: a journal from before has none to add the column to."""
        path = tmp_path / "j.db"
        conn = sqlite3.connect(path)
        conn.executescript(
            "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL, "
            "boot_id TEXT NOT NULL, seq INTEGER, time_ms INTEGER NOT NULL, "
            "received_ms INTEGER NOT NULL, kind TEXT NOT NULL, target_kind TEXT NOT NULL, "
            "gpu_uuid TEXT NOT NULL DEFAULT '', target_index INTEGER NOT NULL DEFAULT 0, "
            "device TEXT NOT NULL DEFAULT '', xid INTEGER NOT NULL DEFAULT 0, "
            "xid_class TEXT NOT NULL DEFAULT '', detail TEXT NOT NULL DEFAULT '', "
            "UNIQUE (node, boot_id, seq)); CREATE TABLE nodes (name TEXT PRIMARY KEY, "
            "boot_id TEXT NOT NULL, hello BLOB NOT NULL, last_seen_ms INTEGER NOT NULL, "
            "reachable INTEGER NOT NULL DEFAULT 1); PRAGMA user_version=1;"
        )
        conn.close()
        SqliteStore(path).close()
        assert columns(path).count("created_by") == 1
        assert version(path) == SCHEMA_VERSION


class TestLifecycleTable:
    def test_a_schema_6_journal_gets_the_table_and_keeps_what_it_held(self, tmp_path: Path):
        """A journal of the release before (no lifecycle table) opens, gains the table empty,
        and records transitions; nodes with none are in service."""
        path = tmp_path / "j.db"
        SqliteStore(path).close()
        conn = sqlite3.connect(path)
        conn.executescript("DROP TABLE lifecycle; PRAGMA user_version=6;")
        conn.close()
        store = SqliteStore(path)
        assert store.lifecycle.current() == {}
        store.lifecycle.add(TransitionRow("n1", "drained", "in_service", 5, "action:drain_node"))
        store.lifecycle.add(TransitionRow("n1", "in_service", "drained", 9, "person:ana"))
        store.close()
        assert version(path) == SCHEMA_VERSION
        store = SqliteStore(path)
        (row,) = store.lifecycle.current().values()
        assert (row.node, row.state, row.previous, row.actor) == (
            "n1",
            "in_service",
            "drained",
            "person:ana",
        )
        assert [r.state for r in store.lifecycle.history("n1")] == ["drained", "in_service"]
        assert store.lifecycle.history("n1", since_ms=6)[0].state == "in_service"
        store.close()
