"""Reliability in the running collector: the rules' lemon counts, the 30-day figures, the API's.

Three readers, three paces:

* the rules read each node's recent remediations and incident episodes at every evaluation:
  :class:`~collector.model.recent_faults.RecentFaults` keeps them in memory (loaded from the
  journal at start, then told of each action outcome and lifecycle move on the event loop) and
  observes the histograms of time to repair and between incidents as repairs end and episodes
  begin;
* Prometheus reads the fleet's 30-day figures (GPU time lost, mean times) of this collector's
  nodes: they are computed from the journal on a thread of their own every :data:`REFRESH_S`
  (less often when a refresh takes long: at most :data:`BUSY_SHARE` of the time; the first
  :data:`FIRST_REFRESH_S` after the start), and a scrape only reads the last ones;
* ``GET /api/v1/reliability`` computes what it is asked (a node, a window) from the journal on
  the API's thread (:meth:`Reliability.answer`): every node the journal holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any, Final

import structlog

from collector.export.reliability import ReliabilityCollector
from collector.model.lifecycle import STILL_FIRING
from collector.model.recent_faults import RecentFaults, reads_counts
from collector.model.reliability import (
    LEMON_WINDOW_S,
    OUT,
    WINDOW_S,
    FleetFigures,
    Recent,
    fleet_figures,
    recent_counts,
)
from rules.engine import Phase

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.model.fleet import FleetModel
    from collector.store.events import EventReader, EventStore
    from collector.store.journal import Journal
    from collector.store.lifecycle import Move, TransitionRow
    from fleetwatch.clock import Clock
    from rules.engine import Engine

__all__ = ["BUSY_SHARE", "REFRESH_S", "Reliability"]

log = structlog.get_logger("collector.reliability")

REFRESH_S: Final = 60.0
FIRST_REFRESH_S: Final = 10.0  # after the start
BUSY_SHARE: Final = 0.01  # the refreshes' share of the time, at most
Window = tuple[list["Move"], dict[str, "TransitionRow"], dict[str, int]]


def _ms(clock: Clock) -> int:
    return round(clock.now() * 1000)


class Reliability:
    """The lemon counts, the figures and their metrics, for one collector."""

    def __init__(  # noqa: PLR0913 - its sources, and its pace
        self,
        *,
        journal: Journal,
        reader: EventReader,
        fleet: FleetModel,
        clock: Clock,
        engine: Callable[[], Engine],
        refresh_s: float = REFRESH_S,
    ) -> None:
        """Read ``journal`` at start, ``reader`` after.

        ``engine()`` is the rules' (a reload swaps it): a firing incident of a rule reading the
        counts marks a lemon.
        """
        self._journal = journal
        self._reader = reader
        self._fleet = fleet
        self._clock = clock
        self._engine = engine
        self.refresh_s = refresh_s
        self.recent = RecentFaults(clock)
        self.latest: FleetFigures | None = None  # the last refresh's 30-day figures
        self.took_s = 0.0  # how long the last refresh took
        self.collector = ReliabilityCollector(
            self.recent, lambda: (self.latest, self.took_s), self.lemons
        )
        self._task: asyncio.Task[None] | None = None

    def lemons(self) -> frozenset[str]:
        """The nodes a lemon rule fires on now (any thread: the engine's list is copied)."""
        engine = self._engine()
        rules = engine.rules
        return frozenset(
            i.node
            for i in engine.open_incidents()
            if i.phase == Phase.FIRING and i.rule in rules and reads_counts(rules[i.rule].when)
        )

    async def start(self) -> None:
        """Take the last 30 days back from the journal, then refresh the figures now and then."""
        now_ms = _ms(self._clock)
        since, recent_since = now_ms - round(WINDOW_S * 1000), now_ms - round(LEMON_WINDOW_S * 1000)

        def read(
            store: EventStore,
        ) -> tuple[list[Move], dict[str, int], list[tuple[str, str, int]]]:
            lifecycle = store.lifecycle
            out = {n for n, row in lifecycle.before(since).items() if row.state in OUT}
            left = lifecycle.left_service_before(since)
            return (
                lifecycle.moves(since, keep_reason=STILL_FIRING),
                {node: at for node, at in left.items() if node in out},  # repairs under way
                store.incidents.succeeded_since(recent_since),
            )

        started = time.perf_counter()
        moves, left, actions = await self._journal.do(read)
        self.recent.load(moves, actions, left)
        log.info(
            "reliability_loaded",
            moves=len(moves),
            actions=len(actions),
            took_s=round(time.perf_counter() - started, 3),
        )
        self._task = asyncio.create_task(self._run(), name="reliability-figures")

    async def stop(self) -> None:
        """Stop refreshing."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        await self._clock.sleep(FIRST_REFRESH_S)  # not in the thick of a fleet reconnecting
        while True:
            try:
                await self.refresh()
            except Exception:
                log.exception("reliability_refresh_failed")
            await self._clock.sleep(max(self.refresh_s, self.took_s / BUSY_SHARE))

    async def refresh(self) -> FleetFigures:
        """The fleet's 30-day figures from the journal now (read and computed off the loop)."""
        self.recent.prune()
        gpus = {name: len(node.gpus) for name, node in self._fleet.view().items()}
        now_ms = _ms(self._clock)
        started = time.perf_counter()
        figures = await asyncio.to_thread(self._figures, gpus, now_ms)
        self.took_s = time.perf_counter() - started
        self.latest = figures
        return figures

    def _figures(self, gpus: dict[str, int], now_ms: int) -> FleetFigures:
        """This collector's nodes' 30-day figures (a shared journal holds its peers' too)."""
        rows, before, left = self._window(now_ms - round(WINDOW_S * 1000), None)
        return fleet_figures(
            [row for row in rows if row.node in gpus],
            now_ms=now_ms,
            window_s=WINDOW_S,
            gpus=gpus,
            before={node: row for node, row in before.items() if node in gpus},
            left=left,
        )

    def _window(self, since_ms: int, node: str | None) -> Window:
        """The moves from ``since_ms`` on, where each node stood then and when it left service."""
        return self._reader.read_lifecycle(
            lambda s: (
                s.moves(since_ms, node, STILL_FIRING),
                s.before(since_ms, node),
                s.left_service_before(since_ms, node),
            )
        )

    def _gpus(self, node: str | None) -> dict[str, int]:
        """Each node's GPU count (from the API's thread: one short lock per node)."""
        names = [node] if node is not None else self._fleet.node_names()
        found: dict[str, int] = {}
        for name in names:
            count = self._fleet.read_node(name, lambda state, _c, _u: len(state.gpus))
            if count is not None:
                found[name] = count
        return found

    def answer(self, node: str | None, window_s: float) -> dict[str, Any] | None:
        """``GET /api/v1/reliability``: the fleet's (or ``node``'s) figures over ``window_s``.

        From the journal, on the calling (API) thread. None: a node neither the fleet nor the
        journal knows.
        """
        gpus = self._gpus(node)
        if node is not None and node not in gpus:
            if node not in self._reader.node_names():
                return None
            gpus[node] = 0  # the journal's, not this collector's: figures, no GPUs known
        now_ms = _ms(self._clock)
        since = now_ms - round(window_s * 1000)
        rows, before, left = self._window(since, node)
        figures = fleet_figures(
            rows, now_ms=now_ms, window_s=window_s, gpus=gpus, before=before, left=left
        )
        recent_since = now_ms - round(LEMON_WINDOW_S * 1000)
        if since > recent_since:  # a window shorter than the lemon's
            rows = self._reader.read_lifecycle(lambda s: s.moves(recent_since, node, STILL_FIRING))
        actions = self._reader.read(lambda s: s.succeeded_since(recent_since, node))
        recent = recent_counts(actions, rows, now_ms=now_ms)
        lemons = self.lemons()
        head: dict[str, Any] = {
            "now_unix": now_ms / 1000,
            "window_s": window_s,
            "lemon_window_s": LEMON_WINDOW_S,
        }

        by_node = {n.node: n for n in figures.nodes}

        def one(name: str) -> dict[str, Any]:
            shown = by_node[name].to_json()
            shown["last_7d"] = recent.get(name, Recent()).to_json()
            shown["lemon"] = name in lemons
            shown["rules_see"] = dict(self.recent.fields(name))
            return shown

        if node is not None:
            return {**head, "node": one(node)}
        fleet = figures.to_json()
        fleet["last_7d"] = {
            key: sum(r.to_json()[key] for r in recent.values())
            for key in ("remediations", "drains", "resets", "reboots", "rma_tickets")
        } | {"incident_episodes": sum(r.episodes for r in recent.values())}
        fleet["lemon_nodes"] = sorted(lemons)
        busy = [
            n.node
            for n in figures.nodes
            if n.episodes or n.repairs_s or n.open_s is not None or n.out_s or n.node in recent
        ]
        return {**head, "fleet": fleet, "nodes": [one(name) for name in busy]}
