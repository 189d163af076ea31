"""reset_gpu from a rule to the agent and back, over the real stream."""

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent.sim.cluster import SimCluster
from collector.actions.config import ActionsConfig, WebhookConfig
from collector.actions.dispatcher import SafetyConfig
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from fleetwatch.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.integration

RULES = """\
version: 1
rules:
  - name: link_down
    scope: gpu
    when: 'gpu.nvlinks_down > 0'
    severity: critical
    actions: [reset_gpu]
    escalate: {after: 3, within: 1h, actions: [drain_node]}
"""


async def run(
    collector_config: Any, tmp_path: Path, acts: ActionsConfig, text: str = RULES
) -> tuple[CollectorService, SimCluster]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    service = CollectorService(
        collector_config(actions=acts, rules=(rules,), rules_interval=0.1),
        SystemClock(),
    )
    await service.start()
    cluster = SimCluster(
        ["n1"],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.05,
    )
    cluster.start()
    await wait_until(lambda: bool(service.grpc.registry.session("n1")), what="agent")
    return service, cluster


async def actions_of(service: CollectorService) -> list[tuple[str, str, str]]:
    rows = await service.journal.do(lambda s: s.incidents.actions(node="n1"))
    return [(r.action, r.state, r.detail) for r in reversed(rows)]


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
                await asyncio.sleep(0.5)  # asked again, still busy: still waiting
                assert node.gpus[5].resets == 0
                assert len(service.dispatcher.waiting) == 1
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

    async def test_drain_first_drains_then_resets_when_idle(self, collector_config, tmp_path):
        """`reset_gpu: {drain_first: true}`: the node is drained (no new jobs) and the GPU is
        reset once the running job has left, never under it."""
        with WebhookReceiver(clock=SystemClock()) as hooks:
            acts = ActionsConfig(
                safety=SafetyConfig(reset_retry_s=0.2),
                drain_webhook=WebhookConfig(url=f"{hooks.url}/drain"),
            )
            rules = RULES.replace(
                "actions: [reset_gpu]", "actions: [{reset_gpu: {drain_first: true}}]"
            )
            service, cluster = await run(collector_config, tmp_path, acts, rules)
            try:
                node = cluster.nodes["n1"]
                node.gpus[1].processes = [77]
                node.nvlink_down(1, 4)
                await wait_until(lambda: len(hooks.deliveries()) == 1, what="drain")
                await asyncio.sleep(0.5)
                assert node.gpus[1].resets == 0  # the job still runs there
                node.gpus[1].processes = []
                await wait_until(lambda: node.gpus[1].resets == 1, what="reset")
                done = [a[:2] for a in await actions_of(service)]
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
                done = await actions_of(service)
                assert done[0][:2] == ("reset_gpu", "failed")
                assert "Unable to reset GPU" in done[0][2]
                assert done[1][:2] == ("escalated_drain_node", "succeeded")
            finally:
                await cluster.stop()
                await service.stop(grace=None)
