"""SIGHUP to the real daemons, as `systemctl reload` sends it: a stand-in notify socket tells
when each reload is done (RELOADING=1, then READY=1)."""

import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.testing import free_port
from tests.notify_socket import Notification, NotifySocket

pytestmark = pytest.mark.e2e

FLEETWATCH = [sys.executable, "-m", "cli.main"]
UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
RULES = """\
version: 1
rules:
  - name: fleet_empty
    scope: fleet
    when: 'fleet.nodes == 0'
    severity: info
"""
NEW_RULE = """\
  - name: fleet_small
    scope: fleet
    when: 'fleet.nodes < 5'
"""


def start(args: list[str], address: str) -> subprocess.Popen[str]:
    env = {**os.environ, "NOTIFY_SOCKET": address}
    return subprocess.Popen([*FLEETWATCH, *args], env=env, stderr=subprocess.PIPE, text=True)


def reload(proc: subprocess.Popen[str], notify: NotifySocket, count: int) -> Notification:
    """Send SIGHUP; return the READY=1 that ends reload number ``count``."""
    proc.send_signal(signal.SIGHUP)
    [reloading] = notify.wait_for("RELOADING=1", count=count, timeout=30)[count - 1 :]
    assert reloading.get("MONOTONIC_USEC")
    [ready] = notify.wait_for("READY=1", after=reloading.at, timeout=30)
    return ready


def stop(proc: subprocess.Popen[str]) -> list[dict[str, object]]:
    """SIGTERM; the daemon's JSON log lines."""
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0, err
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def rules_in(m: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> set[str]:
    return {dict(k)["rule"] for n, k in m if n == "fleetwatch_rule_evaluation_errors_total"}


def test_the_units_reload_with_sighup():
    """`systemctl reload` sends SIGHUP to the daemon's main process."""
    for kind in ("agent", "collector"):
        text = (UNITS / f"fleetwatch-{kind}.service").read_text()
        assert "\nExecReload=/bin/kill -HUP $MAINPID\n" in text, kind


def test_collector_reloads_rules_and_keeps_them_when_a_file_is_bad(tmp_path: Path):
    """A new rule shows in /metrics after SIGHUP; then a rule with bad CEL changes nothing: the
    old rules stay, the reload metrics say it failed, systemctl status says why, and one log
    line names the file and its line."""
    http = free_port()
    rules = tmp_path / "site.yaml"
    rules.write_text(RULES)
    config = tmp_path / "collector.toml"
    config.write_text(
        f'[collector]\nlisten = "127.0.0.1:{free_port()}"\nhttp = "127.0.0.1:{http}"\n'
        f'journal = "{tmp_path / "journal.db"}"\nrules = ["{rules}"]\n'
    )
    address = f"@fleetwatch-test-{uuid.uuid4().hex}"
    with NotifySocket(address) as notify:
        proc = start(["collector", "--config", str(config)], address)
        try:
            notify.wait_for("READY=1", timeout=60)
            assert rules_in(scrape(http)) == {"fleet_empty"}

            rules.write_text(RULES + NEW_RULE)
            ready = reload(proc, notify, 1)
            assert "last reload failed" not in (ready.get("STATUS") or "")
            m = scrape(http)
            assert rules_in(m) == {"fleet_empty", "fleet_small"}
            assert m["fleetwatch_config_last_reload_successful", ()] == 1.0

            rules.write_text(RULES + NEW_RULE.replace("< 5'", "<'"))
            ready = reload(proc, notify, 2)
            status = ready.get("STATUS") or ""
            assert f"last reload failed, running the files before: {rules}:9:" in status
            m = scrape(http)
            assert rules_in(m) == {"fleet_empty", "fleet_small"}
            assert m["fleetwatch_config_last_reload_successful", ()] == 0.0
            assert m["fleetwatch_config_reloads_total", (("result", "failure"),)] == 1.0
            assert m["fleetwatch_config_reloads_total", (("result", "success"),)] == 1.0
        finally:
            logs = stop(proc)
    [failed] = [e for e in logs if e["event"] == "config_reload_failed"]
    assert (failed["file"], failed["line"], failed["level"]) == (str(rules), 9, "error")
    assert "rule fleet_small: bad condition" in str(failed["error"])


def test_agent_reloads_its_interval_and_keeps_it_when_the_file_is_bad(tmp_path: Path):
    """`fleetwatch agent --simulate`: a new poll interval shows in systemctl status after
    SIGHUP and a new log level applies at once; a bad value changes nothing and is logged with
    its line; a new node name waits for a restart, with a warning."""
    config = tmp_path / "agent.toml"
    good = (
        f'[agent]\nnode = "gpu-node-9"\ncollector = "127.0.0.1:{free_port()}"\n'
        'job_socket = ""\npoll_interval = 5\n'
    )
    config.write_text(good + 'log_level = "warning"\n')
    address = f"@fleetwatch-test-{uuid.uuid4().hex}"
    with NotifySocket(address) as notify:
        proc = start(["agent", "--simulate", "--config", str(config)], address)
        try:
            [ready] = notify.wait_for("READY=1", timeout=60)
            assert (ready.get("STATUS") or "").endswith("every 5 s")

            config.write_text(good.replace("= 5", "= 2").replace("node-9", "node-10"))
            ready = reload(proc, notify, 1)
            assert ready.get("STATUS") == "polling 8 GPUs and 8 IB ports every 2 s"

            config.write_text(good.replace("= 5", "= 1") + "heartbeat_interval = -1\n")
            ready = reload(proc, notify, 2)
            status = ready.get("STATUS") or ""
            assert status.startswith("polling 8 GPUs and 8 IB ports every 2 s; last reload")
            assert f"{config}:6: " in status
        finally:
            logs = stop(proc)
    [restart] = [e for e in logs if e["event"] == "config_reload_needs_restart"]
    assert (restart["key"], restart["running"], restart["configured"]) == (
        "node",
        "'gpu-node-9'",
        "'gpu-node-10'",
    )
    [failed] = [e for e in logs if e["event"] == "config_reload_failed"]
    assert (failed["file"], failed["line"]) == (str(config), 6)
    assert "heartbeat_interval" in str(failed["error"])
    events = [e["event"] for e in logs]
    assert "agent_started" not in events  # info, while the file said warning
    assert "config_reloaded" in events  # info, once the reloaded file no longer did
