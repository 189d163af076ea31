"""A /proc for an agent under test in which chosen processes sit in a chosen cgroup.

The loopback Slurm of tests/slurm_harness.py runs without cgroups (proctrack/linuxproc), so the
kernel never places a test's rank processes in a Slurm job's cgroup, and a writable cgroup v2
hierarchy (tests/rank_process.py's ``cgroup_root``) is not there on every CI machine. A
:class:`ProcOverlay` is a directory an agent takes as its ``proc_root``: every top-level entry
of the real /proc is a link to it, except the processes added with :meth:`ProcOverlay.add`,
whose directories link every entry to the real process's but ``cgroup``, which holds the text
given (as the kernel writes it, e.g. ``0::/system.slice/slurmstepd.scope/job_7/step_0``). What
the agent reads of those processes (stat, status, wchan) stays the kernel's own.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ProcOverlay", "slurm_cgroup"]

REAL = Path("/proc")


def slurm_cgroup(job: str) -> str:
    """The ``/proc/<pid>/cgroup`` text of a task of Slurm job ``job`` (Slurm's cgroup v2 layout)."""
    return f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"


class ProcOverlay:
    """A directory that reads as /proc, with some processes' cgroups replaced."""

    def __init__(self, root: Path) -> None:
        """Link the real /proc's entries that are not processes (stat, sys, self, ...) under
        ``root`` (created); a process not added is not there."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        for entry in REAL.iterdir():
            if not entry.name.isdigit():
                (root / entry.name).symlink_to(entry)

    def add(self, pid: int, cgroup: str) -> None:
        """Show process ``pid`` with ``cgroup`` as its cgroup file, the rest of it as it is."""
        here = self.root / str(pid)
        here.mkdir()
        for entry in (REAL / str(pid)).iterdir():
            if entry.name != "cgroup":
                (here / entry.name).symlink_to(entry)
        (here / "cgroup").write_text(cgroup)
