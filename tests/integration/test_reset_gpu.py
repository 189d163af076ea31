"""reset_gpu from a rule to the agent and back, over the real stream."""

import asyncio
import sys
import tempfile
import threading
import urllib.request
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent.sim.cluster import SimCluster
from cli.dev.webhook_receiver import WebhookReceiver
from collector.actions.config import ActionsConfig, WebhookConfig
from collector.actions.safety import SafetyConfig
from collector.commands import CommandBroker
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_for_more, wait_until
from tests.integration.reset_rules import RESET_RULES

pytestmark = pytest.mark.integration

# A training rank on GPU 5: it reports a step, then waits for a line before it exits.
RANK = """
import sys
from fleetwatch.jobclient import report_step
assert report_step("held", 0, 1, 1.0, gpu=5, socket_path=sys.argv[1])
sys.stdin.readline()
"""


async def run(
    collector_config: Any,
    tmp_path: Path,
    acts: ActionsConfig,
    text: str = RESET_RULES,
    names: tuple[str, ...] = ("n1",),
    *,
    job_sockets: Path | None = None,
) -> tuple[CollectorService, SimCluster]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    service = CollectorService(
        collector_config(actions=acts, rules=(rules,), rules_interval=0.1),
        SystemClock(),
    )
    await service.start()
    cluster = SimCluster(
        names,
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.05,
        job_socket_dir=job_sockets,
    )
    cluster.start()
    # The first samples are applied once the stream's Hello is done: commands may go out.
    await wait_until(
        lambda: all(n in service.fleet.view() and service.fleet.view()[n].signals for n in names),
        what="agents",
    )
    return service, cluster


async def actions_of(service: CollectorService) -> list[tuple[str, str, str]]:
    rows = await service.journal.do(lambda s: s.incidents.actions(node="n1"))
    return [(r.action, r.state, r.detail) for r in reversed(rows)]


async def settled_actions_of(
    service: CollectorService, timeout: float = 15.0
) -> list[tuple[str, str, str]]:
    """n1's actions once none is still planned or running: an agent acts (resets, refuses)
    a moment before its answer reaches the collector's journal."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        rows = await actions_of(service)
        if rows and all(state not in ("planned", "running") for _, state, _ in rows):
            return rows
        if asyncio.get_running_loop().time() > deadline:
            msg = f"n1's actions still unfinished after {timeout} s: {rows}"
            raise AssertionError(msg)
        await asyncio.sleep(0.05)


class TestResetGpu:
    async def test_nvlink_down_is_reset_by_the_agent(self, collector_config, tmp_path):
        """The rule asks, the collector commands, the agent resets the idle GPU, the links come
        back and the incident resolves; the action is journaled with the agent's answer."""
        service, cluster = await run(collector_config, tmp_path, ActionsConfig())
        try:
            node = cluster.nodes["n1"]
            node.nvlink_down(2, 3)
            await wait_until(lambda: node.gpus[2].resets == 1, what="reset")
            await wait_until(
                lambda: service.evaluator.engine.open_incidents() == [], what="resolved"
            )
            assert await actions_of(service) == [
                ("reset_gpu", "succeeded", "n1 agent: GPU 2 reset")
            ]
        finally:
            await cluster.stop()
            await service.stop(grace=None)

    async def test_busy_gpu_waits_and_is_reset_once_idle(self, collector_config, tmp_path):
        """The agent will not reset a GPU in use: the reset waits (no escalation, no drain) and
        runs once the processes have left."""
        with WebhookReceiver(clock=SystemClock()) as hooks:
            acts = ActionsConfig(
                safety=SafetyConfig(reset_retry_s=0.2),
                drain_webhook=WebhookConfig(url=f"{hooks.url}/drain"),
            )
            service, cluster = await run(collector_config, tmp_path, acts)
            try:
                node = cluster.nodes["n1"]
                node.gpus[5].processes = [4242, 4243]
                node.nvlink_down(5, 0)
                await wait_until(lambda: len(service.dispatcher.waiting) == 1, what="waiting")
                (waiting,) = await actions_of(service)
                assert waiting[:2] == ("reset_gpu", "deferred")
                assert service.dispatcher.status()["drains_waiting"] == 0  # a reset, not a drain
                assert "GPU 5 is busy: 2 compute processes (4242, 4243)" in waiting[2]
                # asked again, still busy: still waiting
                await wait_for_more(lambda: service.dispatcher.deferred, 2, what="asked again")
                assert node.gpus[5].resets == 0
                # a retry leaves the list while the agent is asked (CI once looked just then)
                await wait_until(
                    lambda: len(service.dispatcher.waiting) == 1, what="back to waiting"
                )
                assert node.gpus[5].resets == 0
                node.gpus[5].processes = []  # the job ended
                await wait_until(lambda: node.gpus[5].resets == 1, what="reset once idle")
                await wait_until(
                    lambda: service.evaluator.engine.open_incidents() == [], what="resolved"
                )
                assert await actions_of(service) == [
                    ("reset_gpu", "succeeded", "n1 agent: GPU 5 reset")
                ]
                assert hooks.deliveries() == []
            finally:
                await cluster.stop()
                await service.stop(grace=None)

    async def test_a_reset_held_by_a_job_names_it_and_runs_once_its_rank_ends(
        self, collector_config, tmp_path
    ):
        """Issue 40: a rank of job "held" runs on GPU 5 (a real process reporting to n1's job
        socket). The reset waits, journaled with the job and rank that hold the GPU; when the
        rank's process ends, the reset is asked for at once, not after reset_retry_s (10 min
        here), and runs."""
        acts = ActionsConfig(safety=SafetyConfig(reset_retry_s=600.0))
        sockets = Path(tempfile.mkdtemp(prefix="fwreset", dir="/tmp"))
        service, cluster = await run(collector_config, tmp_path, acts, job_sockets=sockets)
        rank = None
        try:
            socket_path = cluster.job_sockets["n1"]
            await wait_until(socket_path.exists, what="n1's job socket")
            rank = await asyncio.create_subprocess_exec(
                sys.executable, "-c", RANK, str(socket_path), stdin=asyncio.subprocess.PIPE
            )
            await wait_until(lambda: bool(service.jobs.on_gpu("n1", 5)), what="the rank on GPU 5")
            node = cluster.nodes["n1"]
            node.gpus[5].processes = [rank.pid]
            node.nvlink_down(5, 0)
            await wait_until(lambda: len(service.dispatcher.waiting) == 1, what="waiting")
            (waiting,) = await actions_of(service)
            assert waiting[:2] == ("reset_gpu", "deferred")
            assert "held by job held rank 0 (" in waiting[2], waiting
            assert rank.stdin is not None
            rank.stdin.write(b"end\n")
            await rank.wait()
            node.gpus[5].processes = []  # the GPU is free once its process is gone
            await wait_until(lambda: node.gpus[5].resets == 1, 30, "reset once the rank ended")
            assert await settled_actions_of(service) == [
                ("reset_gpu", "succeeded", "n1 agent: GPU 5 reset")
            ]
        finally:
            if rank is not None and rank.returncode is None:
                rank.kill()
                await rank.wait()
            await cluster.stop()
            await service.stop(grace=None)

    async def test_drain_first_drains_then_resets_when_idle(self, collector_config, tmp_path):
        """`reset_gpu: {drain_first: true}`: the node is drained (no new jobs) and the GPU is
        reset once the running job has left, never under it."""
        with WebhookReceiver(clock=SystemClock()) as hooks:
            acts = ActionsConfig(
                safety=SafetyConfig(reset_retry_s=0.2),
                drain_webhook=WebhookConfig(url=f"{hooks.url}/drain"),
            )
            rules = RESET_RULES.replace(
                "actions: [reset_gpu]", "actions: [{reset_gpu: {drain_first: true}}]"
            )
            service, cluster = await run(collector_config, tmp_path, acts, rules)
            try:
                node = cluster.nodes["n1"]
                node.gpus[1].processes = [77]
                node.nvlink_down(1, 4)
                await wait_until(lambda: len(hooks.deliveries()) == 1, what="drain")
                await wait_for_more(lambda: service.dispatcher.deferred, 2, what="asked again")
                assert node.gpus[1].resets == 0  # the job still runs there
                node.gpus[1].processes = []
                await wait_until(lambda: node.gpus[1].resets == 1, what="reset")
                done = [a[:2] for a in await settled_actions_of(service)]
                assert done == [("drain_node", "succeeded"), ("reset_gpu", "succeeded")]
            finally:
                await cluster.stop()
                await service.stop(grace=None)

    async def test_a_reset_that_fails_escalates_at_once(self, collector_config, tmp_path):
        """A reset that ran and failed escalates to a drain without waiting for the fault to
        come back."""
        with WebhookReceiver(clock=SystemClock()) as hooks:
            acts = ActionsConfig(drain_webhook=WebhookConfig(url=f"{hooks.url}/drain"))
            service, cluster = await run(collector_config, tmp_path, acts)
            try:
                node = cluster.nodes["n1"]
                node.gpus[3].reset_fails = True
                node.nvlink_down(3, 0)
                await wait_until(lambda: len(hooks.deliveries()) == 1, what="drain")
                done = await settled_actions_of(service)
                assert done[0][:2] == ("reset_gpu", "failed")
                assert "Unable to reset GPU" in done[0][2]
                assert done[1][:2] == ("escalated_drain_node", "succeeded")
            finally:
                await cluster.stop()
                await service.stop(grace=None)

    async def test_the_page_goes_out_while_the_reset_runs(self, collector_config, tmp_path):
        """`[reset_gpu, notify]`: the notification does not wait behind the reset (a real one
        takes seconds, and the collector waits up to 180 s for it): it is delivered while the
        agent is still resetting, and the reset then finishes and is journaled."""
        with WebhookReceiver(clock=SystemClock()) as hooks:
            acts = ActionsConfig(notify={"default": WebhookConfig(url=f"{hooks.url}/page")})
            rules = RESET_RULES.replace("actions: [reset_gpu]", "actions: [reset_gpu, notify]")
            service, cluster = await run(collector_config, tmp_path, acts, rules)
            gate = threading.Event()
            try:
                node = cluster.nodes["n1"]
                node.gpus[4].reset_gate = gate
                node.nvlink_down(4, 2)
                await wait_until(lambda: len(hooks.deliveries()) == 1, what="the page")
                (page,) = hooks.deliveries()
                assert page.body["kind"] == "notification"
                assert page.body["payload"]["rule"] == "link_down"
                assert node.gpus[4].resets == 0  # the reset is still running
                states = {a: st for a, st, _ in await actions_of(service)}
                assert states["notify"] == "succeeded"
                assert states["reset_gpu"] in {"planned", "running"}  # not finished
                gate.set()
                await wait_until(lambda: node.gpus[4].resets == 1, what="reset")
                done = sorted(a[:2] for a in await settled_actions_of(service))
                assert done == [("notify", "succeeded"), ("reset_gpu", "succeeded")]
            finally:
                gate.set()
                await cluster.stop()
                await service.stop(grace=None)


def scrape(service: CollectorService) -> str:
    url = f"http://127.0.0.1:{service.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


class TestResetTargets:
    async def test_hostile_targets_are_refused_before_any_command(self, collector_config, tmp_path):
        """A reset whose node or target is not a GPU of that node's inventory is refused by the
        collector: no command reaches the agent, forced or not, and no GPU is reset. A GPU the
        inventory has is reset."""
        service, cluster = await run(collector_config, tmp_path, ActionsConfig())
        try:
            broker = CommandBroker(service.grpc.registry, service.fleet)
            node = cluster.nodes["n1"]
            hostile = [
                ("n1", "n1/gpu/9"),  # no GPU 9 in the Hello
                ("n1", "n1/gpu/0; rm -rf /"),
                ("n1", "n1/gpu/0\n--help"),
                ("n1", "n1/gpu/0/nvlink/$(reboot)"),
                ("n1", "n2/gpu/0"),
                ("n1", "n1/ib/mlx5_0/1"),
                ("n1", "n1"),
                ("n1", "n1/gpu/-1"),
                ("n1; rm -rf /", "n1; rm -rf //gpu/0"),
                ("--help", "--help/gpu/0"),
            ]
            with capture_logs() as logs:
                for name, target in hostile:
                    for force in (False, True):
                        outcome = await broker.reset(name, target, force=force)
                        assert (outcome.ok, outcome.refused) == (False, True), target
                        assert outcome.detail.startswith("refused: ")
            assert [e for e in logs if e["event"] == "command_done"] == []  # the agent heard none
            assert len([e for e in logs if e["event"] == "reset_refused"]) == 2 * len(hostile)
            assert [g.resets for g in node.gpus] == [0] * len(node.gpus)
            done = await broker.reset("n1", "n1/gpu/2/nvlink/1", force=False)
            assert (done.ok, done.detail) == (True, "n1 agent: GPU 2 reset")
            assert [g.resets for g in node.gpus].count(1) == node.gpus[2].resets == 1
        finally:
            await cluster.stop()
            await service.stop(grace=None)

    async def test_agent_refuses_a_gpu_of_another_node(self, collector_config, tmp_path):
        """Should the collector ever name another node's GPU (a bug, a stale model), the agent
        refuses it against its own inventory: nothing is reset on either node, and the action is
        journaled and counted as refused (then escalates, as a reset that cannot help)."""
        service, cluster = await run(
            collector_config, tmp_path, ActionsConfig(), names=("n1", "n2")
        )
        try:
            n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
            gpu0 = next(g for g in service.fleet.view()["n1"].gpus.values() if g.index == 0)
            gpu0.uuid = n2.gpus[0].uuid  # the collector's model is wrong about n1's GPU 0
            with capture_logs() as logs:
                n1.nvlink_down(0, 1)
                await wait_until(lambda: bool(rows_of(logs)), what="agent's refusal")
            assert rows_of(logs) == ["unknown_gpu"]
            (first, *_) = await settled_actions_of(service)
            assert first == (
                "reset_gpu",
                "refused",
                f"n1 agent: refused: no GPU {n2.gpus[0].uuid!r} on this node",
            )
            assert [g.resets for g in n1.gpus + n2.gpus] == [0] * (len(n1.gpus) + len(n2.gpus))
            metrics = await asyncio.to_thread(scrape, service)
            assert (
                'fleetwatch_actions_total{action="reset_gpu",node="n1",outcome="refused"} 1.0'
                in metrics
            )
        finally:
            await cluster.stop()
            await service.stop(grace=None)


def rows_of(logs: list[MutableMapping[str, Any]]) -> list[str]:
    return [e["reason"] for e in logs if e["event"] == "command_refused"]
