"""An escalation's drain arrives exactly once, whichever way the incident escalated, when the
collector is killed between the escalation and its actions.

As in ``test_action_crash.py``: the collector is a real process that SIGKILLs itself at one
journal step (``crashing_collector.py``), is started again on the same journal, and a real
receiver counts the signed webhooks. Three ways to escalate:

* ``at_once``: the fault (an NVLink down) fires, resolves and fires again within the
  escalation's window, so the second incident fires escalated; killed once that firing is
  journaled (with its drain, planned, in the same transaction), before the drain is sent. The
  link stays down, so the incident still fires however long the restart takes;
* ``recurred``: the fault comes back while the incident fires; killed once the escalation is
  journaled (its drain planned with it), before the drain is sent. The restarted collector's
  model has lost the 24 h history the rule reads, so the rule no longer holds: the drain runs
  all the same, as one a restart cut short;
* ``reset_failed``: the rule's GPU reset fails, which escalates at once; killed once the
  failure is journaled, before the drain it calls for is.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import pytest

from cli.dev.webhook_receiver import WebhookReceiver
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_for_more, wait_until
from tests.integration.crash_harness import NODE, died, journal, one_node, start, terminate
from tests.integration.reset_rules import RESET_RULES

if TYPE_CHECKING:
    from pathlib import Path

    from agent.sim.hardware import SimNode

pytestmark = pytest.mark.integration

SECRET = b"escalation-crash-secret"

RULES = {
    "at_once": """\
version: 1
rules:
  - name: link_seen_down
    scope: gpu
    when: 'gpu.nvlinks_down > 0'
    severity: critical
    actions: [notify]
    escalate: {after: 2, within: 1h, actions: [drain_node]}
""",
    "recurred": """\
version: 1
rules:
  - name: dbe_seen
    scope: gpu
    when: 'increase("ecc_dbe_aggregate_total", "24h") > 0.0'
    keep_firing_for: 1h
    severity: critical
    actions: [notify]
    escalate:
      after: 2
      within: 7d
      occurrences: 'gpu.signals.ecc_dbe_aggregate_total'
      actions: [drain_node]
""",
    "reset_failed": RESET_RULES,  # a reset that fails escalates at once
}
STEP = {"at_once": "escalated", "recurred": "escalated", "reset_failed": "reset_failed"}


def write_config(tmp_path: Path, port: int, receiver_url: str, rules: str) -> Path:
    secret = tmp_path / "webhook.secret"
    secret.write_bytes(SECRET + b"\n")
    rule_file = tmp_path / "rules.yaml"
    rule_file.write_text(rules)
    cfg = tmp_path / "collector.toml"
    cfg.write_text(
        f"""\
[collector]
listen = "127.0.0.1:{port}"
http = "127.0.0.1:0"
journal = "{tmp_path / "journal.db"}"
rules = ["{rule_file}"]
rules_interval = 0.2

[collector.actions]
max_drained_share = 1.0

[collector.actions.drain_webhook]
url = "{receiver_url}/drain"
secret_file = "{secret}"

[collector.actions.notify.default]
url = "{receiver_url}/notify"
secret_file = "{secret}"
"""
    )
    return cfg


async def cause(way: str, node: SimNode, receiver: WebhookReceiver, tmp_path: Path) -> None:
    """Make the node's GPU 0 escalate ``way``."""
    if way == "at_once":
        node.nvlink_down(0, 0)
        await wait_until(lambda: bool(receiver.deliveries()), 60, "the first notification")
        node.nvlink_up(0, 0)
        await wait_until(
            lambda: bool(journal(tmp_path, "SELECT 1 FROM incidents WHERE phase = 'resolved'")),
            60,
            "the first incident resolved",
        )
        node.nvlink_down(0, 0)
    elif way == "recurred":
        node.ecc_errors(0, dbe=1)
        await wait_until(lambda: bool(receiver.deliveries()), 60, "the first notification")
        node.ecc_errors(0, dbe=1)
    else:
        node.gpus[0].reset_fails = True
        node.nvlink_down(0, 0)


def later_fault(way: str, node: SimNode) -> None:
    """The same fault on the node's GPU 1, once: its rule acts on it without escalating (a
    reset there works)."""
    if way == "recurred":
        node.ecc_errors(1, dbe=1)
    else:
        node.nvlink_down(1, 0)


def later_fault_acted_on(tmp_path: Path) -> bool:
    """Whether an action for the later fault has been journaled as succeeded."""
    return bool(
        journal(
            tmp_path,
            "SELECT 1 FROM actions a JOIN incidents i ON i.id = a.incident_id "
            "WHERE i.target = ? AND a.state = 'succeeded'",
            f"{NODE}/gpu/1",
        )
    )


@pytest.mark.parametrize("way", list(RULES))
async def test_the_escalations_drain_arrives_once_after_a_crash(tmp_path: Path, way: str):
    receiver = WebhookReceiver(clock=SystemClock(), secret=SECRET)
    receiver.start()
    port, log = free_port(), tmp_path / "collector.log"
    cfg = write_config(tmp_path, port, receiver.url, RULES[way])
    procs = [start(STEP[way], cfg, log)]
    cluster = one_node(tmp_path, port)
    cluster.start()

    def drains() -> list[str]:
        hooks = receiver.deliveries()
        return [d.body["payload"]["node"] for d in hooks if d.body["kind"] == "drain_request"]

    try:
        agent = cluster.agents[NODE]
        await wait_until(lambda: agent.link.connected, 60, "the agent connected")
        # and has sent a report since: the value a counter rises from
        await wait_for_more(lambda: agent.polls, 2, what="two polls since")
        await cause(way, cluster.nodes[NODE], receiver, tmp_path)
        await wait_until(lambda: died(procs[0]), 60, f"the collector died at {STEP[way]}")
        assert procs[0].returncode == -signal.SIGKILL, log.read_text()[-2000:]
        assert drains() == []  # killed before the escalation's drain was sent
        streams = agent.link.connections
        procs.append(start(None, cfg, log))
        await wait_until(lambda: bool(drains()), 60, "the escalation's drain after the restart")
        drained = (
            "SELECT 1 FROM actions WHERE action = 'escalated_drain_node' AND state = 'succeeded'"
        )
        await wait_until(
            lambda: bool(journal(tmp_path, drained)), 30, "the drain's outcome journaled"
        )
        # The restarted collector's ticks go on: nothing may be handed on a second time. Once
        # they have acted on a later fault too, they are well past what its start handed on.
        # The fault comes once the agent streams to it again and has sent a report since.
        await wait_until(
            lambda: agent.link.connected and agent.link.connections > streams,
            60,
            "the agent connected to the restarted collector",
        )
        await wait_for_more(lambda: agent.polls, 2, what="two polls since")
        later_fault(way, cluster.nodes[NODE])
        await wait_until(lambda: later_fault_acted_on(tmp_path), 30, "the later fault acted on")
    finally:
        await cluster.stop()
        terminate(procs)
        receiver.stop()

    assert drains() == [NODE]
    escalated = journal(
        tmp_path, "SELECT action, state FROM actions WHERE action LIKE 'escalated_%' ORDER BY id"
    )
    assert escalated == [("escalated_drain_node", "succeeded")], escalated
    notes = [
        d
        for d in receiver.deliveries()
        if d.body["kind"] == "notification" and d.body["payload"]["target"] == f"{NODE}/gpu/0"
    ]
    assert len(notes) == (0 if way == "reset_failed" else 1), notes  # the rule's own, once
