"""reboot_node reboots through a real Slurm: ``scontrol reboot ASAP nextstate=DOWN reason=...``.

The harness's slurm.conf names a ``RebootProgram`` that records each call and reboots nothing
(``tests/slurm_harness.py``); its one slurmd serves the spare nodes too, so every reboot of a
spare runs that program. Nothing really reboots, so no node ever registers from a new boot:
the reboot stays ``REBOOT_ISSUED`` until Slurm's ``ResumeTimeout`` marks it DOWN.
"""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sim.cluster import SimCluster
from collector.actions.config import ActionsConfig, SlurmConfig
from collector.actions.safety import SafetyConfig
from collector.actions.slurm import SlurmError
from collector.actions.slurm_reboot import REBOOT_FLAGS, RebootOutcome, SlurmReboots
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.slurm_harness import REBOOT_LOG, SlurmCluster, slurm_cluster

pytestmark = pytest.mark.integration

RULES = """\
version: 1
rules:
  - name: gpu_off_the_bus
    scope: gpu
    when: '!gpu.present'
    severity: critical
    actions: [{reboot_node: {reason: GPU fell off the bus}}]
"""
DRY_RULES = RULES + "    dry_run: true\n"


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    with slurm_cluster(spares=5) as running:
        yield running


def reboot_calls(slurm: SlurmCluster) -> list[str]:
    """One line per run of the RebootProgram: ``<unix time> <host> <argv>``."""
    log = slurm.root / REBOOT_LOG
    return log.read_text().splitlines() if log.exists() else []


def queued(slurm: SlurmCluster, node: str) -> int:
    """How many reboots of ``node`` slurmctld took (each ``scontrol reboot`` that reached it)."""
    text = (slurm.root / "slurmctld.log").read_text(errors="replace")
    return text.count(f"reboot request queued for nodes {node}\n")


async def settled(slurm: SlurmCluster) -> int:
    """Wait until slurmd ran the RebootProgram once for each reboot slurmctld took; how many.

    Every reboot this module asks for is issued in the end (a busy node's once its job is
    cancelled), and the program cannot tell which node it reboots (one slurmd serves them
    all), so a test counts its own calls from a settled start.
    """
    text = (slurm.root / "slurmctld.log").read_text(errors="replace")
    taken = text.count("reboot request queued for nodes ")
    await wait_until(lambda: len(reboot_calls(slurm)) >= taken, 30, "the RebootProgram")
    return len(reboot_calls(slurm))


def show(slurm: SlurmCluster, node: str) -> str:
    return slurm.run("scontrol", "show", "node", "-o", node).stdout


async def start(slurm, collector_config, tmp_path: Path, rules: str, nodes: list[str]):
    """A collector on ``rules`` acting through the real Slurm, and simulated ``nodes``."""
    path = tmp_path / "rules.yaml"
    path.write_text(rules)
    acts = ActionsConfig(
        safety=SafetyConfig(max_drained_nodes=10, max_drained_share=1.0),
        slurm=SlurmConfig(enabled=True, slurm_conf=slurm.conf),
    )
    service = CollectorService(
        collector_config(actions=acts, rules=(path,), rules_interval=0.1), SystemClock()
    )
    await service.start()
    cluster = SimCluster(
        nodes,
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.05,
    )
    cluster.start()
    await wait_until(lambda: len(service.fleet.snapshot()) == len(nodes), what="agents")
    return service, cluster


async def firing(service: CollectorService, node: str) -> list[str]:
    """The ids of the node's incidents the journal holds as firing."""
    rows = await service.journal.do(lambda s: s.incidents.incidents(open_only=True, node=node))
    return [r.id for r in rows if r.phase == "firing"]


async def reboot_rows(service: CollectorService, node: str) -> list[tuple[str, str, str]]:
    rows = await service.journal.do(lambda s: s.incidents.actions(node=node))
    return [(r.incident_id, r.state, r.detail) for r in reversed(rows) if r.action == "reboot_node"]


async def test_a_rule_reboots_the_node_in_slurm_once(slurm, collector_config, tmp_path: Path):
    """Xid 79 on node-02: the real ``scontrol reboot ASAP nextstate=DOWN`` reaches slurmctld
    (the node is drained and its reboot requested, with fleetwatch's reason), slurmd runs the
    RebootProgram, and the node is in repair. Once that incident resolved, another GPU of the
    node falls off: a new incident within the reboot cooldown, skipped, and Slurm is asked for
    nothing more."""
    before = await settled(slurm)
    service, cluster = await start(slurm, collector_config, tmp_path, RULES, ["node-02"])
    try:
        cluster.nodes["node-02"].xid(4, 79)
        state = await asyncio.to_thread(
            slurm.wait_for, "node-02", lambda s: not s.states.isdisjoint(REBOOT_FLAGS), 20
        )
        assert "DRAIN" in state.states  # ASAP: no job starts there before the reboot
        assert state.reason is not None
        assert state.reason.startswith(
            "fleetwatch: gpu_off_the_bus: GPU 4: GPU fell off the bus (incident gpu_off_the_bus:"
        )
        assert "NextState=DOWN" in show(slurm, "node-02")
        await wait_until(lambda: len(reboot_calls(slurm)) == before + 1, 30, "the RebootProgram")
        state = await asyncio.to_thread(
            slurm.wait_for, "node-02", lambda s: "REBOOT_ISSUED" in s.states, 20
        )
        assert state.reason is not None
        assert state.reason.endswith(": reboot issued")  # Slurm's words, after ours
        assert queued(slurm, "node-02") == 1
        await wait_until(
            lambda: _count(reboot_rows(service, "node-02"), 1), what="the journaled reboot"
        )
        ((first, outcome, detail),) = await reboot_rows(service, "node-02")
        assert outcome == "succeeded"
        assert detail.startswith("slurm: reboot of node-02 asked (")
        lifecycle = service.lifecycle.row("node-02")
        assert lifecycle is not None
        assert (lifecycle.state, lifecycle.actor, lifecycle.incident) == (
            "in_repair",
            "action:reboot_node",
            first,
        )
        assert service.dispatcher.drained == {"node-02": first}  # the reboot drained it

        cluster.nodes["node-02"].gpus[4].lost = False  # the incident resolves ...
        await wait_until(lambda: _none(firing(service, "node-02")), what="the incident resolved")
        cluster.nodes["node-02"].xid(5, 79)  # ... and another GPU falls off: a new incident
        await wait_until(
            lambda: _count(reboot_rows(service, "node-02"), 2), what="the second reboot row"
        )
        (_, (second, outcome, detail)) = await reboot_rows(service, "node-02")
        assert second != first
        assert outcome == "skipped"
        assert detail.startswith("cooldown: reboot_node ran on node-02")
        assert queued(slurm, "node-02") == 1
        assert len(reboot_calls(slurm)) == before + 1
    finally:
        await cluster.stop()
        await service.stop(grace=None)


async def _count(rows, n: int) -> bool:
    return len(await rows) >= n


async def _none(rows) -> bool:
    return not await rows


async def test_a_restart_does_not_reboot_again(slurm, collector_config, tmp_path: Path):
    """A collector that restarts while the incident that rebooted node-03 still fires does not
    ask Slurm again: the reboot was journaled under its key before it ran."""
    service, cluster = await start(slurm, collector_config, tmp_path, RULES, ["node-03"])
    try:
        cluster.nodes["node-03"].xid(2, 79)
        await wait_until(lambda: queued(slurm, "node-03") == 1, 20, "the reboot in slurmctld")
        await wait_until(
            lambda: _count(reboot_rows(service, "node-03"), 1), what="the journaled reboot"
        )
        await settled(slurm)
    finally:
        await cluster.stop()
        await service.stop(grace=None)
    service, cluster = await start(slurm, collector_config, tmp_path, RULES, ["node-03"])
    try:
        # The start handed the firing incident to the dispatcher again (it may have died
        # between journaling the firing and its actions); what that ran is over now.
        assert len(await firing(service, "node-03")) == 1
        await service.incidents.idle()
        rows = await reboot_rows(service, "node-03")
        assert [state for _, state, _ in rows] == ["succeeded"]
        assert queued(slurm, "node-03") == 1
    finally:
        await cluster.stop()
        await service.stop(grace=None)


async def test_dry_run_journals_and_asks_slurm_nothing(slurm, collector_config, tmp_path: Path):
    """Under the rule's dry_run the reboot is journaled as dry_run and never reaches Slurm:
    node-04 stays IDLE without a reboot flag, and slurmctld took no reboot of it."""
    service, cluster = await start(slurm, collector_config, tmp_path, DRY_RULES, ["node-04"])
    try:
        cluster.nodes["node-04"].xid(1, 79)
        await wait_until(
            lambda: _count(reboot_rows(service, "node-04"), 1), what="the journaled reboot"
        )
        ((_, outcome, detail),) = await reboot_rows(service, "node-04")
        assert (outcome, detail) == ("dry_run", "dry run: nothing was done")
        state = slurm.node("node-04")
        assert state.states == {"IDLE"}
        assert state.reason is None
        assert queued(slurm, "node-04") == 0
        assert service.lifecycle.state("node-04").value != "in_repair"
    finally:
        await cluster.stop()
        await service.stop(grace=None)


async def test_a_busy_node_reboots_once_its_job_has_ended(slurm):
    """``ASAP`` on a node that runs a job: Slurm drains it (DRAIN, the job still there) and
    holds the reboot (REBOOT_REQUESTED) until the job has ended; asked again meanwhile, the
    adapter leaves the pending reboot alone. Once the job is cancelled slurmd runs the
    RebootProgram."""
    reboots = SlurmReboots(env=slurm.env)
    before = await settled(slurm)
    job = slurm.allocate("node-05")
    try:
        result = await reboots.reboot("node-05", "fleetwatch: test: node node-05 (incident x)")
        assert result.outcome is RebootOutcome.REQUESTED
        assert {"ALLOCATED", "DRAIN", "REBOOT_REQUESTED"} <= result.state.states
        assert result.state.draining  # the job runs on: ASAP waits for it
        again = await reboots.reboot("node-05", "fleetwatch: test: node node-05 (incident y)")
        assert again.outcome is RebootOutcome.ALREADY_REQUESTED
        assert again.state.reason == "fleetwatch: test: node node-05 (incident x)"
        assert queued(slurm, "node-05") == 1
        assert "REBOOT_ISSUED" not in slurm.node("node-05").states
    finally:
        slurm.run("scancel", job)
    await wait_until(lambda: len(reboot_calls(slurm)) == before + 1, 30, "the RebootProgram")
    state = await asyncio.to_thread(
        slurm.wait_for, "node-05", lambda s: "REBOOT_ISSUED" in s.states, 20
    )
    assert "ALLOCATED" not in state.states


async def test_a_persons_drain_is_not_rebooted_over(slurm):
    """A node a person drained keeps the person's reason: no reboot is asked for."""
    slurm.run("scontrol", "update", "NodeName=node-06", "State=DRAIN", "Reason=bad fan")
    reboots = SlurmReboots(env=slurm.env)
    result = await reboots.reboot("node-06", "fleetwatch: test: node node-06 (incident z)")
    assert result.outcome is RebootOutcome.HELD_BY_OTHER
    assert slurm.node("node-06").reason == "bad fan"
    assert queued(slurm, "node-06") == 0


async def test_scontrol_errors_name_the_node(slurm):
    """A node Slurm does not know: SlurmError names it and carries scontrol's words."""
    reboots = SlurmReboots(env=slurm.env)
    with pytest.raises(SlurmError) as caught:
        await reboots.reboot("node-99", "fleetwatch: test: node node-99 (incident w)")
    assert caught.value.node == "node-99"
    assert "'node-99'" in str(caught.value)
    assert "not found" in str(caught.value).lower()
