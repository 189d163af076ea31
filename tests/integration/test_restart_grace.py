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

# The silence limit of the test config is 1.5 s (0.5 s x 3); the grace leaves a late node time
# to come back after it, however slow the machine is to restart its agent.
GRACE_S = 6.0


def watch_liveness(service: CollectorService) -> list[tuple[float, list[str]]]:
    """Every liveness check of ``service`` from now on: its clock's time, and the nodes overdue."""
    checks: list[tuple[float, list[str]]] = []
    overdue = service.fleet.overdue

    def noted(now_mono: float, silence_s: float) -> list[str]:
        names = overdue(now_mono, silence_s)
        checks.append((now_mono, names))
        return names

    service.fleet.overdue = noted  # type: ignore[method-assign]
    return checks


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
    checks = watch_liveness(again)
    try:
        await wait_until(  # welcomed: their Hellos are in the journal
            lambda: all(a.link.connected for a in cluster.agents.values()),
            what="both agents welcomed",
        )
        await first.stop(grace=None)
        await cluster.crash("node-late")
        await cluster.crash("node-gone")
        started = time.monotonic()  # the grace runs from within start()
        await again.start()
        gone = again.fleet.snapshot()["node-gone"]
        silent_from = gone.last_seen_mono + again.liveness.silence_s
        grace_end = gone.grace_until_mono

        def inside() -> list[list[str]]:
            """What each check past the silence limit and inside the grace found overdue."""
            return [names for at, names in checks if silent_from < at < grace_end]

        # Past the silence limit, inside the grace: neither node is judged yet.
        await wait_until(lambda: bool(inside()), what="a liveness check past the silence limit")
        assert not any(inside()), inside()
        await cluster.restart("node-late")
        await wait_until(
            lambda: again.fleet.snapshot()["node-late"].connected,
            what="node-late back",
        )
        await wait_until(
            lambda: not again.fleet.snapshot()["node-gone"].reachable,
            what="node-gone unreachable",
        )
        assert time.monotonic() - started >= GRACE_S
        assert not any(inside()), inside()  # none judged inside the grace
        lost = [r.node for r in again.reader.events(limit=100) if r.kind == "node_unreachable"]
        assert lost == ["node-gone"]
    finally:
        await cluster.stop()
        await again.stop(grace=None)
