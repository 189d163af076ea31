"""Reloading a running collector (and an agent) in process: real gRPC, HTTP, SQLite, webhooks."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from agent.config import load_agent_config
from agent.reload import FAILURES_SIGNAL, OK_SIGNAL, AgentReloader
from agent.sim.cluster import SimCluster
from cli.dev.webhook_receiver import WebhookReceiver
from collector.main import CollectorService
from collector.reload import ConfigSource
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = pytest.mark.integration

RULES = """\
version: 1
rules:
  - name: fleet_empty
    scope: fleet
    when: 'fleet.nodes == 0'
    severity: info
"""
MORE_RULES = (
    RULES
    + """\
  - name: fleet_small
    scope: fleet
    when: 'fleet.nodes < 5'
    severity: warning
    actions: [{notify: {channel: default}}]
"""
)


def metrics(service: CollectorService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://127.0.0.1:{service.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def rules_in(m: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> set[str]:
    return {
        dict(labels)["rule"]
        for name, labels in m
        if name == "fleetwatch_rule_evaluation_errors_total"
    }


@pytest.fixture
async def collector_files(tmp_path: Path) -> AsyncIterator[tuple[CollectorService, ConfigSource]]:
    rules = tmp_path / "site.yaml"
    rules.write_text(RULES)
    config = tmp_path / "collector.toml"
    config.write_text(
        "[collector]\n"
        'listen = "127.0.0.1:0"\n'
        'http = "127.0.0.1:0"\n'
        f'journal = "{tmp_path / "journal.db"}"\n'
        f'rules = ["{rules}"]\n'
        "rules_interval = 0.05\n"
    )
    source = ConfigSource(config, {})
    service = CollectorService(source.load(), SystemClock())
    await service.start()
    try:
        yield service, source
    finally:
        await service.stop(grace=None)


def firing(service: CollectorService) -> dict[str, str]:
    return {i.rule: i.id for i in service.evaluator.engine.open_incidents()}


async def test_a_valid_reload_brings_new_rules_and_channels(collector_files, tmp_path: Path):
    """New rule file and a notify channel: the new rule is evaluated and exported, its firing
    notifies the new channel, and the incident that was already firing goes on (same id, not
    fired again)."""
    service, source = collector_files
    await wait_until(lambda: "fleet_empty" in firing(service), what="first incident")
    before = firing(service)["fleet_empty"]
    m = await asyncio.to_thread(metrics, service)
    assert rules_in(m) == {"fleet_empty"}
    with WebhookReceiver(clock=SystemClock()) as hooks:
        (tmp_path / "site.yaml").write_text(MORE_RULES)
        config = source.path
        assert config is not None
        config.write_text(
            config.read_text() + f'\n[collector.actions.notify.default]\nurl = "{hooks.url}/h"\n'
        )
        with capture_logs() as logs:
            assert service.reload(source)
        await wait_until(lambda: bool(hooks.deliveries()), what="notification", timeout=10)
        [delivery] = hooks.deliveries()
    assert delivery.body["kind"] == "notification"
    assert delivery.body["payload"]["rule"] == "fleet_small"
    assert firing(service)["fleet_empty"] == before
    [done] = [e for e in logs if e["event"] == "config_reloaded"]
    assert (done["rules_added"], done["changed"]) == (["fleet_small"], ["actions"])
    m = await asyncio.to_thread(metrics, service)
    assert rules_in(m) == {"fleet_empty", "fleet_small"}
    assert m["fleetwatch_config_last_reload_successful", ()] == 1.0
    assert m["fleetwatch_config_reloads_total", (("result", "success"),)] == 1.0


async def test_an_invalid_reload_keeps_the_last_good_files(collector_files, tmp_path: Path):
    """Bad CEL in one rule: nothing changes, one error names the file and the line, the
    metrics show it; a fixed file then goes in."""
    service, source = collector_files
    rules = tmp_path / "site.yaml"
    evaluator = service.evaluator
    started = (await asyncio.to_thread(metrics, service))[
        "fleetwatch_config_last_reload_success_timestamp_seconds", ()
    ]
    rules.write_text(MORE_RULES.replace("'fleet.nodes < 5'", "'fleet.nodes <'"))
    with capture_logs() as logs:
        assert not service.reload(source)
    [failed] = [e for e in logs if e["event"] == "config_reload_failed"]
    assert (failed["file"], failed["line"], failed["log_level"]) == (str(rules), 9, "error")
    assert failed["error"].startswith(f"{rules}:9: rule fleet_small: bad condition:")
    assert "\n" not in failed["error"]
    assert service.evaluator is evaluator
    m = await asyncio.to_thread(metrics, service)
    assert rules_in(m) == {"fleet_empty"}
    assert m["fleetwatch_config_last_reload_successful", ()] == 0.0
    assert m["fleetwatch_config_reloads_total", (("result", "failure"),)] == 1.0
    assert m["fleetwatch_config_last_reload_success_timestamp_seconds", ()] == started

    rules.write_text(MORE_RULES)
    assert service.reload(source)
    m = await asyncio.to_thread(metrics, service)
    assert m["fleetwatch_config_last_reload_successful", ()] == 1.0
    assert m["fleetwatch_config_last_reload_success_timestamp_seconds", ()] >= started
    assert rules_in(m) == {"fleet_empty", "fleet_small"}


async def test_restart_only_keys_are_warned_and_kept(collector_files):
    """A new HTTP address and journal wait for a restart: each is named, the API stays where
    it is, and the live keys of the same file go in."""
    service, source = collector_files
    config = source.path
    assert config is not None
    port = service.http_port
    config.write_text(
        config.read_text()
        .replace('http = "127.0.0.1:0"', 'http = "127.0.0.1:1"')
        .replace("journal.db", "other.db")
        .replace("rules_interval = 0.05", "rules_interval = 0.2\nmissed_heartbeats = 7")
    )
    with capture_logs() as logs:
        assert service.reload(source)
    warned = {e["key"]: e for e in logs if e["event"] == "config_reload_needs_restart"}
    assert sorted(warned) == ["http", "journal"]
    assert (warned["http"]["running"], warned["http"]["configured"]) == (
        "'127.0.0.1:0'",
        "'127.0.0.1:1'",
    )
    assert (service.cfg.http, service.http_port) == ("127.0.0.1:0", port)
    assert (service.incidents.interval_s, service.liveness.missed) == (0.2, 7)
    assert (await asyncio.to_thread(metrics, service))[
        "fleetwatch_config_last_reload_successful", ()
    ] == 1.0


async def test_an_agents_failed_reload_reaches_the_collector(collector, tmp_path: Path):
    """An agent that refuses a bad file reports it with its node samples; the collector holds
    them for the node, and a good file puts them back."""
    cluster = SimCluster(
        ["gpu-1"],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{collector.grpc_port}",
        poll_interval=0.05,
        heartbeat_interval=0.2,
    )
    agent = cluster.agents["gpu-1"]
    path = tmp_path / "agent.toml"
    good = f'[agent]\nnode = "gpu-1"\ncollector = "127.0.0.1:{collector.grpc_port}"\n'
    path.write_text(good)
    reloader = AgentReloader(
        cfg=cluster.configs["gpu-1"],
        load=lambda: load_agent_config(path, {}),
        path=path,
        intervals=agent.intervals,
        live=agent.live,
        clock=SystemClock(),
    )
    cluster.start()
    try:

        def signals() -> tuple[object, object]:
            node = collector.fleet.snapshot().get("gpu-1")
            got = node.signals if node is not None else {}
            return got.get(OK_SIGNAL), got.get(FAILURES_SIGNAL)

        await wait_until(lambda: signals() == (1, 0), what="reload samples")
        path.write_text(good + "poll_interval = 0\n")
        assert not reloader.reload()
        await wait_until(lambda: signals() == (0, 1), what="failed reload reported")
        path.write_text(good)
        assert reloader.reload()
        await wait_until(lambda: signals() == (1, 1), what="good reload reported")
    finally:
        await cluster.stop()
