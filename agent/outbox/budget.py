"""One byte bound for everything the agent holds for the collector: events, then telemetry.

The outbox's unacknowledged events (on disk, or in memory while the disk refuses them) and the
step reports waiting for the link share ``max_bytes``. When an event needs room, telemetry is shed
first, oldest first (``shed``, which the telemetry queue provides); an event is refused only when
events alone fill the bound. Telemetry never pushes out an event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

DEFAULT_MAX_BYTES: Final = 64 << 20


def _shed_nothing(_nbytes: int) -> int:
    return 0


class ByteBudget:
    """Bytes held by events and by telemetry, against one bound."""

    __slots__ = ("events", "max_bytes", "shed", "telemetry")

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        """Empty; ``shed(n)`` frees at least ``n`` bytes of telemetry if it can, returns freed."""
        if max_bytes <= 0:
            msg = f"max_bytes must be positive, got {max_bytes}"
            raise ValueError(msg)
        self.max_bytes = max_bytes
        self.events = 0
        self.telemetry = 0
        self.shed: Callable[[int], int] = _shed_nothing

    @property
    def held(self) -> int:
        """Bytes held in all."""
        return self.events + self.telemetry

    def room(self) -> int:
        """Bytes left before the bound (negative when over it)."""
        return self.max_bytes - self.events - self.telemetry
