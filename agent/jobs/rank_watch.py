"""The rank processes on this node: alive or gone, and how (``/proc/<pid>/stat``).

A process is watched once it has reported a step on the job socket (the kernel named it, see
:mod:`agent.jobs.listener`); no other process is ever looked at. Each poll reads its stat: the
state (running, sleeping, in uninterruptible sleep, stopped, zombie), its CPU time, and its start,
which tells the process from a later one that got the same pid; and, while it sleeps, its
wait channel (``/proc/<pid>/wchan``: the kernel function it waits in, such as
``unix_stream_read_generic`` or ``hrtimer_nanosleep``), which tells a rank waiting in a
collective from one that is not. A process that is gone is
reported as ``exited`` for a few polls (so that a lost message does not lose it), then forgotten.
The collector judges hung, failed and finished jobs from these (docs/jobs.md "Hangs").

For a job's rank dumps (:mod:`agent.jobs.rank_dumps`) :meth:`RankWatch.ranks_of` gives the job's
watched processes that are still there, and :meth:`RankWatch.same_process` tells whether a pid
still names the process that reported, run by the uid it reported as.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from pathlib import Path

_SYMBOL: Final = re.compile(r"[A-Za-z0-9_.]{1,64}")
MAX_WATCHED: Final = 1024  # processes watched at once (the job socket holds at most 512)
EXITED_REPORTS: Final = 3  # polls an exited process is reported in before it is forgotten
# /proc/<pid>/stat's state letters (proc(5)); I (idle kernel thread) and others read as running.
_STATES: Final = {
    "R": "running",
    "S": "sleeping",
    "D": "disk_sleep",
    "T": "stopped",
    "t": "stopped",  # stopped by a tracer
    "Z": "zombie",
    "X": "exited",
}


@dataclass(slots=True)
class _Watched:
    job_id: str
    rank: int
    pid: int
    start_ticks: int
    uid: int | None = None  # who it reported as (SO_PEERCRED); None: not known
    exited_reports: int = 0  # polls it was reported exited in
    farewell: str = ""  # what it said as it ended: "ok", "error", or nothing yet


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What ``/proc/<pid>/stat`` says of a process."""

    state: str  # one of _STATES' values
    cpu_ticks: int  # utime + stime
    start_ticks: int
    letter: str  # the state as the kernel wrote it (R, S, D, T, t, Z, X, I, ...)


@dataclass(frozen=True, slots=True)
class RankNow:
    """A watched rank process of a job, as it is now."""

    job_id: str
    rank: int
    pid: int
    start_ticks: int
    uid: int | None  # the uid it reported as; None: not known
    state: str  # /proc/<pid>/stat's state letter
    wchan: str  # "" while running


def parse_stat(text: str) -> ProcStat:
    """Parse a ``/proc/<pid>/stat`` line (ValueError when it is not one).

    The command name (field 2) is in parentheses and may hold spaces and parentheses itself, so
    the fields are counted from the last ``)``.
    """
    end = text.rfind(")")
    if end < 0:
        msg = "no command name in stat"
        raise ValueError(msg)
    fields = text[end + 2 :].split()
    # fields[0] is field 3 (state); utime, stime are 14, 15; starttime is 22
    if len(fields) < 20:  # noqa: PLR2004 - proc(5)'s field 22
        msg = f"stat has {len(fields) + 2} fields, not 22 or more"
        raise ValueError(msg)
    letter = fields[0][:1]
    state = _STATES.get(letter, "running")
    return ProcStat(state, int(fields[11]) + int(fields[12]), int(fields[19]), letter)


def status_uids(text: str) -> tuple[int, ...]:
    """The real, effective, saved and filesystem uids of a ``/proc/<pid>/status`` (() if none)."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            try:
                return tuple(int(field) for field in line[4:].split())
            except ValueError:
                return ()
    return ()


class RankWatch:
    """Rank processes that reported here, watched under ``proc_root``."""

    def __init__(self, proc_root: Path, ticks_per_s: int | None = None) -> None:
        """Nothing watched yet; ``ticks_per_s`` defaults to the system's ``CLK_TCK``."""
        self._root = proc_root
        self._ticks = ticks_per_s or os.sysconf("SC_CLK_TCK")
        # by (pid, start ticks, job, rank): one process may report several ranks (a simulator)
        self._watched: dict[tuple[int, int, str, int], _Watched] = {}

    def __len__(self) -> int:
        return len(self._watched)

    def saw(
        self, job_id: str, rank: int, pid: int, start_ticks: int, uid: int | None = None
    ) -> None:
        """A step report of ``rank`` of ``job_id`` came from this process (run by ``uid``)."""
        key = (pid, start_ticks, job_id, rank)
        if key in self._watched:
            return
        if len(self._watched) >= MAX_WATCHED:
            return  # the socket's bounds keep this from happening; a process is then unseen
        self._watched[key] = _Watched(job_id, rank, pid, start_ticks, uid)

    def ranks_of(self, job_id: str) -> list[RankNow]:
        """The job's watched processes that are still there (same pid and start), by rank."""
        out: list[RankNow] = []
        for watched in self._watched.values():
            if watched.job_id != job_id:
                continue
            stat = self._read(watched)
            if stat is None or stat.state == "exited":
                continue
            wchan = self._wchan(watched.pid) if stat.state != "running" else ""
            out.append(
                RankNow(
                    job_id=job_id,
                    rank=watched.rank,
                    pid=watched.pid,
                    start_ticks=watched.start_ticks,
                    uid=watched.uid,
                    state=stat.letter,
                    wchan=wchan,
                )
            )
        return sorted(out, key=lambda r: (r.rank, r.pid))

    def same_process(self, pid: int, start_ticks: int, uid: int | None) -> bool:
        """Whether ``pid`` still is the process that reported, run by the uid it reported as.

        Its start must be the same, and every one of its uids (real, effective, saved,
        filesystem) the uid it reported as: a process that exec'd a set-user-ID program since
        keeps its pid and start, not its uids. ``uid`` None (not known) is never the same.
        Safe from any thread: it reads only /proc.
        """
        if uid is None:
            return False
        base = self._root / str(pid)
        try:
            stat = parse_stat((base / "stat").read_text(errors="replace"))
            uids = status_uids((base / "status").read_text(errors="replace"))
        except (OSError, ValueError):
            return False
        return stat.start_ticks == start_ticks and bool(uids) and set(uids) == {uid}

    def farewell(self, pid: int, start_ticks: int, word: str) -> None:
        """The process said how it ends (``ok`` or ``error``); a process never watched: ignored."""
        for (owner, start, _, _), watched in self._watched.items():
            if (owner, start) == (pid, start_ticks):
                watched.farewell = word

    def _wchan(self, pid: int) -> str:
        """The kernel function the process sleeps in ("" when running or not to be read)."""
        try:
            text = (self._root / str(pid) / "wchan").read_text(errors="replace").strip()
        except OSError:
            return ""
        return text if _SYMBOL.fullmatch(text) and text != "0" else ""

    def _read(self, watched: _Watched) -> ProcStat | None:
        """The process's stat, or None when it is gone (or its pid names another process)."""
        try:
            stat = parse_stat((self._root / str(watched.pid) / "stat").read_text(errors="replace"))
        except (OSError, ValueError):
            return None
        return stat if stat.start_ticks == watched.start_ticks else None

    def snapshot(self) -> list[pb.RankProcess]:
        """Every watched process as it is now; exited ones for EXITED_REPORTS polls."""
        out: list[pb.RankProcess] = []
        for key, watched in list(self._watched.items()):
            stat = self._read(watched)
            if stat is None or stat.state == "exited":
                watched.exited_reports += 1
                if watched.exited_reports > EXITED_REPORTS:
                    del self._watched[key]
                    continue
                state, cpu, wchan = "exited", 0.0, ""
            else:
                state, cpu = stat.state, stat.cpu_ticks / self._ticks
                wchan = self._wchan(watched.pid) if state != "running" else ""
            out.append(
                pb.RankProcess(
                    job_id=watched.job_id,
                    rank=watched.rank,
                    state=state,
                    cpu_s=cpu,
                    pid=watched.pid,
                    farewell=watched.farewell,
                    wchan=wchan,
                )
            )
        return out
