"""Who is connected to the job socket, from the kernel: credentials, start time, scheduler job.

The kernel records the pid, uid and gid of the process that connected a Unix socket
(``SO_PEERCRED``, taken at ``connect``); a process cannot choose them. From the pid, under an
injected proc root:

- ``/proc/<pid>/stat`` gives when the process started (to tell a pid reused from the one seen
  before, and for the collector to tell a restarted rank from an impersonated one);
- ``/proc/<pid>/cgroup`` gives the scheduler's job the process runs in. Only cgroups a user
  cannot create count: Slurm's (``/slurm/uid_<n>/job_<id>/...`` on cgroup v1,
  ``/system.slice/slurmstepd.scope/job_<id>/...`` on v2) and the kubelet's
  (``/kubepods.slice/...-pod<uid>.slice/...`` with the systemd driver, underscores for dashes;
  ``/kubepods/<qos>/pod<uid>/...`` with cgroupfs). A path a user's delegated systemd subtree
  could hold (``/user.slice/...``) names no scheduler, whatever its components say.
"""

from __future__ import annotations

import os
import re
import socket
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from pathlib import Path

CREDENTIALS: Final = struct.Struct("=iII")  # struct ucred: pid_t pid, uid_t uid, gid_t gid
CACHED_PEERS: Final = 4096

_SLURM_JOB: Final = re.compile(r"job_([0-9]{1,20})")
_UUID: Final = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD_SYSTEMD: Final = re.compile(rf"kubepods(?:-[a-z]+)*-pod({_UUID})\.slice")
_POD_CGROUPFS: Final = re.compile(rf"pod({_UUID})")
_QOS: Final = frozenset({"burstable", "besteffort", "guaranteed"})


class PeerGoneError(OSError):
    """The sender's ``/proc/<pid>`` cannot be read (it exited before we looked)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the kernel says about a datagram's sender."""

    pid: int
    uid: int
    gid: int


@dataclass(frozen=True, slots=True)
class SchedulerJob:
    """The scheduler's unit a process runs in: a Slurm job, or a Kubernetes pod."""

    kind: Literal["slurm", "k8s"]
    id: str  # the Slurm job id, or the pod's UID (with dashes)

    @property
    def label(self) -> str:
        """``slurm:<job id>`` or ``k8s:<pod uid>``: how the wire carries it."""
        return f"{self.kind}:{self.id}"


@dataclass(frozen=True, slots=True)
class Peer:
    """A sender: its credentials, when its process started, and its scheduler job (if any)."""

    pid: int
    uid: int
    gid: int
    start_ticks: int  # clock ticks after boot; with the pid it names one process
    start_unix_ms: int
    scheduler: SchedulerJob | None


def peer_credentials(sock: socket.socket) -> Credentials | None:
    """Who connected ``sock`` (``SO_PEERCRED``), or None when the kernel has no process for it.

    The kernel gives pid 0 when the connecting process lives in a pid namespace this one cannot
    see.
    """
    try:
        data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, CREDENTIALS.size)
    except OSError:
        return None
    pid, uid, gid = CREDENTIALS.unpack(data)
    return Credentials(pid, uid, gid) if pid > 0 else None


def scheduler_job(cgroup: str) -> SchedulerJob | None:
    """The Slurm job or pod named by a ``/proc/<pid>/cgroup`` text (v1, v2 or hybrid).

    The unified (``0::``) line is looked at first, then the v1 hierarchies in order.
    """
    lines = [line.split(":", 2) for line in cgroup.splitlines()]
    paths = [parts[2] for parts in lines if len(parts) == 3 and parts[0] == "0"]  # noqa: PLR2004
    paths += [parts[2] for parts in lines if len(parts) == 3 and parts[0] != "0"]  # noqa: PLR2004
    for path in paths:
        found = job_in_path(path)
        if found is not None:
            return found
    return None


def job_in_path(path: str) -> SchedulerJob | None:
    """The scheduler job one cgroup path names, if it lies under a scheduler's own root."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return None
    return _slurm(parts) or _kubernetes(parts)


def _slurm(parts: list[str]) -> SchedulerJob | None:
    # v2: /system.slice/slurmstepd.scope/job_1234/... (or <node>_slurmstepd.scope with several
    # slurmd on a host); v1: /slurm/uid_1000/job_1234/... (or slurm_<node>).
    if len(parts) >= 3 and parts[0] == "system.slice" and parts[1].endswith("slurmstepd.scope"):  # noqa: PLR2004
        candidate = parts[2]
    elif len(parts) >= 2 and parts[0].endswith("slurmstepd.scope"):  # noqa: PLR2004
        candidate = parts[1]
    elif (
        len(parts) >= 3  # noqa: PLR2004
        and (parts[0] == "slurm" or parts[0].startswith("slurm_"))
        and parts[1].startswith("uid_")
    ):
        candidate = parts[2]
    else:
        return None
    match = _SLURM_JOB.fullmatch(candidate)
    return SchedulerJob("slurm", match.group(1)) if match else None


def _kubernetes(parts: list[str]) -> SchedulerJob | None:
    if parts[0] == "kubelet.slice" and len(parts) > 1:  # kubelet's own --cgroup-root (kind)
        parts = parts[1:]
    if parts[0].endswith("kubepods.slice"):  # systemd driver: one slice per level
        for part in parts[1:4]:
            match = _POD_SYSTEMD.fullmatch(part.removeprefix("kubelet-"))
            if match:
                return SchedulerJob("k8s", match.group(1).replace("_", "-"))
        return None
    if parts[0] == "kubepods":  # cgroupfs driver: /kubepods[/<qos>]/pod<uid>/<container>
        rest = parts[2:] if len(parts) > 1 and parts[1] in _QOS else parts[1:]
        match = _POD_CGROUPFS.fullmatch(rest[0]) if rest else None
        if match and "_" not in match.group(1):
            return SchedulerJob("k8s", match.group(1))
    return None


def start_ticks(stat: str) -> int:
    """Field 22 (starttime) of a ``/proc/<pid>/stat`` line; the name may hold spaces and ``)``."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])  # fields after the name start at field 3


def boot_time(proc_stat: str) -> int:
    """``btime`` (Unix seconds the system booted) from ``/proc/stat``."""
    for line in proc_stat.splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    msg = "/proc/stat has no btime line"
    raise ValueError(msg)


class PeerResolver:
    """Looks senders up under ``proc_root``; the cgroup is read once per process (pid and start)."""

    def __init__(self, proc_root: Path, ticks_per_s: int | None = None) -> None:
        """Read the boot time lazily; ``ticks_per_s`` defaults to the system's ``CLK_TCK``."""
        self.proc_root = proc_root
        self._root = proc_root
        self._ticks = ticks_per_s or os.sysconf("SC_CLK_TCK")
        self._boot_ms: int | None = None
        self._jobs: dict[tuple[int, int], SchedulerJob | None] = {}

    def _read(self, pid: int, name: str) -> str:
        try:
            return (self._root / str(pid) / name).read_text(errors="replace")
        except OSError as exc:
            msg = f"process {pid} is gone ({exc.strerror or exc})"
            raise PeerGoneError(msg) from exc

    def started(self, pid: int) -> int:
        """The process's start in clock ticks after boot (PeerGoneError when it is gone)."""
        try:
            return start_ticks(self._read(pid, "stat"))
        except (ValueError, IndexError) as exc:
            msg = f"process {pid}: unreadable stat"
            raise PeerGoneError(msg) from exc

    def alive(self, pid: int, ticks: int) -> bool:
        """Whether the process that had ``pid`` and started at ``ticks`` still runs."""
        try:
            return self.started(pid) == ticks
        except PeerGoneError:
            return False

    def resolve(self, creds: Credentials) -> Peer:
        """The sender behind ``creds`` (PeerGoneError when its /proc entry cannot be read)."""
        ticks = self.started(creds.pid)
        key = (creds.pid, ticks)
        if key in self._jobs:
            job = self._jobs[key]
        else:
            job = scheduler_job(self._read(creds.pid, "cgroup"))
            if len(self._jobs) >= CACHED_PEERS:
                self._jobs.clear()
            self._jobs[key] = job
        boot_ms = self._boot_unix_ms()
        start_ms = boot_ms + ticks * 1000 // self._ticks if boot_ms else 0
        return Peer(creds.pid, creds.uid, creds.gid, ticks, start_ms, job)

    def _boot_unix_ms(self) -> int:
        if self._boot_ms is None:
            try:
                self._boot_ms = boot_time((self._root / "stat").read_text()) * 1000
            except (OSError, ValueError):
                self._boot_ms = 0  # no start times then: the collector treats them as unknown
        return self._boot_ms
