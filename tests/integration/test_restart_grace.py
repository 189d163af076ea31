"""After a collector restart, the nodes its journal remembers get ``restart_grace`` to come back.

A fleet reconnecting after a restart takes longer than the silence limit (agents back off, and
thousands say Hello at once): without the grace every node not yet back is journaled
unreachable and its incidents page, though nothing happened to it. A node that really is gone
is still found, once the grace has run out.
"""

import time
from collections.abc import Callable

import pytest

from agent.sim.cluster import SimCluster
from collector.config import CollectorConfig
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until

pytestmark = pytest.mark.integration

GRACE_S = 3.0  # the silence limit of the test config is 1.5 s (0.5 s x 3)


async def test_a_late_node_is_not_lost_and_a_gone_one_is_after_the_grace(
    collector_config: Callable[..., CollectorConfig], tmp_path
):
    cfg = collector_config(listen=f"127.0.0.1:{free_port()}", restart_grace=GRACE_S)
    first = CollectorService(cfg, SystemClock())
    await first.start()
    cluster = SimCluster(
        ["node-late", "node-gone"],
        tmp_path / "nodes",
        SystemClock(),
        cfg.listen,
        poll_interval=0.05,
        heartbeat_interval=0.2,
        backoff_initial=0.05,
        backoff_max=0.3,
    )
    cluster.start()
    again = CollectorService(cfg, SystemClock())
    try:
        await wait_until(
            lambda: sum(n.connected for n in first.fleet.snapshot().values()) == 2,
            what="both agents connected",
        )
        await first.stop(grace=None)
        await cluster.crash("node-late")
        await cluster.crash("node-gone")
        await again.start()
        started = time.monotonic()
        # Past the silence limit, inside the grace: neither node is judged yet.
        await wait_until(lambda: time.monotonic() - started > 2.0, what="2 s after the start")
        assert all(n.reachable for n in again.fleet.snapshot().values())
        await cluster.restart("node-late")
        await wait_until(
            lambda: again.fleet.snapshot()["node-late"].connected,
            what="node-late back",
        )
        await wait_until(
            lambda: not again.fleet.snapshot()["node-gone"].reachable,
            timeout=10,
            what="node-gone unreachable",
        )
        assert time.monotonic() - started >= GRACE_S
        lost = [r.node for r in again.reader.events(limit=100) if r.kind == "node_unreachable"]
        assert lost == ["node-gone"]
    finally:
        await cluster.stop()
        await again.stop(grace=None)
