"""The pre-flight tables on both journal backends: runs, judged results, unfinished runs."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

import pytest

from collector.store.preflight import CUT_SHORT, ResultRow, RunRow
from collector.store.sqlite import SCHEMA_VERSION, JournalReader, SqliteStore

if TYPE_CHECKING:
    from pathlib import Path

    from collector.store.events import EventReader, EventStore
    from tests.integration.store_backend import Open

pytestmark = pytest.mark.integration


def result(node: str, check: str, verdict: str, value: float | None = 1.0) -> ResultRow:
    return ResultRow("pf-1", node, check, "gpu:0", value, "GB/s", "", "", "ev", verdict, "g", "r")


def test_a_run_and_its_results_round_trip(backend: Open):
    open_store, open_reader = backend
    store = open_store("c1")
    store.preflight.start_run(RunRow("pf-1", "quick", ("a", "b"), 1000, collector="c1"))
    reader = open_reader()
    try:
        check_round_trip(store, reader)
    finally:
        reader.close()


def check_round_trip(store: EventStore, reader: EventReader) -> None:
    running = reader.read_preflight(lambda s: s.run("pf-1"))
    assert running is not None
    assert running.verdict == ""
    assert running.to_json()["verdict"] == "running"
    done = RunRow(
        "pf-1",
        "quick",
        ("a", "b"),
        1000,
        finished_ms=2000,
        verdict="fail",
        collector="c1",
        detail="2 nodes",
        node_verdicts={"a": "pass", "b": "fail"},
        suspects=[{"kind": "gpu", "node": "b"}],
    )
    rows = [result("a", "h2d_bw", "pass", 55.0), result("b", "h2d_bw", "fail", None)]
    store.preflight.finish_run(done, rows)
    assert reader.read_preflight(lambda s: s.results("pf-1")) == rows
    got = reader.read_preflight(lambda s: s.run("pf-1"))
    assert got == done
    assert [r.id for r in reader.read_preflight(lambda s: s.runs(node="b"))] == ["pf-1"]
    assert reader.read_preflight(lambda s: s.runs(node="z")) == []
    assert store.preflight.latest_passing("a", "quick", 0) is not None
    assert store.preflight.latest_passing("b", "quick", 0) is None
    assert store.preflight.latest_passing("a", "quick", 1001) is None  # before the drain


def test_only_this_collectors_unfinished_runs_are_closed(backend: Open):
    open_store, _ = backend
    store = open_store("c1")
    store.preflight.start_run(RunRow("pf-mine", "full", ("a",), 1, collector="c1"))
    store.preflight.start_run(RunRow("pf-peer", "full", ("b",), 1, collector="c2"))
    assert store.preflight.close_unfinished("c1", 5000) == 1
    mine = store.preflight.run("pf-mine")
    peer = store.preflight.run("pf-peer")
    assert mine is not None
    assert (mine.verdict, mine.detail, mine.finished_ms) == ("could_not_run", CUT_SHORT, 5000)
    assert peer is not None
    assert peer.verdict == ""


def test_a_schema_4_sqlite_journal_gains_the_tables(tmp_path: Path):
    path = tmp_path / "old.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP TABLE preflight_runs; DROP TABLE preflight_results; PRAGMA user_version=4;"
    )
    conn.close()
    store = SqliteStore(path)
    store.preflight.start_run(RunRow("pf-9", "quick", ("a",), 1))
    store.close()
    (version,) = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()
    assert version == SCHEMA_VERSION == 7
    reader = JournalReader(path)
    assert reader.read_preflight(lambda s: s.run("pf-9")) is not None
