"""Marks nodes unreachable after missed heartbeats, and journals that as an event."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from collector.session import collector_event
from fleetwatch.model import EventKind, Target

if TYPE_CHECKING:
    from collector.fleet import FleetModel
    from collector.journal import Journal
    from fleetwatch.clock import Clock

log = structlog.get_logger("collector.liveness")


class LivenessMonitor:
    """A node silent for ``missed`` heartbeat intervals is unreachable."""

    def __init__(
        self,
        *,
        fleet: FleetModel,
        journal: Journal,
        clock: Clock,
        heartbeat_interval: float,
        missed: int,
    ) -> None:
        """Check the timing knobs up front."""
        if heartbeat_interval <= 0 or missed < 1:
            msg = "liveness needs a positive heartbeat interval and at least one missed beat"
            raise ValueError(msg)
        self._fleet = fleet
        self._journal = journal
        self._clock = clock
        self.silence_s = heartbeat_interval * missed
        self.check_every_s = heartbeat_interval / 2
        self.missed = missed

    async def check(self) -> list[str]:
        """Journal, then mark, every overdue node as unreachable; return their names."""
        overdue = self._fleet.overdue(self._clock.monotonic(), self.silence_s)
        for name in overdue:
            detail = f"no message for over {self.silence_s:g} s ({self.missed} heartbeats missed)"
            await self._journal.append(
                collector_event(name, EventKind.NODE_UNREACHABLE, self._clock, detail),
            )
            last_seen = self._fleet.mark_unreachable(name)
            self._fleet.apply_event(name, EventKind.NODE_UNREACHABLE, Target.node(), 0)
            await self._journal.set_reachable(
                name,
                reachable=False,
                last_seen_ms=int(last_seen * 1000),
            )
            log.warning("node_unreachable", node=name, silence_s=self.silence_s)
        return overdue

    async def run(self) -> None:
        """Check forever."""
        while True:
            await self._clock.sleep(self.check_every_s)
            await self.check()
