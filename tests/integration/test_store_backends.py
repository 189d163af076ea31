"""The journal's store interface on both backends: the SQLite file and a real PostgreSQL server.

Every test runs twice, once per backend, with the same expectations: what the collector relies on
(deduplication, ids, incidents, actions, silences, the fleet-wide decisions) must not depend on
the database under it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from collector.exceptions import JournalError, RowRefusedError
from collector.store.events import EventRow, NodeRow
from collector.store.incidents import ActionRow, FleetActions, IncidentRow, SilenceRow
from collector.store.journal import Journal
from collector.store.postgres import SCHEMA_VERSION, PostgresStore
from collector.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from tests.integration.store_backend import Open


def event(seq: int | None, node: str = "n1", boot: str = "b1", kind: str = "xid") -> EventRow:
    return EventRow(node, boot, seq, 1000 + (seq or 0), 2000, kind, "gpu", "GPU-1", xid=79)


def action(key: str, name: str = "drain_node", node: str = "n1", **kw: object) -> ActionRow:
    fields: dict[str, object] = {
        "idempotency_key": key,
        "incident_id": f"inc-{key}",
        "action": name,
        "node": node,
        "target": node,
        "state": "running",
        "created_ms": 10_000,
        "params": {},
    }
    fields.update(kw)
    return ActionRow(**fields)  # type: ignore[arg-type]


class TestEvents:
    def test_dedup_ids_and_reads(self, backend: Open):
        """(node, boot, seq) is journaled once; collector events (no seq) always; reads page."""
        open_store, open_reader = backend
        store = open_store("c1")
        first = store.insert_events([event(1), event(2), event(None, boot="")])
        again = store.insert_events([event(2), event(3), event(2, boot="b2"), event(None, boot="")])
        assert all(first)
        assert again[0] == 0
        assert all(again[1:])
        assert store.high_seq("n1", "b1") == 3
        assert store.high_seq("n1", "b2") == 2
        assert store.high_seq("n9", "b1") == 0
        reader = open_reader()
        assert reader.count() == 6
        newest = reader.events(node="n1", limit=2, newest_first=True)
        assert [e.seq for e in newest] == [None, 2]
        assert [e.id for e in reader.events(after_id=first[1], limit=2)] == [first[2], again[1]]
        assert store.received_since(2000, 3)[-1].id == max(again)
        reader.close()

    def test_a_second_collector_sees_the_first_ones_events(self, backend: Open):
        """An agent that fails over replays its outbox: what the first collector journaled is
        a duplicate for the second (on one shared journal), and its Welcome names the seq."""
        open_store, _ = backend
        one = open_store("c1")
        one.insert_events([event(1), event(2)])
        two = open_store("c2") if one.shared else one
        assert two.high_seq("n1", "b1") == 2
        assert two.insert_events([event(1), event(2), event(3)])[:2] == [0, 0]


class TestGroupCommit:
    async def test_a_row_the_database_refuses_fails_alone(self, backend: Open):
        """One group commit of five rows, one with a number no 64-bit column holds: that row's
        waiter gets RowRefusedError naming the database's complaint; the other four commit in
        the same batch (a duplicate among them still reads as one), nothing is written twice.
        A sixth row, appended first with nothing else being written, goes in at once and holds
        the five back until its commit is done."""
        open_store, open_reader = backend
        store = open_store("c1")
        store.insert_events([event(1)])
        journal = Journal(store)
        try:
            results = await asyncio.gather(
                journal.append(event(1, node="n3")),
                journal.append(event(2)),
                journal.append(event(2**63, node="n2")),
                journal.append(event(1)),  # already there
                journal.append(event(3)),
                journal.append(event(None, boot="")),
                return_exceptions=True,
            )
            refused = results[2]
            assert isinstance(refused, RowRefusedError)
            assert "the journal refused the row" in str(refused)
            assert isinstance(refused.__cause__, (OverflowError, psycopg.DataError))
            assert results[3] == 0
            assert all(isinstance(r, int) and r > 0 for r in (results[1], results[4], results[5]))
            # the sixth alone, then the five as one batch after its row-by-row retry
            assert journal.commits == 2
            assert store.high_seq("n1", "b1") == 3
            assert store.high_seq("n2", "b1") == 0
            reader = open_reader()
            assert sorted((r.node, r.seq or 0) for r in reader.events()) == [
                ("n1", 0),
                ("n1", 1),
                ("n1", 2),
                ("n1", 3),
                ("n3", 1),
            ]
            reader.close()
            assert await journal.append(event(4)) > 0  # the writer goes on
        finally:
            await journal.close()

    async def test_a_lone_event_costs_no_more_turns_than_a_call_on_the_writer(self, tmp_path: Path):
        """An event appended with nothing else being written goes straight to the writer thread:
        on a busy loop it is committed and answered in as many turns as any call there. Through
        the writer task it took two turns more (the task woken, then the waiter), and at 4,096
        nodes a turn of the collector's loop is 10 to 40 ms.

        A turn here also lasts until the writer thread has done what it was handed: the turns
        then count the loop's own steps, not how long a loaded machine's disk takes to sync a
        commit (or its thread to get a core), which can be several 10 ms turns."""
        journal = Journal(SqliteStore(tmp_path / "journal.db"))
        busy = asyncio.Event()
        turns = 0
        handed = 0  # calls handed to the writer thread and not yet waited for by the hog
        done = threading.Semaphore(0)  # one release as each of them ends
        loop = asyncio.get_running_loop()
        run_in_executor = loop.run_in_executor

        def counted(executor: Any, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
            nonlocal handed
            handed += 1

            def job() -> Any:
                try:
                    return fn(*args)
                finally:
                    done.release()

            return run_in_executor(executor, job)

        async def hog() -> None:  # a loaded collector: each turn holds the loop 10 ms
            nonlocal turns, handed
            while not busy.is_set():
                turns += 1
                time.sleep(0.01)
                while handed:  # ... and until the writer thread's work handed so far is done
                    assert done.acquire(timeout=30), "the writer thread is stuck"
                    handed -= 1
                await asyncio.sleep(0)

        async def turns_of(call: Awaitable[object]) -> int:
            before = turns
            await call
            return turns - before

        loop.run_in_executor = counted  # type: ignore[method-assign,assignment]
        task = asyncio.create_task(hog())
        try:
            await journal.do(lambda s: s.high_seq("n1", "b1"))  # the writer thread is up
            for seq in range(1, 6):
                call = await turns_of(journal.do(lambda s: s.high_seq("n1", "b1")))
                append = await turns_of(journal.append(event(seq)))
                assert append <= call, f"the event took {append} turns, a call {call}"
        finally:
            busy.set()
            await task
            loop.run_in_executor = run_in_executor  # type: ignore[method-assign]
            await journal.close()
        assert journal.commits == 5

    async def test_a_commit_that_fails_as_a_whole_fails_every_row(self, tmp_path: Path):
        """When the database itself fails (here its connection is closed), no row is refused
        on its own: every waiter gets the database's error, none is told it was the culprit."""
        store = SqliteStore(tmp_path / "journal.db")
        journal = Journal(store)
        store.db.close()
        results = await asyncio.gather(
            journal.append(event(1)), journal.append(event(2**63)), return_exceptions=True
        )
        assert all(isinstance(r, sqlite3.ProgrammingError) for r in results)
        assert not any(isinstance(r, RowRefusedError) for r in results)
        await journal.close()


class TestNodes:
    def test_nodes_remember_their_collector(self, backend: Open):
        """Hello rows name the collector holding the stream; a collector that no longer holds a
        node cannot mark it unreachable."""
        open_store, _ = backend
        one = open_store("c1")
        one.save_node(NodeRow("n1", "b1", b"hello", 5, reachable=True))
        assert one.node_holder("n1") == ("c1", 5)
        other = open_store("c2") if one.shared else None
        if other is None:  # SQLite: one collector owns the file; a second name is a takeover
            other = one
            other.collector = "c2"
        other.save_node(NodeRow("n1", "b1", b"hello2", 7, reachable=True))
        one.collector = "c1"
        one.set_reachable("n1", reachable=False, last_seen_ms=9)  # c1 lost it: no effect
        assert one.load_nodes() == [NodeRow("n1", "b1", b"hello2", 7, True, "c2")]
        assert one.node_holder("n1") == ("c2", 7)
        assert one.node_holder("n9") is None

    def test_collector_heartbeats(self, backend: Open):
        open_store, _ = backend
        store = open_store("c1")
        store.beat(100, "0.1.0")
        store.beat(200, "0.1.0")
        assert store.collectors() == [("c1", 200, "0.1.0")]


class TestIncidentsActionsSilences:
    def test_round_trips(self, backend: Open):
        open_store, open_reader = backend
        store = open_store("c1")
        inc = IncidentRow("r:n1:1", "r", "n1", "n1", "critical", "firing", 1, 2, fired_ms=2)
        store.incidents.upsert_incident(inc)
        store.incidents.upsert_incident(
            IncidentRow("r:n1:1", "r", "n1", "n1", "critical", "resolved", 1, 3, 2, 3, "ok")
        )
        (got,) = store.incidents.incidents()
        assert (got.phase, got.resolved_ms, got.evidence) == ("resolved", 3, "ok")
        assert store.incidents.incidents(open_only=True) == []
        aid, new = store.incidents.add_action(action("k1", params={"a": 1}))
        assert new
        assert store.incidents.add_action(action("k1")) == (aid, False)
        store.incidents.finish_action(aid, "succeeded", "x" * 3000, 11_000)
        reader = open_reader()
        (done,) = reader.read(lambda s: s.actions(node="n1"))
        reader.close()
        assert (done.state, len(done.detail), done.params) == ("succeeded", 2000, {"a": 1})
        assert store.incidents.action(aid) == done  # one action by its id
        assert store.incidents.action(aid + 1000) is None
        assert store.incidents.unfinished_actions() == []
        sid = store.incidents.add_silence(SilenceRow("n1", "*", 0, 100, "maint", 0))
        assert [s.id for s in store.incidents.silences(active_at_ms=50)] == [sid]
        assert store.incidents.silences(active_at_ms=100) == []
        assert store.incidents.remove_silence(sid)
        assert not store.incidents.remove_silence(sid)


class TestFleetDecisions:
    def test_fleet_view_counts_every_collectors_actions(self, backend: Open):
        """Drained nodes (until resumed), drains and resets in flight, drains in the breaker
        window and the newest start per place, whoever journaled them."""
        open_store, _ = backend
        store = open_store("c1")
        inc = store.incidents
        d1, _ = inc.add_action(action("d1", node="n1", created_ms=1000))
        inc.finish_action(d1, "succeeded", "", 1001)
        d2, _ = inc.add_action(action("d2", node="n2", created_ms=2000))
        inc.finish_action(d2, "succeeded", "", 2001)
        inc.add_action(action("r2", "resume_node", node="n2", state="succeeded", created_ms=3000))
        inc.add_action(action("d3", "escalated_drain_node", node="n3", created_ms=4000))
        inc.add_action(action("g1", "reset_gpu", node="n4", target="n4/gpu/2", created_ms=5000))
        inc.add_action(action("w", node="n5", state="deferred", created_ms=6000))
        fleet = inc.fleet_actions(since_ms=1500)
        assert fleet.drained == {"n1": "inc-d1"}
        assert fleet.draining == frozenset({"n3"})
        assert fleet.resetting == frozenset({"n4/gpu/2"})
        assert fleet.drains_since == 2  # d2 and d3; the deferred one never started
        assert fleet.last_ms[("drain_node", "n1")] == 1000
        assert fleet.last_ms[("drain_node", "n3")] == 4000
        assert fleet.last_ms[("reset_gpu", "n4/gpu/2")] == 5000
        assert fleet.breaker_open_until_ms == 0

    def test_decide_action_keeps_the_first_decision_and_opens_the_breaker(self, backend: Open):
        open_store, _ = backend
        inc = open_store("c1").incidents
        seen: list[FleetActions] = []

        def deny(fleet: FleetActions) -> tuple[str, str, int]:
            seen.append(fleet)
            return "deferred", "drain cap reached", 0

        first = inc.decide_action(action("k"), deny, breaker_window_ms=600_000)
        assert first[1:] == (True, "deferred", "drain cap reached")
        again = inc.decide_action(
            action("k"), lambda _: ("planned", "", 0), breaker_window_ms=600_000
        )
        assert again == (first[0], False, "deferred", "drain cap reached")
        assert len(seen) == 1
        inc.decide_action(
            action("k2"), lambda _: ("deferred", "breaker", 99_000), breaker_window_ms=1
        )
        assert inc.fleet_actions(0).breaker_open_until_ms == 99_000
        inc.open_breaker(50_000)  # never shortened
        assert inc.fleet_actions(0).breaker_open_until_ms == 99_000

    def test_cooldowns_read_only_recent_starts(self, backend: Open):
        """With a cooldown given, starts older than it are not read (the table keeps growing)."""
        open_store, _ = backend
        inc = open_store("c1").incidents
        inc.add_action(action("old", node="n1", created_ms=1_000))
        inc.add_action(action("new", node="n2", created_ms=9_000))
        seen: list[FleetActions] = []

        def look(fleet: FleetActions) -> tuple[str, str, int]:
            seen.append(fleet)
            return "skipped", "looked", 0

        inc.decide_action(
            action("k", created_ms=10_000), look, breaker_window_ms=1, cooldown_ms=5_000
        )
        assert set(seen[0].last_ms) == {("drain_node", "n2")}


class TestPostgresOnly:
    def test_two_collectors_race_for_one_drain_slot(self, pg_dsn: str):
        """The fleet lock: two collectors deciding at once cannot both take the last slot
        under the cap; the second sees the first's drain in flight."""
        stores = [PostgresStore(pg_dsn, collector=f"c{i}") for i in range(2)]
        barrier = threading.Barrier(2)
        results: list[str] = []

        def cap_of_one(fleet: FleetActions) -> tuple[str, str, int]:
            if fleet.draining or fleet.drained:
                return "deferred", "drain cap reached", 0
            return "planned", "", 0

        def decide(i: int) -> None:
            barrier.wait()
            _, _, state, _ = stores[i].incidents.decide_action(
                action(f"k{i}", node=f"n{i}"), cap_of_one, breaker_window_ms=1
            )
            results.append(state)

        threads = [threading.Thread(target=decide, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == ["deferred", "planned"]
        for s in stores:
            s.close()

    def test_migrations_once_and_newer_schema_refused(self, pg_dsn: str):
        """Collectors starting together migrate once; a schema newer than ours is refused."""
        stores: list[PostgresStore] = []
        threads = [
            threading.Thread(target=lambda: stores.append(PostgresStore(pg_dsn))) for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(stores) == 3
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT version FROM fleetwatch_schema").fetchall()
            assert rows == [(SCHEMA_VERSION,)]
            conn.execute("UPDATE fleetwatch_schema SET version = %s", (SCHEMA_VERSION + 1,))
        with pytest.raises(JournalError, match=r"newer than this collector's"):
            PostgresStore(pg_dsn)
        for s in stores:
            s.close()

    def test_a_dropped_connection_costs_one_call(self, pg_dsn: str):
        """The server closes the connection (a restart, a failover): the next call reconnects."""
        store = PostgresStore(pg_dsn, collector="c1")
        store.insert_events([event(1)])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'fleetwatch-collector'"
            )
        with pytest.raises(psycopg.OperationalError):
            store.insert_events([event(2)])
        assert store.insert_events([event(2)])[0] > 0
        assert store.high_seq("n1", "b1") == 2
        store.close()

    def test_unreachable_server_is_a_journal_error_without_the_password(self, pg_server):
        dsn = f"host=127.0.0.1 port={pg_server.port} user=nobody_here dbname=missing"
        with pytest.raises(JournalError, match=r"cannot open the journal at postgresql://") as e:
            PostgresStore(dsn, password="s3cret-pw")  # noqa: S106 - a made-up one
        assert "s3cret-pw" not in str(e.value)


def test_sqlite_v3_journal_gains_the_collector_column(tmp_path: Path):
    """A journal written by the previous release (schema 3) opens, keeps its nodes, and gets
    the collector column and the fleet tables."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE nodes (name TEXT PRIMARY KEY, boot_id TEXT NOT NULL, hello BLOB NOT NULL,"
        " last_seen_ms INTEGER NOT NULL, reachable INTEGER NOT NULL DEFAULT 1);"
        "INSERT INTO nodes VALUES ('n1', 'b1', x'00', 5, 1); PRAGMA user_version=3;"
    )
    conn.close()
    store = SqliteStore(path, "c1")
    assert store.load_nodes() == [NodeRow("n1", "b1", b"\x00", 5, True, "")]
    store.beat(1, "v")
    assert store.incidents.fleet_actions(0).drained == {}
    store.close()
    assert SqliteStore(path, "c1").load_nodes()[0].collector == ""
