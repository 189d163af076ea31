"""The collector's own disk fills up under its SQLite journal, then has room again.

The journal lives on a real filesystem of 4 MiB (tmpfs, mounted by the test as root), which the
test fills with a file. Events the agents send meanwhile cannot be committed: the collector acks
none of them (the agents keep them), says so in ``fleetwatch_collector_journal_full`` and a log
line, and once the file is gone the agents' replays land: every event journaled exactly once.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sqlite3
import subprocess
from collections import Counter
from typing import TYPE_CHECKING

import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from agent.sim.cluster import SimCluster
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

NODES = ["node-1", "node-2"]
MARKER = re.compile(r"disk-full-(\d+)")
CHUNK = 64 * 1024


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB filesystem of its own (tmpfs), mounted for this test."""
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem has no room left; return the bytes written."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (CHUNK, 512):  # big pieces, then the last few bytes too
            while True:
                try:
                    written += os.write(fd, b"\0" * size)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return written


def journaled(db: Path) -> Counter[int]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT detail FROM events WHERE detail LIKE '%disk-full-%'")
        return Counter(int(m[1]) for (d,) in rows.fetchall() if (m := MARKER.search(str(d))))


def metric(service: CollectorService, line_start: str) -> float:
    text = generate_latest(service.registry).decode()
    [line] = [line for line in text.splitlines() if line.startswith(line_start)]
    return float(line.rsplit(" ", 1)[1])


async def test_a_full_disk_acks_nothing_and_loses_nothing(
    collector_config: Callable[..., CollectorConfig], small_disk: Path
) -> None:
    db = small_disk / "journal.db"
    service = CollectorService(collector_config(journal=db), SystemClock())
    await service.start()
    cluster = SimCluster(
        NODES,
        small_disk.parent / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.05,
        heartbeat_interval=0.3,
        backoff_initial=0.05,
        backoff_max=0.5,
    )
    cluster.start()
    sent = 0

    def inject(count: int) -> None:
        nonlocal sent
        for _ in range(count):
            node = NODES[sent % len(NODES)]
            cluster.nodes[node].xid(sent % 8, 13, f"disk-full-{sent}")
            sent += 1

    def held() -> int:
        return sum(len(agent.outbox) for agent in cluster.agents.values())

    filler = small_disk / "filler"
    try:
        await wait_until(lambda: all(a.link.connected for a in cluster.agents.values()), 30)
        inject(10)
        await wait_until(lambda: len(journaled(db)) == 10, 30, "the first events journaled")
        assert metric(service, "fleetwatch_collector_journal_full ") == 0
        with capture_logs() as logs:
            fill(filler)
            inject(30)
            await wait_until(lambda: service.stats.journal.full, 30, "the journal full")
            await wait_until(lambda: held() >= 30, 30, "the agents holding what was not acked")
            assert metric(service, "fleetwatch_collector_journal_full ") == 1
            failures = 'fleetwatch_collector_journal_write_failures_total{reason="disk_full"} '
            assert metric(service, failures) >= 1
            assert len(journaled(db)) == 10  # nothing of the 30 was committed
            assert held() >= 30  # ... nor acked: the agents still hold every one
            filler.unlink()
            await wait_until(lambda: len(journaled(db)) == 40, 60, "the rest journaled")
            await wait_until(lambda: not service.stats.journal.full, 30, "the journal has room")
        events = [entry["event"] for entry in logs]
        assert "journal_disk_full" in events
        assert "journal_space_back" in events
        assert metric(service, "fleetwatch_collector_journal_full ") == 0
    finally:
        await cluster.stop()
        await service.stop(grace=None)
    counts = journaled(db)
    assert sorted(counts) == list(range(40))
    assert [m for m, n in counts.items() if n > 1] == []
