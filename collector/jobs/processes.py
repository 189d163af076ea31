"""A rank's process as its node's agent describes it (the job book keeps one per rank)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

GONE: Final = frozenset({"exited", "zombie"})  # states of a process that ended


@dataclass(slots=True)
class RankProcess:
    """A rank's process as its node's agent last described it."""

    state: str
    cpu_s: float
    pid: int
    seen: float  # monotonic
    gone_since: float | None = None  # when it was first seen gone
    farewell: str = ""  # what it said as it ended: ok, error, or nothing
    wchan: str = ""  # the kernel function it sleeps in ("" running or unknown)
    said_since: float | None = None  # when its farewell was first seen (it may still be exiting)
