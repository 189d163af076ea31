"""A fault's notification arrives exactly once, whichever step the collector is killed at.

The collector is a real process, killed with SIGKILL at one step between "the event is
journaled" and "the webhook's answer is journaled" (``crashing_collector.py`` ends itself at the
journal's steps, the receiver below ends it while holding the request), then started again on the
same journal, as systemd would. The agent (in this process) reconnects and resends what was not
acked. Whatever the step, the receiver must end up with exactly one notification for the fault
(redeliveries with the same idempotency key are allowed: receivers de-duplicate them), and the
journal with one incident and its notify action answered.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sqlite3
from typing import TYPE_CHECKING, Any

import pytest

from cli.dev.webhook_receiver import WebhookReceiver
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until
from tests.integration.crash_harness import NODE, died, journal, one_node, start, terminate

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

pytestmark = pytest.mark.integration

SECRET = b"crash-test-secret"
RULE = "xid_application_error"


class KillingReceiver(WebhookReceiver):
    """A receiver that SIGKILLs the collector on the first notification: before it is
    recorded (``received``) or after it is recorded and before the answer goes back
    (``recorded``)."""

    def __init__(self, step: str) -> None:
        super().__init__(clock=SystemClock(), secret=SECRET)
        self.step = step
        self.victim: subprocess.Popen[bytes] | None = None

    def _kill(self) -> None:
        victim, self.victim = self.victim, None
        if victim is not None:
            victim.send_signal(signal.SIGKILL)
            victim.wait()

    def _decide(self, path: str, headers: dict[str, str], body: bytes, received_at: float) -> Any:
        if self.step == "received" and path.endswith("/notify"):
            self._kill()
        answer = super()._decide(path, headers, body, received_at)
        if self.step == "recorded" and path.endswith("/notify"):
            self._kill()
        return answer


def write_config(tmp_path: Path, port: int, receiver_url: str) -> Path:
    secret = tmp_path / "webhook.secret"
    secret.write_bytes(SECRET + b"\n")
    cfg = tmp_path / "collector.toml"
    cfg.write_text(
        f"""\
[collector]
listen = "127.0.0.1:{port}"
http = "127.0.0.1:0"
journal = "{tmp_path / "journal.db"}"
rules_interval = 0.2

[collector.actions.notify.default]
url = "{receiver_url}/notify"
secret_file = "{secret}"
"""
    )
    return cfg


def notify_answered(tmp_path: Path) -> bool:
    with contextlib.suppress(sqlite3.Error):
        return bool(
            journal(
                tmp_path,
                "SELECT 1 FROM actions a JOIN incidents i ON i.id = a.incident_id "
                "WHERE a.action = 'notify' AND a.state = 'succeeded' AND i.rule = ?",
                RULE,
            )
        )
    return False


@pytest.mark.parametrize(
    "steps",
    [
        "event",
        "incident",
        "action",
        "received",
        "recorded",
        "answered",
        "outcome",
        "action,deferred",
        "recorded,deferred",
    ],
)
async def test_notification_arrives_once_whatever_step_the_collector_dies_at(
    tmp_path: Path, steps: str
):
    """``a,b``: killed at ``a``, then the restarted collector killed at ``b``."""
    step, *then = steps.split(",")
    receiver = KillingReceiver(step)
    receiver.start()
    port, log = free_port(), tmp_path / "collector.log"
    cfg = write_config(tmp_path, port, receiver.url)
    at_journal = step not in ("received", "recorded")
    proc = start(step if at_journal else None, cfg, log)
    receiver.victim = proc
    cluster = one_node(tmp_path, port)
    cluster.start()
    procs = [proc]
    try:
        agent = cluster.agents[NODE]
        await wait_until(lambda: agent.link.connected, 60, "the agent connected")
        cluster.nodes[NODE].xid(0, 13, "crash-test fault")
        await wait_until(functools.partial(died, proc), 60, f"the collector died at {step}")
        assert proc.returncode == -signal.SIGKILL, log.read_text()[-2000:]

        for later in then:
            middle = start(later, cfg, log)
            procs.append(middle)
            await wait_until(functools.partial(died, middle), 60, f"died at {later}")
            assert middle.returncode == -signal.SIGKILL, log.read_text()[-2000:]
        procs.append(start(None, cfg, log))
        await wait_until(lambda: notify_answered(tmp_path), 60, "the notification answered")
        # A second fault after the restart: once its notification is answered too, the
        # restarted collector has long been past what its start handed on again.
        cluster.nodes[NODE].xid(1, 13, "crash-test later fault")
        await wait_until(lambda: len(receiver.deliveries()) >= 2, 60, "the second notification")
    finally:
        await cluster.stop()
        receiver.victim = None
        terminate(procs)
        receiver.stop()

    notes = [d.body["payload"] for d in receiver.deliveries() if d.body["kind"] == "notification"]
    first = [n for n in notes if n["target"] == f"{NODE}/gpu/0"]
    assert len(first) == 1, (step, notes, receiver.duplicates)
    assert first[0]["rule"] == RULE
    incidents = journal(
        tmp_path, "SELECT id FROM incidents WHERE rule = ? AND target = ?", RULE, f"{NODE}/gpu/0"
    )
    assert [i for (i,) in incidents] == [first[0]["incident"]]
    states = journal(tmp_path, "SELECT state FROM actions WHERE incident_id = ?", incidents[0][0])
    assert states == [("succeeded",)], states
