"""Per-node ingest budgets: how many events and samples a node may send per second.

Each node has two token buckets, one for events and one for report samples. A message takes its
cost from its bucket (one per event, one per sample) and may leave the bucket in debt; the node's
stream is then not read again until the debt is paid back at the budget's rate. Nothing is
dropped: the unread messages wait in gRPC's flow-control window and, beyond it, in the agent's
outbox and spool, which is where events are meant to wait. A node over its budget slows only
itself: other nodes' streams are read, journaled and acked as before.

The buckets outlive a node's stream (a flooder gains nothing by reconnecting). The code here is
pure: callers pass the time and do the waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Final, Literal

Budget = Literal["events", "samples"]
BUDGETS: Final[tuple[Budget, ...]] = ("events", "samples")

# Waits shorter than this are not slept one by one: the debt is carried and paid in one sleep.
MIN_WAIT_S: Final = 0.005


@dataclass(frozen=True, slots=True)
class IngestLimits:
    """Budgets per node, and when repeats of one event are coalesced.

    ``events_per_s``/``event_burst``: events a node may send per second, and at once after a
    quiet spell (a replay after a partition goes at ``event_burst``, then at the rate).
    ``samples_per_s``/``sample_burst``: the same for report samples (an agent's first report
    carries every value: a few thousand for a node of 8 GPUs).
    ``repeat_window_s``/``repeat_burst``: of events alike in kind, target and Xid whose times
    fall within one window, the first ``repeat_burst`` are journaled one by one and the rest
    coalesced (see :mod:`collector.ingest.coalesce`); ``hold_s``: how long coalesced events wait
    for more before they are journaled.
    """

    events_per_s: float = 1_000.0
    event_burst: float = 10_000.0
    samples_per_s: float = 50_000.0
    sample_burst: float = 200_000.0
    repeat_window_s: float = 1.0
    repeat_burst: int = 200
    hold_s: float = 1.0

    def __post_init__(self) -> None:
        """Refuse limits that would stop ingest or never flush."""
        for name in ("events_per_s", "event_burst", "samples_per_s", "sample_burst"):
            value = getattr(self, name)
            if not value > 0:
                msg = f"{name} must be positive, got {value}"
                raise ValueError(msg)
        if not self.repeat_window_s > 0 or not self.hold_s > 0:
            msg = f"repeat_window_s and hold_s must be positive, got {self.repeat_window_s}, "
            msg += f"{self.hold_s}"
            raise ValueError(msg)
        if self.repeat_burst < 1:
            msg = f"repeat_burst must be at least 1, got {self.repeat_burst}"
            raise ValueError(msg)


DEFAULT_LIMITS: Final = IngestLimits()


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; a take may leave it in debt."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        """Start full at ``now`` (seconds on a monotonic clock)."""
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now

    def take(self, cost: float, now: float) -> float:
        """Take ``cost`` tokens; return how long to wait before acting (0 when in budget)."""
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
        self._tokens -= cost
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def level(self, now: float) -> float:
        """Tokens there would be at ``now`` (negative: debt)."""
        return min(self.burst, self._tokens + max(now - self._at, 0.0) * self.rate)


@dataclass(slots=True)
class NodeIngest:
    """One node's buckets and what they cost it."""

    events: TokenBucket
    samples: TokenBucket
    throttled_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUDGETS, 0.0))
    throttled: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUDGETS, 0))
    coalesced: int = 0

    def bucket(self, budget: Budget) -> TokenBucket:
        """The bucket of ``budget``."""
        return self.events if budget == "events" else self.samples

    def take(self, budget: Budget, cost: float, now: float) -> float:
        """Charge ``cost``; return the wait (0 below :data:`MIN_WAIT_S`: carried as debt).

        A wait returned is counted as throttled time of this budget.
        """
        wait = self.bucket(budget).take(cost, now)
        if wait < MIN_WAIT_S:
            return 0.0
        self.throttled_s[budget] += wait
        self.throttled[budget] += 1
        return wait


@dataclass(frozen=True, slots=True)
class NodeIngestView:
    """A copy of one node's figures, for the scrape thread."""

    node: str
    throttled_s: dict[str, float]
    throttled: dict[str, int]
    coalesced: int


class IngestThrottle:
    """Every node's :class:`NodeIngest`, made on first use."""

    def __init__(self, limits: IngestLimits = DEFAULT_LIMITS) -> None:
        """Apply ``limits`` to every node."""
        self.limits = limits
        self._nodes: dict[str, NodeIngest] = {}

    def node(self, name: str, now: float) -> NodeIngest:
        """``name``'s budgets (full buckets the first time)."""
        found = self._nodes.get(name)
        if found is None:
            lim = self.limits
            found = self._nodes[name] = NodeIngest(
                events=TokenBucket(lim.events_per_s, lim.event_burst, now),
                samples=TokenBucket(lim.samples_per_s, lim.sample_burst, now),
            )
        return found

    def forget(self, name: str) -> None:
        """Drop a node's budgets and figures (a node removed from the fleet)."""
        self._nodes.pop(name, None)

    def snapshot(self) -> list[NodeIngestView]:
        """Every node's figures, copied (safe to call from another thread)."""
        return [
            NodeIngestView(name, dict(n.throttled_s), dict(n.throttled), n.coalesced)
            for name, n in sorted(self._nodes.items(), key=itemgetter(0))
        ]
