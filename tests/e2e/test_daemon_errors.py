"""What a new user sees when a daemon cannot start, and how output behaves in a pipe or a terminal.

Each failure is one line on stderr naming what was wrong, with the status the README promises:
2 for what no restart mends (systemd's ``RestartPreventExitStatus=2``).
"""

import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sources.nvml import nvml_library_installed
from fleetwatch.testing import free_port

pytestmark = pytest.mark.e2e

FLEETWATCH = [sys.executable, "-m", "cli.main"]
FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port another process listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FLEETWATCH, *args], capture_output=True, text=True, timeout=120, check=False
    )


def collector_args(tmp_path: Path, grpc: int, http: int) -> list[str]:
    listen = ["--listen", f"127.0.0.1:{grpc}", "--http", f"127.0.0.1:{http}"]
    return ["collector", *listen, "--journal", str(tmp_path / "journal.db")]


def test_collector_with_its_http_port_taken(tmp_path: Path, taken: int):
    done = run(*collector_args(tmp_path, free_port(), taken))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"fleetwatch collector: http 127.0.0.1:{taken}: port {taken} is in use (another collector?)"
    ]


def test_collector_with_its_grpc_port_taken(tmp_path: Path, taken: int):
    """The port is checked before the journal is read: no log lines come before the error."""
    done = run(*collector_args(tmp_path, taken, free_port()))
    assert done.returncode == 2
    why = f"listen 127.0.0.1:{taken}: port {taken} is in use (another collector?)"
    assert done.stderr.splitlines() == [f"fleetwatch collector: {why}"]


def test_demo_with_its_http_port_taken(taken: int):
    done = run("demo", "--http-port", str(taken), "--duration", "5")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"fleetwatch demo: http 127.0.0.1:{taken}: port {taken} is in use (another collector?)"
    ]


@pytest.mark.skipif(nvml_library_installed(), reason="this machine has NVIDIA's NVML library")
def test_agent_on_a_node_without_the_nvidia_driver(tmp_path: Path):
    """No libnvidia-ml: one line pointing at --simulate, status 2, and nothing retried."""
    done = run("agent", "--state-dir", str(tmp_path / "state"), "--job-socket", "")
    assert done.returncode == 2
    why = "no NVIDIA driver found (libnvidia-ml); use --simulate to try it without a GPU"
    assert done.stderr.splitlines() == [f"fleetwatch agent: {why}"]


@pytest.mark.parametrize(
    "args",
    [("scan", str(FIXTURES / "logs" / "dmesg-T.txt")), ("rules", "check")],
    ids=["scan", "rules-check"],
)
def test_output_into_a_closed_pipe_ends_quietly(args: tuple[str, ...]):
    """`fleetwatch ... | head -1`: the reader has gone; no traceback, the status of SIGPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*FLEETWATCH, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 128 + signal.SIGPIPE


def first_log_line(*args: str, terminal: bool) -> str:
    """Start a simulated agent with stderr on a terminal (a pty) or a pipe; its first log line."""
    cmd = [*FLEETWATCH, *args, "agent", "--simulate", "--collector", f"127.0.0.1:{free_port()}"]
    if terminal:
        main, sub = pty.openpty()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sub, stderr=sub)
        os.close(sub)
    else:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        main = proc.stderr.fileno()
    try:
        seen = b""
        deadline = time.monotonic() + 60
        while b"\n" not in seen:
            assert time.monotonic() < deadline, f"no log line from the agent: {seen!r}"
            ready, _, _ = select.select([main], [], [], 1.0)
            if ready:
                chunk = os.read(main, 4096)
                assert chunk, f"the agent ended before it logged: {seen!r}"
                seen += chunk
        return seen.decode().splitlines()[0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if terminal:
            os.close(main)
        elif proc.stderr is not None:
            proc.stderr.close()


def test_logs_are_for_people_on_a_terminal_and_json_otherwise():
    on_terminal = first_log_line(terminal=True)
    assert not on_terminal.startswith("{")
    assert "[info" in on_terminal
    piped = first_log_line(terminal=False)
    assert json.loads(piped)["level"] == "info"
    chosen = first_log_line("--log-format", "json", terminal=True)
    assert json.loads(chosen)["level"] == "info"
