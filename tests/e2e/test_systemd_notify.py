"""The daemons under systemd's notify protocol: a real process, a stand-in notify socket."""

import itertools
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fleetwatch.testing import free_port
from tests.notify_socket import NotifySocket

pytestmark = pytest.mark.e2e

FLEETWATCH = [sys.executable, "-m", "cli.main"]


def notify_env(address: str, watchdog_usec: int) -> dict[str, str]:
    return {**os.environ, "NOTIFY_SOCKET": address, "WATCHDOG_USEC": str(watchdog_usec)}


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    return proc.communicate(timeout=30)[1]


def test_collector_is_ready_once_it_listens_and_pings_the_watchdog(tmp_path: Path):
    """`fleetwatch collector` under Type=notify: READY=1 comes from the main process when gRPC
    and HTTP already accept connections, WATCHDOG=1 keeps coming every WATCHDOG_USEC / 2, and
    SIGTERM sends STOPPING=1 before a clean exit."""
    grpc_port, http_port = free_port(), free_port()
    address = f"@fleetwatch-test-{uuid.uuid4().hex}"
    with NotifySocket(address) as notify:
        proc = subprocess.Popen(
            [
                *FLEETWATCH,
                "collector",
                "--listen",
                f"127.0.0.1:{grpc_port}",
                "--http",
                f"127.0.0.1:{http_port}",
                "--journal",
                str(tmp_path / "journal.db"),
            ],
            env=notify_env(address, 400_000),
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            [ready] = notify.wait_for("READY=1", timeout=60)
            for port in (grpc_port, http_port):  # listening already: no retry needed
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
            assert ready.pid == proc.pid
            assert f"gRPC port {grpc_port}, HTTP port {http_port}" in (ready.get("STATUS") or "")
            pings = notify.wait_for("WATCHDOG=1", count=5, after=ready.at)
            assert {p.pid for p in pings} == {proc.pid}
            gaps = [b.at - a.at for a, b in itertools.pairwise(pings)]
            assert all(0.1 < gap < 1.0 for gap in gaps), gaps  # every 0.2 s, not a flood
        finally:
            err = stop(proc)
        assert proc.returncode == 0, err
        notify.wait_for("STOPPING=1", timeout=5)


def test_agent_is_ready_after_its_first_poll():
    """`fleetwatch agent --simulate` says READY=1 with what it polls once its first poll is
    done, even while no collector answers; SIGTERM sends STOPPING=1."""
    address = f"@fleetwatch-test-{uuid.uuid4().hex}"
    with NotifySocket(address) as notify:
        proc = subprocess.Popen(
            [
                *FLEETWATCH,
                "agent",
                "--simulate",
                "--node",
                "gpu-node-9",
                "--collector",
                f"127.0.0.1:{free_port()}",
                "--job-socket",
                "",
            ],
            env=notify_env(address, 1_000_000),
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            [ready] = notify.wait_for("READY=1", timeout=60)
            assert ready.pid == proc.pid
            assert ready.get("STATUS") == "polling 8 GPUs and 8 IB ports every 5 s"
            notify.wait_for("WATCHDOG=1", count=3)
        finally:
            err = stop(proc)
        assert proc.returncode == 0, err
        notify.wait_for("STOPPING=1", timeout=5)
