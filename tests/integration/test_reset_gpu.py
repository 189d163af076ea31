"""reset_gpu from a rule to the agent and back, over the real stream."""

from pathlib import Path
from typing import Any

import pytest

from agent.sim.cluster import SimCluster
from collector.actions.config import ActionsConfig, WebhookConfig
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
    collector_config: Any, tmp_path: Path, acts: ActionsConfig
) -> tuple[CollectorService, SimCluster]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
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

    async def test_busy_gpu_is_refused_and_the_failure_escalates(self, collector_config, tmp_path):
        """The agent will not reset a GPU in use; the failed reset escalates to a drain."""
        with WebhookReceiver(clock=SystemClock()) as hooks:
            acts = ActionsConfig(drain_webhook=WebhookConfig(url=f"{hooks.url}/drain"))
            service, cluster = await run(collector_config, tmp_path, acts)
            try:
                node = cluster.nodes["n1"]
                node.gpus[5].processes = [4242, 4243]
                node.nvlink_down(5, 0)
                await wait_until(lambda: len(hooks.deliveries()) == 1, what="drain")
                done = await actions_of(service)
                assert done[0][:2] == ("reset_gpu", "failed")
                assert "GPU 5 is busy: 2 compute processes (4242, 4243)" in done[0][2]
                assert done[1][:2] == ("escalated_drain_node", "succeeded")
                assert node.gpus[5].resets == 0
                assert hooks.deliveries()[0].body["payload"]["node"] == "n1"
            finally:
                await cluster.stop()
                await service.stop(grace=None)
