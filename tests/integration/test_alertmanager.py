"""A real Alertmanager (Debian's prometheus-alertmanager) takes fleetwatch's incidents as alerts.

An incident fires: its alert shows in Alertmanager's API, active, with the incident's labels; a
silence made in Alertmanager suppresses it there; the incident resolves: the alert leaves the
list at once (the resend interval is long, so it is the resolved send that ends it, not its
endsAt). A second Alertmanager that does not answer stops none of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent.sim.cluster import SimCluster
from collector.actions.alertmanager_config import AlertmanagerConfig
from collector.actions.alertmanager_http import AlertmanagerEndpoint
from collector.main import CollectorService
from collector.reload import ConfigSource
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "alertmanager"
RULES = """\
version: 1
rules:
  - name: gpu_too_hot
    scope: gpu
    when: 'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 90.0'
    severity: critical
    description: The GPU runs hotter than 90 C.
    runbook: https://runbooks.example/gpu_too_hot
    labels: {component: gpu, team: hw}
    actions: []
  - name: gpu_warm
    scope: gpu
    when: 'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 80.0'
    severity: info
    actions: []
"""
AM_CONFIG = """\
route:
  receiver: "null"
  group_by: [alertname, node]
  group_wait: 1s
receivers:
  - name: "null"
"""


def binary(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is missing: scripts/ensure-test-deps.sh installs it"
    return found


class Alertmanager:
    """Alertmanager's API on loopback."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def call(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - a loopback URL we build
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
            text = answer.read()
        return json.loads(text) if text else None

    async def alerts(self, **params: str) -> list[dict[str, Any]]:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        try:
            return list(await asyncio.to_thread(self.call, "GET", f"/api/v2/alerts?{query}"))
        except OSError:
            return []  # not up yet

    async def ours(self) -> list[dict[str, Any]]:
        return [a for a in await self.alerts() if a["labels"]["alertname"] == "gpu_too_hot"]


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    """Alertmanager 0.25 on a free loopback port, no gossip, its state in tmp_path."""
    port = free_port()
    (tmp_path / "alertmanager.yml").write_text(AM_CONFIG)
    log = (tmp_path / "alertmanager.log").open("w")
    server = subprocess.Popen(
        [
            binary("prometheus-alertmanager"),
            f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'alertmanager'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        yield Alertmanager(port)
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


async def ready(am: Alertmanager) -> bool:
    def get() -> int:
        with urllib.request.urlopen(f"{am.url}/-/ready", timeout=5) as answer:  # noqa: S310
            return int(answer.status)

    try:
        return await asyncio.to_thread(get) == 200
    except OSError:
        return False


async def test_an_incident_fires_is_silenced_in_alertmanager_and_resolves(
    collector_config, alertmanager: Alertmanager, tmp_path: Path
):
    """The alert carries the incident's labels and is active; an Alertmanager silence makes it
    suppressed; the resolution takes it out of the list at once. The info rule that fires too
    is never sent, and a dead second Alertmanager only counts failures."""
    await wait_until(lambda: ready(alertmanager), what="Alertmanager ready")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = collector_config(
        rules=(rules,),
        alertmanager=AlertmanagerConfig(
            urls=(dead, alertmanager.url),
            resend_interval_s=30.0,  # the resolution must not wait for it (nor for endsAt)
            labels={"cluster": "test"},
            external_url="http://fleetwatch.example:9470",
            timeout_s=2.0,
        ),
    )
    service = CollectorService(cfg, SystemClock())
    await service.start()
    cluster = SimCluster(
        ["n1"],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.1,
    )
    cluster.start()
    try:
        await wait_until(
            lambda: "n1" in service.fleet.view() and service.fleet.view()["n1"].reported,
            what="the first Report",
        )
        cluster.nodes["n1"].thermal(3, 95)

        async def active() -> bool:
            return [a["status"]["state"] for a in await alertmanager.ours()] == ["active"]

        await wait_until(active, what="the alert active in Alertmanager")
        [alert] = await alertmanager.ours()
        incident = next(
            i for i in service.evaluator.engine.open_incidents() if i.rule == "gpu_too_hot"
        )
        assert alert["labels"] == {
            "alertname": "gpu_too_hot",
            "severity": "critical",
            "scope": "gpu",
            "node": "n1",
            "target": "n1/gpu/3",
            "gpu": "3",
            "component": "gpu",
            "team": "hw",
            "cluster": "test",
        }
        assert alert["annotations"]["runbook_url"] == "https://runbooks.example/gpu_too_hot"
        assert alert["annotations"]["description"] == "The GPU runs hotter than 90 C."
        assert alert["annotations"]["fleetwatch_incident"] == incident.id
        assert alert["generatorURL"].startswith("http://fleetwatch.example:9470/api/v1/incidents?")
        assert "gpu_warm" not in {a["labels"]["alertname"] for a in await alertmanager.alerts()}

        now = datetime.now(UTC)
        silence = await asyncio.to_thread(
            alertmanager.call,
            "POST",
            "/api/v2/silences",
            {
                "matchers": [
                    {"name": "alertname", "value": "gpu_too_hot", "isRegex": False},
                    {"name": "node", "value": "n1", "isRegex": False},
                ],
                "startsAt": now.isoformat(),
                "endsAt": (now + timedelta(hours=1)).isoformat(),
                "createdBy": "test",
                "comment": "GPU 3 of n1 is being looked at",
            },
        )

        async def suppressed() -> bool:
            states = [a["status"] for a in await alertmanager.ours()]
            return [(s["state"], s["silencedBy"]) for s in states] == [
                ("suppressed", [silence["silenceID"]])
            ]

        await wait_until(suppressed, what="the alert suppressed by Alertmanager's silence")

        cluster.nodes["n1"].thermal(3, None)
        await wait_until(
            lambda: (
                not any(i.rule == "gpu_too_hot" for i in service.evaluator.engine.open_incidents())
            ),
            what="the incident resolved",
        )

        async def gone() -> bool:
            return not await alertmanager.ours()

        await wait_until(gone, timeout=5, what="the alert resolved in Alertmanager")
        assert service.alertmanager.failures[dead] >= 1
        assert service.alertmanager.failures[alertmanager.url] == 0
        assert service.alertmanager.sent[alertmanager.url] >= 2  # firing, then resolved
    finally:
        await cluster.stop()
        await service.stop(grace=None)


async def test_a_reload_turns_it_on_and_a_restart_carries_the_alert_on(
    alertmanager: Alertmanager, tmp_path: Path
):
    """An incident that fired while the table was absent goes out once a reload adds it; a
    collector restarted on the same journal sends it again with its first startsAt, and
    Alertmanager keeps one alert."""
    await wait_until(lambda: ready(alertmanager), what="Alertmanager ready")
    rules = tmp_path / "site.yaml"
    rules.write_text(
        "version: 1\nrules:\n  - name: fleet_empty\n    scope: fleet\n"
        "    when: 'fleet.nodes == 0'\n    severity: warning\n"
    )
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

    async def fleet_alerts() -> list[dict[str, Any]]:
        return [a for a in await alertmanager.alerts() if a["labels"]["alertname"] == "fleet_empty"]

    try:
        await wait_until(
            lambda: any(i.rule == "fleet_empty" for i in service.evaluator.engine.open_incidents()),
            what="the incident",
        )
        config.write_text(
            config.read_text()
            + f'[collector.alertmanager]\nurls = ["{alertmanager.url}"]\nresend_interval = 30\n'
        )
        assert service.reload(source)

        async def sent() -> bool:
            return bool(await fleet_alerts())

        await wait_until(sent, what="the alert in Alertmanager")
    finally:
        await service.stop(grace=None)
    [before] = await fleet_alerts()
    assert before["labels"] == {
        "alertname": "fleet_empty",
        "severity": "warning",
        "scope": "fleet",
        "target": "fleet",
    }
    again = CollectorService(source.load(), SystemClock())
    await again.start()
    try:
        await wait_until(lambda: again.alertmanager.sent[alertmanager.url] >= 1, what="a send")
        [after] = await fleet_alerts()
        assert (after["startsAt"], after["status"]["state"]) == (before["startsAt"], "active")
        assert after["updatedAt"] != before["updatedAt"]  # sent again, not only kept
    finally:
        await again.stop(grace=None)


def test_the_deploy_example_passes_amtool():
    """deploy/alertmanager/alertmanager.yml is a configuration Alertmanager takes."""
    done = subprocess.run(
        [binary("amtool"), "check-config", str(DEPLOY / "alertmanager.yml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout + done.stderr


class _Refusing(http.server.BaseHTTPRequestHandler):
    """Answers every POST with 400 and a long body, or (on /slow) never."""

    hold = threading.Event()

    def do_POST(self) -> None:
        if self.path.startswith("/slow"):
            self.hold.wait(10)
            return
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b"invalid label set: " + b"x" * 5000
        self.send_response(400)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - its signature
        pass


@pytest.fixture
def refusing() -> Iterator[str]:
    _Refusing.hold = threading.Event()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        _Refusing.hold.set()
        server.shutdown()
        server.server_close()
        with contextlib.suppress(RuntimeError):
            thread.join(5)


class TestEndpoint:
    def test_a_refusal_gives_its_status_and_a_bounded_body(self, refusing: str):
        """A non-2xx answer is the status and the first 200 characters of its body."""
        error = AlertmanagerEndpoint(refusing, timeout_s=2.0).post(b"[]")
        assert error is not None
        assert error.startswith("HTTP 400 Bad Request: invalid label set: xxx")
        assert len(error) <= len("HTTP 400 Bad Request: ") + 200

    def test_no_answer_within_the_timeout(self, refusing: str):
        """A server that never answers costs the timeout, then is an error."""
        error = AlertmanagerEndpoint(f"{refusing}/slow", timeout_s=0.3).post(b"[]")
        assert error is not None
        assert "TimeoutError" in error or "timed out" in error

    def test_nothing_listening(self):
        """A closed port is an error at once."""
        error = AlertmanagerEndpoint(f"http://127.0.0.1:{free_port()}", timeout_s=2.0).post(b"[]")
        assert error is not None
        assert "ConnectionRefusedError" in error
