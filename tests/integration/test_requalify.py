"""Re-qualification: a node that comes back runs pre-flight before it takes work again.

A real collector ([collector] requalify = "quick", the default), simulated nodes whose agents
answer pre-flight from their simulated NVML and sysfs, real signed webhooks and the CLI.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from cli.main import main
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import actions, start

if TYPE_CHECKING:
    from pathlib import Path

    from cli.dev.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.integration

RULES = """\
version: 1
rules:
  - name: port_down
    scope: ib_port
    when: 'port.state != "" && port.state != "ACTIVE"'
    severity: critical
    actions: [drain_node]
  - name: lost_gpu
    scope: gpu
    when: '!gpu.present || events("gpu_lost", "10m") > 0'
    severity: critical
    actions: [drain_node]
"""


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_a_repaired_node_is_released_only_when_pre_flight_passes(
    collector_config, receiver: WebhookReceiver, tmp_path: Path, capsys
):
    """node-1's port went down and came back: repaired, it re-qualifies, passes and is released.
    node-2's GPU is still lost: repaired, its run does not pass (NVML fails on the node) and it
    is drained again, with the run named; fleetwatch still holds its drain."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    acts = actions(receiver, tmp_path, max_drained_share=1.0)
    service, cluster = await start(collector_config, tmp_path, acts, rules=(rules,))
    url = f"--api=http://127.0.0.1:{service.http_port}"
    life = service.lifecycle
    try:
        cluster.nodes["node-1"].ib_port_down(0)
        cluster.nodes["node-2"].xid(3, 79)
        await wait_until(
            lambda: life.state("node-1") == life.state("node-2") == "drained", what="two drains"
        )
        cluster.nodes["node-1"].ib_port_up(0)
        code, out, err = await cli(capsys, "lifecycle", "node-1", "repaired", url)
        assert (code, out.strip()) == (0, "node-1: re-qualifying (was drained)"), err
        code, out, _ = await cli(capsys, "lifecycle", "node-2", "repaired", url)
        assert (code, out.strip()) == (0, "node-2: re-qualifying (was drained)")
        await wait_until(lambda: life.state("node-1") == "in_service", what="node-1 re-qualified")
        await wait_until(lambda: life.state("node-2") == "drained", what="node-2 failed")
        assert "node-1" not in service.dispatcher.drained  # released
        assert "node-2" in service.dispatcher.drained  # still held
        await life.idle()
        moves = await service.journal.do(lambda s: s.lifecycle.history("node-1"))
        # Released by its run; if the port's incident had not resolved yet, it is suspect for a
        # moment after, and back in service once it does.
        (back,) = [m for m in moves if m.actor.startswith("preflight:")]
        assert (back.previous, back.state) == ("requalifying", "in_service")
        assert back.reason.startswith("re-qualified: pre-flight quick run ")
        failed = life.row("node-2")
        assert failed is not None
        assert failed.actor.startswith("preflight:")
        assert failed.reason.startswith("re-qualification failed: pre-flight quick run ")
        # A GPU off the bus makes NVML fail on the node: the checks could not run, and that is
        # no pass either.
        assert "could_not_run" in failed.reason or " fail" in failed.reason, failed.reason
        run_id = failed.actor.removeprefix("preflight:")
        code, out, _ = await cli(capsys, "preflight", "show", run_id, url)
        assert code in (1, 2)  # the run's own verdict: fail, or could not run
        assert "node-2" in out
    finally:
        await cluster.stop()
        await service.stop(grace=None)


async def test_a_node_in_repair_that_boots_again_re_qualifies(
    collector_config, receiver: WebhookReceiver, tmp_path: Path, capsys
):
    """A person takes node-1 into repair; it comes back with a new boot id (rebooted): it
    re-qualifies on its own and goes back in service. A node in service that restarts its
    agent (same boot) is left alone."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    service, cluster = await start(collector_config, tmp_path, actions(receiver, tmp_path))
    url = f"--api=http://127.0.0.1:{service.http_port}"
    life = service.lifecycle
    try:
        code, _, _ = await cli(capsys, "lifecycle", "node-1", "repair", "--reason=BIOS", url)
        assert code == 0
        cluster.nodes["node-1"].boot_id = "5d2e8a9c-0000-4000-8000-00000000b007"
        await cluster.restart("node-1")
        await cluster.restart("node-3")  # same boot: an agent restart, not a reboot
        await wait_until(lambda: life.state("node-1") == "in_service", what="node-1 re-qualified")
        await service.lifecycle.idle()
        rows = await service.journal.do(lambda s: s.lifecycle.history("node-1"))
        assert [(r.state, r.actor.split(":")[0]) for r in rows] == [
            ("in_repair", "person"),
            ("requalifying", "agent"),
            ("in_service", "preflight"),
        ]
        assert "booted again" in rows[1].reason
        assert life.row("node-3") is None  # never moved
    finally:
        await cluster.stop()
        await service.stop(grace=None)
