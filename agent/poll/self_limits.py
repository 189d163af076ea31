"""The agent watches its own memory and CPU each poll, and gives way before systemd has to.

The unit's ``MemoryMax=256M`` and ``CPUQuota=50%`` are the hard bounds: the kernel kills or
throttles the agent there. Below them the agent bounds itself:

- **Memory.** Resident memory above ``memory_max_bytes`` sheds what the agent can do without:
  the step reports waiting for the link (telemetry; events are never shed, they are bounded by
  ``spool_max_bytes``) and, once per episode, unreachable Python objects (``gc.collect``).
  Python rarely hands freed memory back, so RSS may stay high; the agent then keeps shedding
  step reports at every poll while it stays over, and says so once.
- **CPU.** When a poll costs more CPU than ``poll_cpu_max_share`` of the poll interval (smoothed
  over polls), the next poll waits longer: the interval is stretched until the share holds, at
  most ``MAX_STRETCH`` times the configured one, and goes back once polls are cheap again.
  Event sources still wake the agent at once; only the timed polls are spaced out.

Both are counted and reported as node samples (``agent_rss_bytes``, ``agent_cpu_seconds``,
``agent_poll_interval_seconds``, ``agent_poll_stretches``, ``agent_memory_sheds``).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

import structlog

from fleetwatch.model import Target

if TYPE_CHECKING:
    from fleetwatch.model import SampleKey, SampleValue

__all__ = [
    "DEFAULT_MEMORY_MAX_BYTES",
    "DEFAULT_POLL_CPU_MAX_SHARE",
    "MAX_STRETCH",
    "ProcessUsage",
    "SelfLimits",
    "Usage",
]

log = structlog.get_logger("agent.self_limits")

DEFAULT_MEMORY_MAX_BYTES: Final = 192 << 20  # three quarters of the unit's MemoryMax=256M
DEFAULT_POLL_CPU_MAX_SHARE: Final = 0.1  # a tenth of one CPU, a fifth of the unit's CPUQuota
MAX_STRETCH: Final = 10.0  # the interval grows to at most this many times the configured one
RELAX: Final = 0.8  # stretched polls go back once they cost under this part of the share
SMOOTHING: Final = 0.3  # weight of the newest poll in the smoothed cost
RSS_STEP: Final = 1 << 20  # RSS is reported in whole MiB (a sample per poll otherwise)


class Usage(Protocol):
    """Where the agent's own resource use is read from."""

    def rss_bytes(self) -> int | None:
        """Resident memory of the process in bytes (None: could not be read)."""
        ...

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the process, every thread, in seconds."""
        ...


class ProcessUsage:
    """This process's use: RSS from ``<proc_root>/self/statm``, CPU time from ``os.times``."""

    __slots__ = ("_page", "_statm", "read_errors")

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        """Read nothing yet."""
        self._statm = proc_root / "self" / "statm"
        self._page = os.sysconf("SC_PAGE_SIZE")
        self.read_errors = 0

    def rss_bytes(self) -> int | None:
        """Resident pages (statm's second field) times the page size."""
        try:
            resident = int(self._statm.read_bytes().split()[1])
        except (OSError, IndexError, ValueError) as exc:
            self.read_errors += 1
            if self.read_errors == 1:
                log.warning("rss_unreadable", path=str(self._statm), error=str(exc))
            return None
        return resident * self._page

    def cpu_seconds(self) -> float:
        """User plus system time of every thread of the process."""
        times = os.times()
        return times.user + times.system


class SelfLimits:
    """Memory ceiling and CPU share of the agent's polls, checked by the poll loop."""

    __slots__ = (
        "_cost",
        "_memory_max",
        "_share",
        "_usage",
        "cpu_seconds",
        "memory_sheds",
        "over_memory",
        "rss_bytes",
        "stretched_to",
        "stretches",
    )

    def __init__(self, usage: Usage, *, memory_max_bytes: int, poll_cpu_max_share: float) -> None:
        """``memory_max_bytes`` 0 sheds never; ``poll_cpu_max_share`` 0 stretches never."""
        if memory_max_bytes < 0 or not 0 <= poll_cpu_max_share <= 1:
            msg = (
                f"memory_max_bytes must be >= 0 and poll_cpu_max_share within [0, 1], got "
                f"{memory_max_bytes} and {poll_cpu_max_share}"
            )
            raise ValueError(msg)
        self._usage = usage
        self._memory_max = memory_max_bytes
        self._share = poll_cpu_max_share
        self._cost: float | None = None  # smoothed CPU seconds per timed poll
        self.rss_bytes: int | None = None
        self.cpu_seconds = 0.0
        self.over_memory = False
        self.memory_sheds = 0
        self.stretched_to: float | None = None  # the stretched interval, None when not
        self.stretches = 0

    def cpu_now(self) -> float:
        """The process's CPU seconds now (to time a poll with)."""
        return self._usage.cpu_seconds()

    def check_memory(self) -> bool:
        """Read RSS and CPU time; True when over the ceiling: the caller sheds what it holds."""
        rss = self.rss_bytes = self._usage.rss_bytes()
        self.cpu_seconds = self._usage.cpu_seconds()
        over = self._memory_max > 0 and rss is not None and rss > self._memory_max
        if over:
            self.memory_sheds += 1
            if not self.over_memory:
                log.error(
                    "memory_over_ceiling",
                    rss_bytes=rss,
                    memory_max_bytes=self._memory_max,
                    note="held step reports are dropped at every poll until back under",
                )
                gc.collect()
        elif self.over_memory:
            log.info("memory_under_ceiling", rss_bytes=rss, memory_max_bytes=self._memory_max)
        self.over_memory = over
        return over

    def next_interval(self, poll_cpu_s: float, base_s: float) -> float:
        """The wait before the next timed poll, after one that cost ``poll_cpu_s``."""
        share = self._share
        if share <= 0:
            return base_s
        last = self._cost
        cost = self._cost = poll_cpu_s if last is None else last + SMOOTHING * (poll_cpu_s - last)
        need = cost / share  # the interval at which polls cost exactly the share
        if self.stretched_to is None:
            if need <= base_s:
                return base_s
            self.stretches += 1
            log.warning(
                "poll_interval_stretched",
                poll_cpu_ms=round(cost * 1000, 1),
                poll_cpu_max_share=share,
                poll_interval_s=base_s,
                stretched_to_s=round(min(need, base_s * MAX_STRETCH), 2),
            )
        elif need <= base_s * RELAX:
            self.stretched_to = None
            log.info(
                "poll_interval_restored", poll_cpu_ms=round(cost * 1000, 1), poll_interval_s=base_s
            )
            return base_s
        self.stretched_to = min(max(need, base_s), base_s * MAX_STRETCH)
        return self.stretched_to

    def samples(self, base_s: float) -> dict[SampleKey, SampleValue]:
        """The node samples of what was last read, with ``base_s`` the configured interval."""
        node = Target.node()
        out: dict[SampleKey, SampleValue] = {
            (node, "agent_cpu_seconds"): round(self.cpu_seconds, 2),
            (node, "agent_poll_interval_seconds"): round(self.stretched_to or base_s, 3),
            (node, "agent_poll_stretches"): self.stretches,
            (node, "agent_memory_sheds"): self.memory_sheds,
        }
        if self.rss_bytes is not None:
            out[node, "agent_rss_bytes"] = self.rss_bytes // RSS_STEP * RSS_STEP
        return out
