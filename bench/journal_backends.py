"""The journal on SQLite against PostgreSQL: events per second and commit latency, durable.

Run from the repository root: ``.venv/bin/python bench/journal_backends.py [--seconds S]``.
The last line of output is one JSON object.

Both backends run the collector's own store (:class:`collector.store.sqlite.SqliteStore`,
:class:`collector.store.postgres.PostgresStore`) as the journal's writer thread does: one
transaction per batch of events (group commit), each commit durable before it returns (SQLite
``synchronous=FULL`` in WAL mode; PostgreSQL with its default ``fsync`` and
``synchronous_commit``, a throwaway server from :mod:`cli.dev.pg_server` on loopback, its data
on the same filesystem as the SQLite file). For each batch size (1: a quiet fleet, an event at a
time; 100 and 1,000: a burst) it measures, interleaved round by round so both see the same
machine, the events journaled per second and each commit's latency, and then the fleet-wide
action decision (:meth:`IncidentStore.decide_action`, the lock and the reads of every
collector's actions) that several collectors on PostgreSQL make per drain or reset.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cli.dev.pg_server import PgServer
from collector.store.events import EventRow, EventStore
from collector.store.incidents import ActionRow, FleetActions
from collector.store.postgres import PostgresStore
from collector.store.sqlite import SqliteStore

BATCHES = (1, 100, 1000)
ROUNDS = 5


def rows(node: str, start: int, count: int) -> list[EventRow]:
    now = int(time.time() * 1000)
    return [
        EventRow(
            node=node,
            boot_id="boot-1",
            seq=start + i,
            time_ms=now,
            received_ms=now,
            kind="xid",
            target_kind="gpu",
            gpu_uuid="GPU-00000000-0000-0000-0000-000000000000",
            xid=13,
            xid_class="application",
            detail="NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=python, Graphics Exception",
        )
        for i in range(count)
    ]


def insert_rate(store: EventStore, batch: int, seconds: float, seq: list[int]) -> dict[str, Any]:
    """Insert batches for ``seconds``; events/s and commit latencies (ms)."""
    latencies: list[float] = []
    events = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        batch_rows = rows("node-1", seq[0], batch)
        seq[0] += batch
        t0 = time.perf_counter()
        store.insert_events(batch_rows)
        latencies.append((time.perf_counter() - t0) * 1000)
        events += batch
    return {"events": events, "seconds": seconds, "latencies_ms": latencies}


def decide_latency(store: EventStore, count: int) -> list[float]:
    """Milliseconds per fleet-wide drain decision with ``count`` decisions in the journal."""

    def allow(_fleet: FleetActions) -> tuple[str, str, int]:
        return "planned", "", 0

    out = []
    for i in range(count):
        row = ActionRow(
            idempotency_key=f"drain_node:bench-{time.monotonic_ns()}-{i}",
            incident_id=f"bench-{i}",
            action="drain_node",
            node=f"node-{i % 512}",
            target=f"node-{i % 512}",
            state="planned",
            created_ms=int(time.time() * 1000),
            params={},
        )
        t0 = time.perf_counter()
        store.incidents.decide_action(row, allow, breaker_window_ms=600_000, cooldown_ms=300_000)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per batch size and round")
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite file goes")
    args = parser.parse_args(argv)
    server = PgServer(durable=True)
    server.start()
    work = Path(tempfile.mkdtemp(prefix="fw-journal-bench-", dir=args.dir))
    try:
        stores: dict[str, EventStore] = {
            "sqlite": SqliteStore(work / "journal.db", "bench"),
            "postgresql": PostgresStore(server.create_database("bench"), collector="bench"),
        }
        seqs = {name: [1] for name in stores}
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for r in range(ROUNDS):
            for batch in BATCHES:
                for name, store in stores.items():  # interleaved: same machine, same moment
                    runs.setdefault((name, batch), []).append(
                        insert_rate(store, batch, args.seconds, seqs[name])
                    )
            print(f"round {r + 1}/{ROUNDS} done", file=sys.stderr)
        figures: dict[str, Any] = {}
        print(f"{'backend':<11} {'batch':>5} {'events/s':>10} {'commit p50':>11} {'p99':>8}")
        for (name, batch), results in sorted(runs.items()):
            rate = statistics.median(x["events"] / x["seconds"] for x in results)
            lat = [v for x in results for v in x["latencies_ms"]]
            p50, p99 = statistics.median(lat), pct(lat, 0.99)
            print(f"{name:<11} {batch:>5} {rate:>10,.0f} {p50:>9.2f}ms {p99:>6.2f}ms")
            figures[f"{name}_batch{batch}_events_per_s"] = round(rate)
            figures[f"{name}_batch{batch}_commit_p99_ms"] = round(p99, 2)
        for name, store in stores.items():
            lat = decide_latency(store, 2000)
            figures[f"{name}_decide_action_p50_ms"] = round(statistics.median(lat), 2)
            figures[f"{name}_decide_action_p99_ms"] = round(pct(lat, 0.99), 2)
            print(
                f"{name}: fleet-wide action decision p50 {statistics.median(lat):.2f} ms, "
                f"p99 {pct(lat, 0.99):.2f} ms (2,000 decisions)"
            )
        for store in stores.values():
            store.close()
        figures["sqlite_over_postgresql_batch1"] = round(
            figures["sqlite_batch1_events_per_s"] / figures["postgresql_batch1_events_per_s"], 2
        )
        figures["seconds_per_run"] = args.seconds
        figures["rounds"] = ROUNDS
        print(json.dumps(figures, sort_keys=True))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
