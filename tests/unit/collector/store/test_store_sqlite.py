import sqlite3
from pathlib import Path

import pytest

from collector.exceptions import JournalError
from collector.store.events import NodeRow
from collector.store.sqlite import JournalReader, SqliteStore
from collector.testing import event_row


class TestSqliteStore:
    def test_dedups_by_node_boot_and_seq(self, tmp_path: Path):
        """The same (node, boot, seq) is journaled once; another boot or node is new."""
        store = SqliteStore(tmp_path / "j.db")
        first = store.insert_events([event_row(1), event_row(2)])
        again = store.insert_events(
            [event_row(2), event_row(3), event_row(2, boot="b2"), event_row(2, node="n2")]
        )
        assert all(first)
        assert again[0] == 0
        assert all(again[1:])
        assert JournalReader(tmp_path / "j.db").count() == 5

    def test_collector_events_have_no_seq_and_never_collide(self, tmp_path: Path):
        """Events the collector raises (seq NULL) are all kept."""
        store = SqliteStore(tmp_path / "j.db")
        ids = store.insert_events([event_row(None, boot="", kind="node_unreachable")] * 3)
        assert len(set(ids)) == 3
        assert 0 not in ids

    def test_high_seq_per_boot(self, tmp_path: Path):
        """The Welcome's number is the highest journaled for that node and boot."""
        store = SqliteStore(tmp_path / "j.db")
        store.insert_events([event_row(1), event_row(2), event_row(7, boot="b2")])
        assert store.high_seq("n1", "b1") == 2
        assert store.high_seq("n1", "b2") == 7
        assert store.high_seq("n9", "b1") == 0

    def test_survives_reopen(self, tmp_path: Path):
        """Committed events and nodes are there after the file is reopened."""
        store = SqliteStore(tmp_path / "j.db")
        store.insert_events([event_row(1)])
        store.save_node(NodeRow("n1", "b1", b"hello", 5, reachable=True))
        store.set_reachable("n1", reachable=False, last_seen_ms=9)
        store.close()
        again = SqliteStore(tmp_path / "j.db")
        assert again.high_seq("n1", "b1") == 1
        assert again.load_nodes() == [NodeRow("n1", "b1", b"hello", 9, reachable=False)]

    def test_reader_filters_and_pages(self, tmp_path: Path):
        """Events can be filtered by node and kind and paged by id."""
        store = SqliteStore(tmp_path / "j.db")
        store.insert_events([event_row(1), event_row(2, kind="gpu_lost"), event_row(1, node="n2")])
        reader = JournalReader(tmp_path / "j.db")
        assert [r.seq for r in reader.events(node="n1")] == [1, 2]
        assert [r.kind for r in reader.events(kind="gpu_lost")] == ["gpu_lost"]
        first = reader.events(limit=1)
        assert [r.node for r in reader.events(after_id=first[0].id)] == ["n1", "n2"]
        assert [r.node for r in reader.events(newest_first=True, limit=1)] == ["n2"]

    def test_newer_schema_is_refused(self, tmp_path: Path):
        """A journal written by a newer collector is not silently downgraded."""
        path = tmp_path / "j.db"
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA user_version=99")
        conn.close()
        with pytest.raises(JournalError, match="schema 99"):
            SqliteStore(path)

    def test_wal_mode(self, tmp_path: Path):
        """The journal runs in WAL mode so readers never block the writer."""
        SqliteStore(tmp_path / "j.db")
        conn = sqlite3.connect(tmp_path / "j.db")
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
