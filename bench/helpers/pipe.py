"""The JSON-lines pipe between a benchmark and a child process of its own.

The benchmark's end is :class:`FleetProcess` (JSON lines to the child's stdin, JSON lines from
its stdout); the child's end is :func:`say` and :func:`stdin_lines`. ``bench/helpers/sim_fleet.py``
and ``bench/ingest/load.py`` speak it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from bench.helpers.children import die_with_parent, stop_process

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[2]
SIM_FLEET = Path(__file__).resolve().parent / "sim_fleet.py"


class FleetProcess:
    """``bench/helpers/sim_fleet.py`` as a child: JSON lines to its stdin, JSON lines from stdout.

    ``script`` and ``preexec`` let other benchmarks run another script that speaks the same
    pipe (``bench/ingest/load.py``), e.g. pinned to a core.
    """

    def __init__(
        self,
        args: list[str],
        stderr: IO[bytes],
        *,
        script: Path = SIM_FLEET,
        preexec: Callable[[], None] = die_with_parent,
    ) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and script
            [sys.executable, str(script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            bufsize=1,
            cwd=ROOT,
            preexec_fn=preexec,  # noqa: PLW1509 - no locks are taken before exec
        )
        self._changed = threading.Condition()
        self._messages: list[dict[str, Any]] = []
        self.injected: dict[int, dict[str, Any]] = {}
        self._reader = threading.Thread(target=self._read, name="fleet-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None  # noqa: S101 - set by Popen above
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self._changed:
                if msg.get("op") == "injected":
                    self.injected[int(msg["id"])] = msg
                else:
                    self._messages.append(msg)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def send(self, **msg: object) -> None:
        """One message to the fleet process."""
        assert self.proc.stdin is not None  # noqa: S101 - set by Popen above
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def wait_for(self, op: str, timeout_s: float) -> dict[str, Any]:
        """The next message ``op``; RuntimeError if it does not come or the process ends."""

        def found() -> dict[str, Any] | None:
            for i, msg in enumerate(self._messages):
                if msg.get("op") == op:
                    return self._messages.pop(i)
            return None

        deadline = time.monotonic() + timeout_s
        with self._changed:
            while (got := found()) is None:
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    msg = f"fleet process: no {op!r} message (exit status {self.proc.poll()})"
                    raise RuntimeError(msg)
                self._changed.wait(min(left, 1.0))
            return got

    def stop(self) -> dict[str, Any] | None:
        """Ask it to quit and return its closing stats; terminate or kill it if it will not."""
        stats = None
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.send(op="quit")
            with contextlib.suppress(RuntimeError):
                stats = self.wait_for("stats", 30.0)
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30.0)  # it stops its agents after sending the stats
        stop_process(self.proc)
        return stats


def say(**fields: object) -> None:
    """One line to the parent."""
    sys.stdout.write(json.dumps(fields, sort_keys=True) + "\n")
    sys.stdout.flush()


async def stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader
