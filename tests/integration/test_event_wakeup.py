"""Faults that announce themselves are acted on at once, not at the next poll or rule tick."""

import pytest

from agent.sim.cluster import SimCluster
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import actions, kinds

pytestmark = pytest.mark.integration


async def test_xid_reaches_a_webhook_long_before_the_next_poll(
    collector_config, receiver, tmp_path
):
    """With a 60 s agent poll and a 60 s rule interval, an Xid 79 still drains within seconds:
    the kernel log wakes the agent, and the event wakes the rule evaluation."""
    service = CollectorService(
        collector_config(actions=actions(receiver, tmp_path), rules_interval=60.0),
        SystemClock(),
    )
    await service.start()
    cluster = SimCluster(
        ["node-1", "node-2"],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=60.0,
        heartbeat_interval=0.2,
    )
    cluster.start()
    try:
        await wait_until(
            lambda: sum(n.connected for n in service.fleet.snapshot().values()) == 2,
            what="agents",
        )
        agent = cluster.agents["node-2"]
        polls = agent.polls
        cluster.nodes["node-2"].xid(6, 79)
        await wait_until(
            lambda: ("drain_request", "node-2") in kinds(receiver), timeout=5, what="drain"
        )
        assert agent.polls == polls  # no timed poll ran: the event read did it
        assert agent.event_polls >= 1
    finally:
        await cluster.stop()
        await service.stop(grace=None)
