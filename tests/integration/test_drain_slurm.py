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
    with slurm_cluster(spares=3) as running:
        yield running


async def slurm_collector(slurm, collector_config, tmp_path: Path, rules_text: str):
    """A started collector that drains through the real Slurm, with ``rules_text`` as its rules."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_text)
    acts = ActionsConfig(slurm=SlurmConfig(enabled=True, slurm_conf=slurm.conf))
    service = CollectorService(
        collector_config(actions=acts, rules=(rules,), rules_interval=0.1),
        SystemClock(),
    )
    await service.start()
    return service


async def test_xid_79_drains_in_slurm_and_resolution_resumes(
    slurm, collector_config, tmp_path: Path
):
    """Xid 79 on node-02: `scontrol show node` says DRAIN with a fleetwatch reason naming the rule;
    once the GPU is back the incident resolves and the node is IDLE again."""
    service = await slurm_collector(slurm, collector_config, tmp_path, RULES)
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


HOSTILE_PORT_RULES = """\
version: 1
rules:
  - name: ib_port_not_active
    scope: ib_port
    when: 'port.state != "" && port.state != "ACTIVE"'
    severity: critical
    actions: [drain_node]
"""
HOSTILE_STATE = "DOWN; scontrol update NodeName=ALL State=DOWN $(reboot) `id` \"q\" 'q'\n--help"


async def test_telemetry_text_never_reaches_slurm(slurm, collector_config, tmp_path: Path):
    """An IB port whose state file says something hostile (a broken driver, a tampered node)
    fires a drain, and Slurm's reason holds only fleetwatch's words and checked names: the rule,
    the port, the incident. The hostile text stays in the journaled event (data); the model, and
    so the incident's evidence, keeps only the kernel's state names."""
    service = await slurm_collector(slurm, collector_config, tmp_path, HOSTILE_PORT_RULES)
    cluster = SimCluster(
        ["node-04"],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.05,
    )
    cluster.start()
    try:
        await wait_until(lambda: len(service.fleet.snapshot()) == 1, what="agent")
        port = cluster.nodes["node-04"].ib_ports[0]
        cluster.nodes["node-04"].sysfs.write_ib_port(
            port.device,
            port.port,
            state=f"1: {HOSTILE_STATE}",
            phys_state="2: Polling",
            rate="400 Gb/sec (4X NDR)",
            link_layer="InfiniBand",
            counters={},
        )
        await wait_until(lambda: slurm.node("node-04").drained, timeout=20, what="drain in Slurm")
        await wait_until(
            lambda: bool(service.reader.events(node="node-04", kind="ib_port_down")),
            what="the port's event journaled",
        )
        (event,) = service.reader.events(node="node-04", kind="ib_port_down")
        assert "$(reboot)" in event.detail  # the telemetry did carry it ...
        (row,) = await service.journal.do(lambda s: s.incidents.incidents(open_only=True))
        assert row.evidence == f"IB {port.device}/{port.port} unknown/Polling"
        target = f"{port.device}/{port.port}"
        assert slurm.node("node-04").reason == (  # ... and Slurm never saw it
            f"fleetwatch: ib_port_not_active: IB {target} (incident {row.id})"
        )
        assert all("DOWN" not in slurm.node(n).states for n in ("node-01", "node-03"))
    finally:
        await cluster.stop()
        await service.stop(grace=None)
        slurm.run("scontrol", "update", "NodeName=node-04", "State=RESUME", check=False)
