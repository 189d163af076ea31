"""Training ranks as real processes of other users, for the job socket's identity tests.

:class:`RankProcess` forks a child that drops to ``uid`` with ``os.setuid`` (the tests run as
root) and sends step reports through the real client, :func:`fleetwatch.jobclient.report_step`,
each time the parent asks; it stays alive between requests, since the agent looks a sender up
in /proc when it accepts its connection. :func:`cgroup_root` finds a writable cgroup v2
hierarchy, where a test can put a child into a cgroup laid out the way slurmstepd or the kubelet
lay theirs out: the kernel then reports that path in the child's ``/proc/<pid>/cgroup``, as it
would on a node.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetwatch.jobclient import report_step

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from multiprocessing.connection import Connection

_FORK = multiprocessing.get_context("fork")


def _serve(conn: Connection, uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    while True:
        request = conn.recv()
        if request is None:
            return
        if request[0] == "flood":
            conn.send(_flood(conn, *request[1:]))
            continue
        reports, gap = request
        sent = []
        for args, kwargs in reports:
            sent.append(report_step(*args, **kwargs))
            if gap:
                time.sleep(gap)
        conn.send(sent)


def _flood(conn: Connection, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int]:
    """Send ``args``' report with step 0, 1, 2, ... as fast as it goes until the parent says
    stop; (sent, not sent)."""
    job, rank, _, step_time = args
    step, failed = 0, 0
    while not (step % 256 == 0 and conn.poll()):
        if not report_step(job, rank, step, step_time, **kwargs):
            failed += 1
        step += 1
    conn.recv()  # the stop
    return step - failed, failed


class RankProcess:
    """A child process running as ``uid`` that sends the step reports it is given."""

    def __init__(self, uid: int) -> None:
        """Fork the child; it waits for :meth:`send`."""
        self.uid = uid
        self._conn, child = _FORK.Pipe()
        self._process = _FORK.Process(target=_serve, args=(child, uid), daemon=True)
        self._process.start()
        child.close()

    @property
    def pid(self) -> int:
        """The child's pid."""
        assert self._process.pid is not None
        return self._process.pid

    def send(
        self, reports: list[tuple[tuple[Any, ...], dict[str, Any]]], gap: float = 0.0
    ) -> list[bool]:
        """Have the child call ``report_step(*args, **kwargs)`` for each, ``gap`` seconds apart
        (as a training loop's steps are); what each returned."""
        self._conn.send((reports, gap))
        if not self._conn.poll(30 + gap * len(reports)):
            msg = f"rank process {self.pid} (uid {self.uid}) did not answer"
            raise TimeoutError(msg)
        sent: list[bool] = self._conn.recv()
        return sent

    def flood(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Have the child send ``report_step(*args, **kwargs)`` (steps counting up) without pause
        until :meth:`end_flood`."""
        self._conn.send(("flood", args, kwargs))

    def end_flood(self) -> tuple[int, int]:
        """Stop the flood; (reports sent, reports that found the queue full)."""
        self._conn.send("stop")
        if not self._conn.poll(30):
            msg = f"rank process {self.pid} (uid {self.uid}) did not stop its flood"
            raise TimeoutError(msg)
        counts: tuple[int, int] = self._conn.recv()
        return counts

    def stop(self) -> None:
        """Let the child exit, and reap it."""
        with contextlib.suppress(OSError, EOFError):
            self._conn.send(None)
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()


Reports = list[tuple[tuple[Any, ...], dict[str, Any]]]
CHUNK = 8  # reports sent at once, each chunk once the agent read the last


def step_reports(job: str | None, ranks: range, steps: range, path: Path, **kw: Any) -> Reports:
    """``report_step`` calls for each step of each rank (keyword ``step_time`` included)."""
    step_time = kw.pop("step_time", 1.0)
    return [
        ((job, rank, step, step_time), {"socket_path": str(path), **kw})
        for step in steps
        for rank in ranks
    ]


async def deliver(rank: RankProcess, reports: Reports, read: Callable[[], int]) -> None:
    """Send ``reports`` from ``rank`` a few at a time, each few once the agent read them all.

    ``read`` counts the reports the agent has read (taken or refused). The sends block the
    event loop the agent reads on, so no more than the kernel queues are sent at once.
    """
    for first in range(0, len(reports), CHUNK):
        target = read() + len(reports[first : first + CHUNK])
        sent = rank.send(reports[first : first + CHUNK])
        assert all(sent), f"uid {rank.uid}: a send failed"
        deadline = time.monotonic() + 10
        while read() < target:
            assert time.monotonic() < deadline, f"the agent read {read()} of {target} reports"
            await asyncio.sleep(0.001)


@contextlib.contextmanager
def ranks(*uids: int) -> Iterator[list[RankProcess]]:
    """One rank process per uid, stopped on exit."""
    processes = [RankProcess(uid) for uid in uids]
    try:
        yield processes
    finally:
        for process in processes:
            process.stop()


@contextlib.contextmanager
def shared_dir() -> Iterator[Path]:
    """A short temp dir every user can reach (pytest's tmp_path is mode 0700 under root's)."""
    path = Path(tempfile.mkdtemp(prefix="fwid", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def cgroup_root() -> Path | None:
    """A cgroup v2 hierarchy this process may create cgroups in, or None."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                root = Path(fields[1])
                if os.access(root, os.W_OK) and (root / "cgroup.procs").exists():
                    return root
    return None


@contextlib.contextmanager
def in_cgroup(root: Path, path: str, pid: int) -> Iterator[None]:
    """Move ``pid`` into the cgroup at ``path`` (created under ``root``); removed on exit."""
    relative = path.strip("/")
    group = root / relative
    group.mkdir(parents=True, exist_ok=True)
    (group / "cgroup.procs").write_text(str(pid))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            (root / "cgroup.procs").write_text(str(pid))  # back to the root, if it still runs
        parts = relative.split("/")
        for depth in range(len(parts), 0, -1):
            with contextlib.suppress(OSError):
                (root / "/".join(parts[:depth])).rmdir()


def pod_uid() -> str:
    """A made-up Kubernetes pod UID."""
    return str(uuid.uuid4())
