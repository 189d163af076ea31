"""Kill the collector (SIGKILL) mid-stream and start it again on the same journal."""

import asyncio
import os
import signal
from pathlib import Path

import pytest

from agent.sim.cluster import SimCluster
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until
from tests.integration.collector_process import journal_markers, start_collector

pytestmark = pytest.mark.integration

NODES = [f"node-{i}" for i in range(1, 9)]


async def test_no_event_lost_or_duplicated_across_a_collector_crash(tmp_path: Path):
    """Events injected before, during and after a SIGKILL of the collector each end up in the
    journal exactly once, once the agents have reconnected and replayed their outboxes."""
    port, journal, log = free_port(), tmp_path / "journal.db", tmp_path / "collector.log"
    proc = start_collector(port, journal, log)
    cluster = SimCluster(
        NODES,
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{port}",
        poll_interval=0.02,
        heartbeat_interval=0.5,
        backoff_initial=0.05,
        backoff_max=0.3,
    )
    cluster.start()
    injected: list[str] = []

    async def inject(count: int) -> None:
        for _ in range(count):
            marker = f"marker-{len(injected)}"
            node = cluster.nodes[NODES[len(injected) % len(NODES)]]
            node.xid(len(injected) % 8, 13, marker)
            injected.append(marker)
            await asyncio.sleep(0.005)  # paced, so that events stream across the kill

    try:
        await wait_until(lambda: all(a.link.connected for a in cluster.agents.values()), 30)
        await inject(300)
        await wait_until(lambda: journal.exists() and sum(journal_markers(journal).values()) > 50)
        proc.send_signal(signal.SIGKILL)  # abruptly, while events are streaming
        proc.wait(timeout=10)
        await inject(200)  # while the collector is down: they wait in the outboxes
        assert cluster.unacked() > 0
        proc = start_collector(port, journal, log)
        await inject(200)
        await wait_until(
            lambda: set(journal_markers(journal)) >= set(injected),
            timeout=60,
            what="every injected event journaled",
        )
        await wait_until(lambda: cluster.unacked() == 0, timeout=30, what="outboxes drained")
        markers = journal_markers(journal)
        assert set(markers) == set(injected), f"missing: {sorted(set(injected) - set(markers))[:5]}"
        assert max(markers.values()) == 1, [m for m, c in markers.items() if c > 1][:5]
        assert len(injected) == 700
    finally:
        await cluster.stop()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
