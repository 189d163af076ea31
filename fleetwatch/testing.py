"""Fakes shipped for tests and simulations (the structlog ``testing`` idea)."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


class FakeClock:
    """A clock that only moves when told to; ``sleep`` advances it instead of waiting."""

    __slots__ = ("_mono", "_wall")

    def __init__(self, start_unix: float = 1_767_225_600.0) -> None:
        """Start at ``start_unix`` (default 2026-01-01T00:00:00Z) with monotonic time 0."""
        self._wall = start_unix
        self._mono = 0.0

    def now(self) -> float:
        """Return the fake wall time."""
        return self._wall

    def monotonic(self) -> float:
        """Return the fake monotonic time."""
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds``."""
        if seconds < 0:
            msg = f"cannot move a clock backwards by {seconds} s"
            raise ValueError(msg)
        self._wall += seconds
        self._mono += seconds

    async def sleep(self, seconds: float) -> None:
        """Advance by ``seconds`` and yield to the event loop once."""
        self.advance(max(seconds, 0.0))
        await asyncio.sleep(0)


async def wait_until(
    predicate: Callable[[], bool],
    timeout: float = 15.0,  # noqa: ASYNC109 - a deadline on a condition, not on one call
    what: str = "",
) -> None:
    """Poll ``predicate`` on the running loop until it holds; raise AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout} s waiting for {what or predicate}"
            raise AssertionError(msg)
        await asyncio.sleep(0.05)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (for child-process servers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
