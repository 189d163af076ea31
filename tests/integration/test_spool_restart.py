"""Agents restarted while the collector is down: their spooled events reach the journal once."""

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import pytest

from agent.sim.cluster import SimCluster
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until
from tests.integration.collector_process import journal_markers, start_collector

pytestmark = pytest.mark.integration

NODES = [f"node-{i}" for i in range(1, 5)]


def marker(detail: str) -> str:
    return detail.rsplit(", ", 1)[-1]


class Fleet:
    """A cluster whose agents spool under ``tmp_path/state``, and the markers injected."""

    def __init__(self, tmp_path: Path, port: int) -> None:
        self.cluster = SimCluster(
            NODES,
            tmp_path / "nodes",
            SystemClock(),
            f"127.0.0.1:{port}",
            poll_interval=0.02,
            heartbeat_interval=0.5,
            backoff_initial=0.05,
            backoff_max=0.3,
            state_dir=tmp_path / "state",
        )
        self.injected: list[str] = []

    async def inject(self, count: int) -> None:
        for _ in range(count):
            n = len(self.injected)
            name = f"marker-{n}"
            self.cluster.nodes[NODES[n % len(NODES)]].xid(n % 8, 13, name)
            self.injected.append(name)
            await asyncio.sleep(0.002)

    def held(self) -> set[str]:
        return {marker(e.detail) for a in self.cluster.agents.values() for e in a.outbox.after(0)}

    async def restart_agents(self) -> int:
        """Restart every agent once all it has seen is in its outbox; return events restored."""
        await wait_until(lambda: self.held() >= set(self.injected[-50:]), what="events taken")
        restored = 0
        for name in NODES:
            restored += (await self.cluster.restart(name)).outbox.restored
        return restored


async def journaled_exactly_once(journal: Path, fleet: Fleet) -> None:
    await wait_until(
        lambda: journal.exists() and set(journal_markers(journal)) >= set(fleet.injected),
        timeout=60,
        what="every injected event journaled",
    )
    await wait_until(lambda: fleet.cluster.unacked() == 0, timeout=30, what="outboxes drained")
    markers = journal_markers(journal)
    assert set(markers) == set(fleet.injected)
    assert max(markers.values()) == 1, [m for m, c in markers.items() if c > 1][:5]


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


async def test_events_survive_an_agent_restart_while_the_collector_is_down(tmp_path: Path):
    """Events journaled, then injected with the collector killed, the agents restarted (new
    processes of the same boot, same state_dir), more injected, the collector back: every event
    is journaled exactly once, the restarted agents replaying with their original numbers."""
    port, journal, log = free_port(), tmp_path / "journal.db", tmp_path / "collector.log"
    proc = start_collector(port, journal, log)
    fleet = Fleet(tmp_path, port)
    fleet.cluster.start()
    try:
        await wait_until(lambda: all(a.link.connected for a in fleet.cluster.agents.values()), 30)
        await fleet.inject(80)
        await wait_until(lambda: sum(journal_markers(journal).values()) > 20, what="journaled")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        await fleet.inject(80)  # the collector is down: they wait in the spools
        assert await fleet.restart_agents() > 0
        await fleet.inject(80)
        proc = start_collector(port, journal, log)
        await fleet.inject(40)
        await journaled_exactly_once(journal, fleet)
    finally:
        await fleet.cluster.stop()
        stop(proc)


async def test_events_of_agents_that_never_met_a_collector_survive_a_restart(tmp_path: Path):
    """Agents that start with no collector (numbers never confirmed), are restarted, and only
    then reach one: each event they saw is journaled once."""
    port, journal, log = free_port(), tmp_path / "journal.db", tmp_path / "collector.log"
    fleet = Fleet(tmp_path, port)
    fleet.cluster.start()
    proc = None
    try:
        await fleet.inject(60)
        assert await fleet.restart_agents() >= 60
        await fleet.inject(60)
        proc = start_collector(port, journal, log)
        await fleet.inject(20)
        await journaled_exactly_once(journal, fleet)
    finally:
        await fleet.cluster.stop()
        if proc is not None:
            stop(proc)
