"""Marks nodes unreachable after missed heartbeats, and journals that as an event.

With several collectors on one journal, a node silent here may have moved to a peer (its agent
failed over): then it is forgotten here, not marked unreachable (:mod:`collector.store.peers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from collector.store.events import collector_event
from fleetwatch.model import EventKind, Target

if TYPE_CHECKING:
    from collector.model.fleet import FleetModel
    from collector.store.journal import Journal
    from collector.store.peers import Peers
    from fleetwatch.clock import Clock

log = structlog.get_logger("collector.model.liveness")


class LivenessMonitor:
    """A node silent for ``missed`` heartbeat intervals is unreachable."""

    def __init__(  # noqa: PLR0913 - collaborators and the two timing knobs
        self,
        *,
        fleet: FleetModel,
        journal: Journal,
        clock: Clock,
        heartbeat_interval: float,
        missed: int,
        peers: Peers | None = None,
    ) -> None:
        """Check the timing knobs up front."""
        if heartbeat_interval <= 0 or missed < 1:
            msg = "liveness needs a positive heartbeat interval and at least one missed beat"
            raise ValueError(msg)
        self._fleet = fleet
        self._journal = journal
        self._clock = clock
        self._peers = peers
        self.moved = 0  # nodes that went to another collector
        self.silence_s = heartbeat_interval * missed
        self.check_every_s = heartbeat_interval / 2
        self.missed = missed

    async def check(self) -> list[str]:
        """Journal, then mark, every overdue node as unreachable; return their names.

        A node that moved to a peer is forgotten instead, and not in the list.
        """
        overdue = self._fleet.overdue(self._clock.monotonic(), self.silence_s)
        lost: list[str] = []
        for name in overdue:
            try:
                peer = None if self._peers is None else await self._peers.moved_to(name)
            except Exception as exc:  # noqa: BLE001 - the journal is away: ask next round
                log.warning("node_holder_unknown", node=name, error=str(exc))
                continue
            if peer is not None:
                self._fleet.forget(name)
                self.moved += 1
                log.info("node_moved", node=name, collector=peer)
                continue
            lost.append(name)
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
        return lost

    async def run(self) -> None:
        """Check forever."""
        while True:
            await self._clock.sleep(self.check_every_s)
            await self.check()
