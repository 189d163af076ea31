"""Log a read that keeps failing once, when it starts, and once more when it reads again.

A sysfs file that is missing (a container without ``/sys/bus/pci``, a device that went away)
fails at every poll; a warning per poll buries every other line in the journal. The failures are
still counted at every poll (the agent's ``read_errors``); only the log line is per episode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Hashable

    import structlog


class FailureEpisodes:
    """Which things are failing now, by key; logs the start and the end of each episode."""

    __slots__ = ("_event", "_failing", "_log")

    def __init__(self, log: structlog.stdlib.BoundLogger, event: str) -> None:
        """``event`` names the failure (``pcie_read_failed``); recovery logs ``<event>_ended``."""
        self._log = log
        self._event = event
        self._failing: set[Hashable] = set()

    def failed(self, key: Hashable, error: str, **fields: object) -> None:
        """A read of ``key`` failed: warn unless it was failing already."""
        if key not in self._failing:
            self._failing.add(key)
            self._log.warning(self._event, error=error, **fields)

    def succeeded(self, key: Hashable, **fields: object) -> None:
        """A read of ``key`` worked: say so when it ends an episode."""
        if key in self._failing:
            self._failing.discard(key)
            self._log.info(f"{self._event}_ended", **fields)

    @property
    def failing(self) -> int:
        """How many keys are failing now."""
        return len(self._failing)
