"""Poll and heartbeat intervals, shared by the poll loop and the link; the collector sets them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

MIN_INTERVAL_S = 0.01


@dataclass(slots=True)
class Intervals:
    """Seconds between polls and between heartbeats."""

    poll: float
    heartbeat: float

    def apply(self, config: pb.Config) -> None:
        """Take what the collector's Config sets; zero means keep ours."""
        if config.poll_interval_ms:
            self.poll = max(config.poll_interval_ms / 1000, MIN_INTERVAL_S)
        if config.heartbeat_interval_ms:
            self.heartbeat = max(config.heartbeat_interval_ms / 1000, MIN_INTERVAL_S)
