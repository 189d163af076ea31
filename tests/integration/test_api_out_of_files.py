"""Out of files, the collector's HTTP server pauses on accept instead of spinning (issue 18).

The real collector runs in a child process whose limit on open files is low
(``tests/integration/file_limited.py``); this test holds more connections to its HTTP port than
that limit lets it accept. The connections left in the listen queue keep the port readable, so a
server that only retries ``accept`` burns a CPU core on ``EMFILE``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from tests.integration.raw_http import TIMEOUT_S, request

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration

FILE_LIMIT = 40  # the collector holds about 20 files once started
HELD = FILE_LIMIT + 16  # more connections than it can ever take
ACCEPT_WAIT_S = 1.0  # a collector with files to spare accepts within milliseconds
WINDOW_S = 2.0
MOST_CPU_S = 0.3  # over WINDOW_S; spinning on accept burns about a core (WINDOW_S seconds)


def log_lines(log: Path) -> list[dict[str, Any]]:
    """The child's JSON log lines so far (anything else it wrote is skipped)."""
    lines = []
    for line in log.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(line))
    return lines


def wait_for_event(log: Path, event: str, timeout: float = 10.0) -> dict[str, Any]:
    """The first log line of ``event``, waiting for it up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in log_lines(log) if line.get("event") == event]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no {event} in the collector's log"
        time.sleep(0.05)


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[tuple[psutil.Process, int, Path]]:
    """The real collector under a limit of FILE_LIMIT open files: its process, HTTP port, log."""
    log = tmp_path / "collector.log"
    argv = [
        sys.executable,
        "-m",
        "tests.integration.file_limited",
        str(FILE_LIMIT),
        "collector",
        "--listen",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--journal",
        str(tmp_path / "journal.db"),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out)
    try:
        port = int(wait_for_event(log, "collector_started")["http_port"])
        yield psutil.Process(proc.pid), port, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def files_free(proc: psutil.Process) -> int:
    """How many file descriptors below FILE_LIMIT the collector could still open."""
    fds = Path(f"/proc/{proc.pid}/fd").iterdir()
    return FILE_LIMIT - sum(int(fd.name) < FILE_LIMIT for fd in fds)


def out_of_files(log: Path) -> bool:
    """Whether the collector has logged that it ran out of files."""
    return any(line.get("event") == "http_out_of_files" for line in log_lines(log))


def fill(proc: psutil.Process, port: int, log: Path, held: list[socket.socket]) -> None:
    """Connect to ``port`` into ``held`` until the collector logs that it is out of files.

    One connection at a time, each once the collector holds one more file (or after
    ACCEPT_WAIT_S, as a connection closing meanwhile hides that): a burst would overflow the
    listen queue of 5, and a dropped SYN is sent again only 1 s later. The connection it fails
    to accept stays queued, keeping the port readable.
    """
    for _ in range(HELD):
        files = proc.num_fds()
        held.append(socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S))
        deadline = time.monotonic() + ACCEPT_WAIT_S
        while proc.num_fds() <= files and time.monotonic() < deadline:
            if out_of_files(log):
                return
            time.sleep(0.005)
    pytest.fail(
        f"no http_out_of_files after {HELD} connections under a limit of {FILE_LIMIT} files"
    )


def test_out_of_files_the_server_pauses_logs_and_recovers(
    collector: tuple[psutil.Process, int, Path],
):
    """More connections than the collector has files for: it logs http_out_of_files, spends
    under 0.3 s of CPU in the next 2 s while they are held (a server retrying accept at once
    spins a core), and answers /healthz once they are closed."""
    proc, port, log = collector
    assert request(port, "GET", "/healthz").status == 200
    held: list[socket.socket] = []
    try:
        fill(proc, port, log, held)
        logged = wait_for_event(log, "http_out_of_files")
        before = proc.cpu_times()
        time.sleep(WINDOW_S)  # the window measured, in CPU time: a loaded machine adds none
        after = proc.cpu_times()
        assert files_free(proc) == 0  # still out of files at the end of the window
    finally:
        for sock in held:
            sock.close()
    cpu_s = (after.user + after.system) - (before.user + before.system)
    assert cpu_s < MOST_CPU_S, f"{cpu_s:.2f} s of CPU in {WINDOW_S} s out of files"
    assert (logged["level"], logged["error"]) == ("error", "Too many open files")
    answer = request(port, "GET", "/healthz")
    assert (answer.status, answer.body) == (200, b"ok\n")
