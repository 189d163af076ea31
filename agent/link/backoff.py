"""Reconnect delays: exponential growth with full jitter, so a fleet does not reconnect in step."""

from __future__ import annotations

import random


class Backoff:
    """Delays drawn from [0, min(cap, initial * 2**attempt)]."""

    __slots__ = ("_attempt", "_rng", "cap", "initial")

    def __init__(self, initial: float, cap: float, rng: random.Random | None = None) -> None:
        """Check the bounds up front so the hot path needs no checks."""
        if not 0 < initial <= cap:
            msg = f"backoff needs 0 < initial ({initial}) <= cap ({cap})"
            raise ValueError(msg)
        self.initial = initial
        self.cap = cap
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._attempt = 0

    def next_delay(self) -> float:
        """Return the next delay and grow the window."""
        delay = self.draw()
        self.grow()
        return delay

    @property
    def window(self) -> float:
        """The largest delay :meth:`draw` may return now."""
        return min(self.cap, self.initial * 2.0 ** min(self._attempt, 30))

    def draw(self) -> float:
        """Return a delay from the current window, without growing it.

        For tries that may fail several times before waiting longer: a round of the collector
        list moves on after each failure, and waits longer only after the whole round failed.
        """
        return max(self.initial / 10, self._rng.uniform(0, self.window))

    def grow(self) -> None:
        """Double the window (up to ``cap``) for the delays drawn after this."""
        self._attempt += 1

    def reset(self) -> None:
        """Start from the smallest window again (after a healthy connection)."""
        self._attempt = 0
