"""What the reliability figures cost at fleet size: 4,096 nodes and 30 days of lifecycle moves.

Run from the repository root: ``.venv/bin/python bench/reliability_figures.py [--nodes N]``.
The last line of output is one JSON object.

A SQLite journal (the collector's own store, in a temp dir) gets 30 days of moves for every
node, at two paces: ``typical``, an incident episode every 10 days a node (suspect, drained, in
repair, re-qualifying, back in service: five moves, the drain journaled as an action that
succeeded), and ``busy``, one every 2 days. Then, as the collector does it
(:mod:`collector.reliability`, with its garbage collection, :mod:`collector.gc_pauses`):

* ``start_s``: the start's read of the journal (30 days of moves, 7 days of actions) and the
  counts taken back in memory (:meth:`RecentFaults.load`);
* ``refresh_s``: one refresh of the 30-day figures (the journal read and the figures), what
  runs on a thread of its own every minute; ``read_s`` and ``compute_s`` split it, and
  ``loop_lag_max_ms_during_refresh`` is the most the event loop was late meanwhile;
* ``api_fleet_s`` and ``api_node_s``: ``GET /api/v1/reliability`` for the fleet, and one node;
* ``fields_us_per_node``: the rules' counts of one node, as a tick builds its map;
* ``scrape_ms``: the reliability families of one scrape.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, generate_latest

from collector.gc_pauses import start_freezer
from collector.model.fleet import FleetModel
from collector.model.reliability import WINDOW_S, fleet_figures
from collector.reliability import Reliability
from collector.store.incidents import ActionRow
from collector.store.journal import Journal
from collector.store.lifecycle import TransitionRow
from collector.store.sqlite import JournalReader, SqliteStore
from fleetwatch.clock import SystemClock
from fleetwatch.testing import made_up_hello
from rules.engine import Engine
from rules.model import RuleSet

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from collector.store.lifecycle import Move

T = TypeVar("T")
DAY_MS = 86_400_000
CYCLE = (
    ("in_service", "suspect", "rule:gpu_lost", 0),
    ("suspect", "drained", "action:drain_node", 20_000),
    ("drained", "in_repair", "person:oncall", 3_600_000),
    ("in_repair", "requalifying", "person:oncall", 5 * 3_600_000),
    ("requalifying", "in_service", "preflight:run", 6 * 3_600_000),
)


def fill(store: SqliteStore, nodes: list[str], every_days: float, now_ms: int) -> int:
    """30 days of episodes, one every ``every_days`` a node (random phase); rows written."""
    rng = random.Random(7)
    written = 0
    with store.db.transaction():
        for node in nodes:
            at = now_ms - 30 * DAY_MS + int(rng.random() * every_days * DAY_MS)
            while at + CYCLE[-1][3] < now_ms:
                for previous, state, actor, after in CYCLE:
                    store.lifecycle.add(
                        TransitionRow(node, state, previous, at + after, actor, f"{node}:{at}")
                    )
                    written += 1
                drained = at + CYCLE[1][3]
                store.incidents.add_action(
                    ActionRow(
                        idempotency_key=f"drain_node:{node}:{at}",
                        incident_id=f"gpu_lost:{node}/gpu/0:{at}",
                        action="drain_node",
                        node=node,
                        target=f"{node}/gpu/0",
                        state="succeeded",
                        created_ms=drained,
                        params={},
                        finished_ms=drained,
                    )
                )
                at += int(every_days * DAY_MS)
    return written


def best(fn: Callable[[], T], rounds: int) -> tuple[float, T]:
    """The fastest of ``rounds`` runs of ``fn()`` (seconds), and its last answer."""
    times: list[float] = []
    for _ in range(max(1, rounds)):
        started = time.perf_counter()
        answer = fn()
        times.append(time.perf_counter() - started)
    return min(times), answer


async def measure(workdir: Path, nodes: int, every_days: float, rounds: int) -> dict[str, Any]:
    freezer = start_freezer(SystemClock(), lambda: nodes)  # the collector's garbage collection
    names = [f"node-{i:04d}" for i in range(nodes)]
    path = workdir / f"journal-{every_days:g}.db"
    store = SqliteStore(path, "bench")
    clock = SystemClock()
    now_ms = round(clock.now() * 1000)
    written = fill(store, names, every_days, now_ms)
    fleet = FleetModel()
    for name in names:
        fleet.on_hello(made_up_hello(name, gpus=8, nvlinks=18, ib_ports=8), 0.0, clock.now())
    reader = JournalReader(path)
    journal = Journal(store)
    engine = Engine(RuleSet())
    reliability = Reliability(
        journal=journal, reader=reader, fleet=fleet, clock=clock, engine=lambda: engine
    )
    started = time.perf_counter()
    await reliability.start()
    start_s = time.perf_counter() - started
    await reliability.stop()
    gpus = dict.fromkeys(names, 8)
    since = now_ms - round(WINDOW_S * 1000)

    def read() -> tuple[list[Move], dict[str, TransitionRow], dict[str, int]]:
        return reader.read_lifecycle(
            lambda s: (s.moves(since), s.before(since), s.left_service_before(since))
        )

    read_s, (rows, before, left) = best(read, rounds)
    compute_s, figures = best(
        lambda: fleet_figures(
            rows, now_ms=now_ms, window_s=WINDOW_S, gpus=gpus, before=before, left=left
        ),
        rounds,
    )
    refresh_s = min([await _timed(reliability.refresh()) for _ in range(rounds)])
    lag_s = await _loop_lag(reliability.refresh())
    api_fleet_s, _ = best(lambda: reliability.answer(None, WINDOW_S), rounds)
    api_node_s, _ = best(lambda: reliability.answer(names[0], WINDOW_S), rounds)
    fields_s, _ = best(lambda: [reliability.recent.fields(n) for n in names], rounds)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(reliability.collector)
    scrape_s, _ = best(lambda: generate_latest(registry), rounds)
    await journal.close()
    freezer.cancel()
    return {
        "moves": written,
        "moves_per_node": round(written / nodes, 1),
        "start_s": round(start_s, 3),
        "refresh_s": round(refresh_s, 3),
        "read_s": round(read_s, 3),
        "compute_s": round(compute_s, 3),
        "loop_lag_max_ms_during_refresh": round(lag_s * 1000, 1),
        "api_fleet_s": round(api_fleet_s, 3),
        "api_node_s": round(api_node_s, 4),
        "fields_us_per_node": round(fields_s / nodes * 1e6, 2),
        "scrape_ms": round(scrape_s * 1000, 2),
        "gpu_time_lost_ratio": round(figures.gpu_time_lost_ratio, 4),
        "repairs": len(figures.repairs_s),
    }


async def _loop_lag(step: Awaitable[object]) -> float:
    """The most a 5 ms sleep on the event loop overran while ``step`` ran.

    The refresh's thread and the loop share the GIL.
    """
    worst, done = 0.0, asyncio.Event()

    async def probe() -> None:
        nonlocal worst
        while not done.is_set():
            started = time.perf_counter()
            await asyncio.sleep(0.005)
            worst = max(worst, time.perf_counter() - started - 0.005)

    task = asyncio.create_task(probe())
    await step
    done.set()
    await task
    return worst


async def _timed(step: Awaitable[object]) -> float:
    started = time.perf_counter()
    await step
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the journals go")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"nodes": args.nodes, "window_days": 30}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for name, every in (("typical", 10.0), ("busy", 2.0)):
            print(f"{name}: an episode every {every:g} days a node ...", file=sys.stderr)
            out[name] = asyncio.run(measure(Path(tmp), args.nodes, every, args.rounds))
            print(json.dumps(out[name]), file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
