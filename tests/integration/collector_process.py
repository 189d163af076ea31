"""The collector as a process of its own, for tests that kill it and start it again on the same
journal, and the Xid markers that journal holds."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def start_collector(port: int, journal: Path, log: Path) -> subprocess.Popen[bytes]:
    """``fleetwatch collector`` as a process of its own on ``port`` and ``journal``, logging to
    ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.main",
                "collector",
                "--listen",
                f"127.0.0.1:{port}",
                "--http",
                "127.0.0.1:0",
                "--journal",
                str(journal),
                "--heartbeat-interval",
                "1",
            ],
            stdout=out,
            stderr=out,
        )


def journal_markers(journal: Path) -> Counter[str]:
    """The Xid markers journaled so far; none while a starting collector has created the file
    (it creates it 0600 before SQLite opens it) but not yet its tables."""
    with contextlib.closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True)) as conn:
        try:
            rows = conn.execute("SELECT detail FROM events WHERE kind = 'xid'").fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            rows = []
    return Counter(detail.rsplit(", ", 1)[-1] for (detail,) in rows)
