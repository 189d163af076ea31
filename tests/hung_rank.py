"""A hung training rank as a real Python process: it reports a step on the job socket, then sleeps.

The rank runs ``hung_rank.py`` (written next to the socket) as its own program, so py-spy reads
it with a file and functions of its own: ``train_step`` calls ``wait_in_collective``, which
sleeps. After it reported it waits for a line on stdin: ``setuid <uid>`` makes it drop to
another user (as a rank that exec'd another program might), then it sleeps again.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TYPE_CHECKING

from fleetwatch.testing import wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

SCRIPT = """\
import os
import sys
import threading
import time

from fleetwatch.jobclient import report_step


def wait_in_collective():
    line = sys.stdin.readline().split()
    if line[:1] == ["setuid"]:
        os.setuid(int(line[1]))
        print("dropped", flush=True)
    time.sleep(600)


def train_step():
    assert report_step(sys.argv[2], int(sys.argv[3]), 1, 1.0, socket_path=sys.argv[1])
    wait_in_collective()


threading.Thread(target=time.sleep, args=(600,), name="watchdog", daemon=True).start()
train_step()
"""
FUNCTION = "wait_in_collective"


@contextlib.asynccontextmanager
async def hung_rank(
    socket_path: Path, job: str, rank: int, reported: Callable[[], bool]
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A rank of ``job`` that reported ``rank`` once ``reported()`` holds; killed at the end."""
    script = socket_path.with_name("hung_rank.py")
    script.write_text(SCRIPT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        str(socket_path),
        job,
        str(rank),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        await wait_until(reported, 10, f"rank {rank} of {job} reported")
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def drop_to(proc: asyncio.subprocess.Process, uid: int) -> None:
    """Have the rank change its uids to ``uid``; return once it has."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(f"setuid {uid}\n".encode())
    await proc.stdin.drain()
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"dropped\n"
