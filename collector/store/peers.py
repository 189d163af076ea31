"""Several collectors on one journal: who is alive, and which nodes are whose.

Each collector writes a heartbeat row (``collectors``) and, on every Hello, claims the node
(``nodes.collector``). That is all the coordination there is; the database holds it, no
collector talks to another. It answers two questions:

* at start, which remembered nodes to watch: those this collector held, those nobody holds, and
  those of collectors whose heartbeat stopped (their agents may never come back, and someone
  must notice), but not the nodes a live peer holds;
* when a node falls silent here, did it die or move? If another collector took its stream since,
  it moved: this collector forgets it (no ``node_unreachable``, no incident, no series) and the
  peer carries on.

:class:`PeerHolders` answers a third, for the scrape targets: which nodes live peers hold now,
so that a node that moved is listed only by the collector that has it (read on the API's own
connection, at most once a heartbeat period, never on the journal's writer thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import structlog

from fleetwatch import __version__

if TYPE_CHECKING:
    from collector.store.events import EventReader, NodeRow
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock

log = structlog.get_logger("collector.store.peers")

BEAT_S: Final = 5.0
DEAD_AFTER_BEATS: Final = 4  # a peer silent this many beats is taken for dead


class Peers:
    """This collector's place among the collectors sharing its journal."""

    def __init__(
        self, *, journal: Journal, clock: Clock, name: str, beat_s: float = BEAT_S
    ) -> None:
        """``name`` is this collector's; ``beat_s`` the heartbeat period."""
        self._journal = journal
        self._clock = clock
        self.name = name
        self.beat_s = beat_s
        self.beat_failures = 0

    @property
    def shared(self) -> bool:
        """Whether other collectors may use this journal (PostgreSQL)."""
        return self._journal.store.shared

    async def beat(self) -> None:
        """Write this collector's heartbeat row."""
        now_ms = int(self._clock.now() * 1000)
        await self._journal.do(lambda s: s.beat(now_ms, __version__))

    async def run(self) -> None:
        """Beat every ``beat_s`` for as long as the collector runs (a failed beat is retried)."""
        while True:
            try:
                await self.beat()
            except Exception as exc:  # noqa: BLE001 - the database may be away for a while
                self.beat_failures += 1
                log.warning("collector_beat_failed", error=str(exc))
            await self._clock.sleep(self.beat_s)

    async def live_peers(self) -> set[str]:
        """Other collectors whose heartbeat is recent."""
        now_ms = int(self._clock.now() * 1000)
        horizon = int(self.beat_s * DEAD_AFTER_BEATS * 1000)
        rows = await self._journal.do(lambda s: s.collectors())
        return {n for n, seen, _ in rows if n != self.name and now_ms - seen <= horizon}

    async def ours(self, rows: list[NodeRow]) -> list[NodeRow]:
        """The remembered nodes this collector should watch (all of them on an unshared one)."""
        if not self.shared:
            return rows
        alive = await self.live_peers()
        skipped = [r.name for r in rows if r.collector in alive]
        if skipped:
            log.info("nodes_held_by_peers", nodes=len(skipped), peers=sorted(alive))
        return [r for r in rows if r.collector not in alive]

    async def moved_to(self, node: str) -> str | None:
        """The peer that holds ``node``'s stream now, or None if none does."""
        if not self.shared:
            return None
        holder = await self._journal.do(lambda s: s.node_holder(node))
        if holder is None or holder[0] in ("", self.name):
            return None
        return holder[0]


class PeerHolders:
    """Which nodes live peers hold now, read on the API's connection and kept for a beat."""

    def __init__(
        self,
        *,
        reader: EventReader,
        clock: Clock,
        name: str,
        shared: bool,
        beat_s: float = BEAT_S,
    ) -> None:
        """``name`` is this collector's; an unshared journal has no peers to ask about."""
        self._reader = reader
        self._clock = clock
        self._name = name
        self._shared = shared
        self._beat_s = beat_s
        self._held: frozenset[str] = frozenset()
        self._read_at: float | None = None
        self.failures = 0

    def held_elsewhere(self) -> frozenset[str]:
        """The nodes live peers hold (as of at most a beat ago; none on an unshared journal)."""
        if not self._shared:
            return frozenset()
        now = self._clock.monotonic()
        if self._read_at is not None and now - self._read_at < self._beat_s:
            return self._held
        self._read_at = now
        horizon_ms = int(self._beat_s * DEAD_AFTER_BEATS * 1000)
        since_ms = int(self._clock.now() * 1000) - horizon_ms
        try:
            self._held = frozenset(self._reader.held_by_others(self._name, since_ms))
        except Exception as exc:  # noqa: BLE001 - the database may be away: keep the last answer
            self.failures += 1
            log.warning("node_holders_unknown", error=str(exc))
        return self._held
