"""A fault drains the node in a real Slurm, with fleetwatch's reason; resolution resumes it."""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sim.cluster import SimCluster
from collector.actions.config import ActionsConfig, SlurmConfig
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.slurm_harness import SlurmCluster, slurm_cluster

pytestmark = pytest.mark.integration

RULES = """\
version: 1
rules:
  - name: gpu_off_the_bus
    scope: gpu
    when: '!gpu.present'
    severity: critical
    actions: [{drain_node: {resume_on_resolve: true}}]
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    with slurm_cluster(spares=2) as running:
        yield running


async def test_xid_79_drains_in_slurm_and_resolution_resumes(
    slurm, collector_config, tmp_path: Path
):
    """Xid 79 on node-02: `scontrol show node` says DRAIN with a fleetwatch reason naming the rule;
    once the GPU is back the incident resolves and the node is IDLE again."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    acts = ActionsConfig(slurm=SlurmConfig(enabled=True, slurm_conf=slurm.conf))
    service = CollectorService(
        collector_config(actions=acts, rules=(rules,), rules_interval=0.1),
        SystemClock(),
    )
    await service.start()
    cluster = SimCluster(
        ["node-02", "node-03"],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.05,
    )
    cluster.start()
    try:
        await wait_until(lambda: len(service.fleet.snapshot()) == 2, what="agents")
        cluster.nodes["node-02"].xid(4, 79)
        await wait_until(lambda: slurm.node("node-02").drained, timeout=20, what="drain in Slurm")
        state = slurm.node("node-02")
        assert state.reason is not None
        assert state.reason.startswith("fleetwatch: gpu_off_the_bus: GPU 4")
        assert not slurm.node("node-03").drained
        cluster.nodes["node-02"].gpus[4].lost = False  # a reset brought it back
        await wait_until(
            lambda: "IDLE" in slurm.node("node-02").states and not slurm.node("node-02").drained,
            timeout=20,
            what="resume in Slurm",
        )
        # Slurm may show the node resumed a moment before the journal records the outcome.
        want = [("drain_node", "succeeded"), ("resume_node", "succeeded")]
        seen: list[tuple[str, str]] = []
        for _ in range(50):
            rows = await service.journal.do(lambda s: s.incidents.actions(node="node-02"))
            seen = [(r.action, r.state) for r in reversed(rows)]
            if seen == want:
                break
            await asyncio.sleep(0.1)
        assert seen == want
    finally:
        await cluster.stop()
        await service.stop(grace=None)
