"""The crash tests' collector process and node: the collector started as a real process (or as
``crashing_collector.py``, which SIGKILLs itself at one named step), stopped as systemd would
stop it, one simulated node that reconnects quickly, and a read-only look at the journal."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.sim.cluster import SimCluster
from fleetwatch.clock import SystemClock

NODE = "node-1"
ROOT = Path(__file__).resolve().parents[2]


def start(step: str | None, cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    """The collector on ``cfg``, logging to ``log``; killed by itself at ``step`` unless None."""
    argv = [sys.executable, "-m"]
    argv += ["cli.main"] if step is None else ["tests.integration.crashing_collector", step]
    argv += ["collector", "--config", str(cfg)]
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=out, cwd=ROOT)


def died(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is not None


def one_node(tmp_path: Path, port: int) -> SimCluster:
    """The crash tests' node: a quick poll and a quick reconnect to the collector at ``port``."""
    return SimCluster(
        [NODE],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{port}",
        poll_interval=0.05,
        heartbeat_interval=0.5,
        backoff_initial=0.05,
        backoff_max=0.3,
    )


def terminate(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop the collectors still running, as systemd would."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)


def journal(tmp_path: Path, sql: str, *params: str) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` on ``tmp_path``'s journal, opened read-only."""
    with contextlib.closing(
        sqlite3.connect(f"file:{tmp_path / 'journal.db'}?mode=ro", uri=True, timeout=10)
    ) as conn:
        return conn.execute(sql, params).fetchall()
