"""A tick that evaluates thousands of targets gives the event loop turns while it runs.

A collector that takes back a large fleet evaluates every node whole as its agents say Hello;
as one callback that was seconds in which no stream was read and no event acked.
"""

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable

import pytest

from collector.config import CollectorConfig
from collector.incidents.service import TICK_SLICE_S
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.model import EventKind, Target, sample_to_pb
from fleetwatch.testing import made_up_hello

pytestmark = pytest.mark.integration

NODES = 300


@pytest.fixture
async def busy(collector_config: Callable[..., CollectorConfig]) -> AsyncIterator[CollectorService]:
    """A real collector whose model holds ``NODES`` nodes of 8 GPUs that said Hello (so its next
    tick evaluates each whole), and that does not tick by itself: the tests tick it (its own
    loop would run a small tick every 0.2 s beside theirs, and take their events). The nodes send
    no heartbeats: with the test's 1.5 s of silence allowed, a slow machine saw them turn
    unreachable during the tests, each an event and an urgent tick between the tests' slices."""
    config = collector_config(rules_interval=3600, heartbeat_interval=3600)
    service = CollectorService(config, SystemClock())
    await service.start()
    await service.incidents.stop(grace=0)
    try:
        clock = service.clock
        for i in range(NODES):
            hello = made_up_hello(f"node-{i:03d}", gpus=8, nvlinks=18, ib_ports=8)
            service.fleet.on_hello(hello, clock.monotonic(), clock.now())
            samples = [
                sample_to_pb(Target.gpu(g.uuid), "temperature_celsius", 50 + i % 20)
                for g in hello.gpus
            ]
            service.fleet.apply_samples(hello.node, samples)
        yield service
    finally:
        await service.stop(grace=None)


def bring_back(busy: CollectorService) -> None:
    """``NODES`` more nodes say Hello and send their first Report (a restart's returns)."""
    clock = busy.clock
    for i in range(NODES):
        hello = made_up_hello(f"back-{i:03d}", gpus=8, nvlinks=18, ib_ports=8)
        busy.fleet.on_hello(hello, clock.monotonic(), clock.now())
        samples = [sample_to_pb(Target.gpu(g.uuid), "temperature_celsius", 40) for g in hello.gpus]
        busy.fleet.apply_samples(hello.node, samples)


def xid(busy: CollectorService, node: str) -> None:
    """An Xid 13 on GPU 0 of a node that :func:`bring_back` brought."""
    gpu = Target.gpu(made_up_hello(node, gpus=8, nvlinks=18, ib_ports=8).gpus[0].uuid)
    busy.fleet.apply_event(node, EventKind.XID, gpu, 13)


async def test_a_long_tick_lets_other_work_run(busy: CollectorService):
    clock = busy.clock
    turns = 0
    stop = asyncio.Event()

    async def beside() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(beside())
    await asyncio.sleep(0)  # it starts
    began_turns, began = turns, clock.monotonic()
    await busy.incidents.tick()
    took = clock.monotonic() - began
    stop.set()
    await task
    assert took > 5 * TICK_SLICE_S, f"the tick took {took:.3f} s: too short to show slices"
    assert busy.incidents.slices >= 3
    assert turns - began_turns >= busy.incidents.slices  # it ran between the slices


async def test_an_event_during_a_long_tick_is_acted_on_before_it_ends(busy: CollectorService):
    """A node's Xid that arrives while a regular tick evaluates hundreds of nodes fires its
    incident at the tick's next turn, not after the tick (the node is not among the tick's)."""
    clock = busy.clock
    late = made_up_hello("late", gpus=1, ib_ports=0)

    async def xid_meanwhile() -> None:
        await asyncio.sleep(0)  # the tick has begun
        busy.fleet.on_hello(late, clock.monotonic(), clock.now())
        gpu = Target.gpu(late.gpus[0].uuid)
        busy.fleet.apply_event("late", EventKind.XID, gpu, 13)

    task = asyncio.create_task(xid_meanwhile())
    await busy.incidents.tick()
    await task
    assert busy.incidents.urgent_between >= 1
    fired = {(i.rule, i.node) for i in busy.evaluator.engine.open_incidents()}
    assert ("xid_application_error", "late") in fired


async def test_what_a_slice_finds_is_journaled_before_the_tick_ends(busy: CollectorService):
    """An incident found in a long tick's first slices is journaled (and acted on) at the next
    turn, not when the whole tick is done: at 4,096 nodes a regular tick lasts some 160 ms."""
    clock = busy.clock
    for i in range(NODES):
        gpu = next(iter(busy.fleet.view()[f"node-{i:03d}"].gpus.values()))
        busy.fleet.apply_samples(
            f"node-{i:03d}", [sample_to_pb(Target.gpu(gpu.uuid), "remap_pending", 1)]
        )
    slices_before = busy.incidents.slices
    seen_after_slices: int | None = None  # the tick's turns taken when a row was first seen
    ticking = True

    async def watch() -> None:
        nonlocal seen_after_slices
        while ticking and seen_after_slices is None:
            if await busy.journal.do(lambda s: s.incidents.incidents(open_only=True, limit=1)):
                seen_after_slices = busy.incidents.slices - slices_before

    task = asyncio.create_task(watch())
    began = clock.monotonic()
    outcomes = await busy.incidents.tick()
    took = clock.monotonic() - began
    ticking = False
    await task
    fired = {o.transition.incident.id for o in outcomes if o.rule.name == "row_remap_pending"}
    assert len(fired) == NODES
    assert took > 5 * TICK_SLICE_S, f"the tick took {took:.3f} s: too short to show slices"
    slices = busy.incidents.slices - slices_before
    assert seen_after_slices is not None
    assert seen_after_slices <= slices // 2, (
        f"the first incident was journaled after {seen_after_slices} of the tick's {slices} slices"
    )
    rows = await busy.journal.do(lambda s: s.incidents.incidents(open_only=True, limit=1000))
    assert len({r.id for r in rows if r.rule == "row_remap_pending"}) == NODES


async def test_an_urgent_tick_within_a_long_tick_is_sliced_too(busy: CollectorService):
    """An event during a long tick, while hundreds of nodes come back (a restart), gets a tick of
    its own at the next turn. The loop keeps getting turns through it and the rest of the tick:
    when that tick was an urgent one over every node back since, unsliced, it held every stream
    for its length.

    Timed in the loop thread's CPU time: a loaded machine that takes the CPU away from the
    process for a while (a wall-clock gap as long as a tick's quarter) is no unsliced tick."""
    cpu = time.thread_time  # every task here runs on the loop's thread
    stamps: list[float] = []
    stop = asyncio.Event()
    set_up_at: float | None = None

    async def beside() -> None:
        while not stop.is_set():
            stamps.append(cpu())
            await asyncio.sleep(0)

    async def fleet_back_meanwhile() -> None:
        nonlocal set_up_at
        await asyncio.sleep(0)  # the regular tick has begun
        bring_back(busy)
        xid(busy, "back-000")
        set_up_at = cpu()

    watcher = asyncio.create_task(beside())
    arrivals = asyncio.create_task(fleet_back_meanwhile())
    began = cpu()
    await busy.incidents.tick()
    took = cpu() - began
    stop.set()
    await asyncio.gather(watcher, arrivals)
    assert busy.incidents.urgent_between >= 1
    fired = {(i.rule, i.node) for i in busy.evaluator.engine.open_incidents()}
    assert ("xid_application_error", "back-000") in fired
    assert set_up_at is not None
    after = [t for t in stamps if t >= set_up_at]
    assert took - (set_up_at - began) > 20 * TICK_SLICE_S, f"too short to show slices: {took:.3f}"
    gaps = [b - a for a, b in itertools.pairwise(after)]
    # the nested tick is about half of what is left of the tick: unsliced, one gap that long
    assert max(gaps) < (took - (set_up_at - began)) / 4, (
        f"the loop waited {max(gaps) * 1000:.0f} ms at once in a tick of {took * 1000:.0f} ms"
    )


async def test_an_event_during_an_events_tick_waits_a_slice_not_a_fleet(busy: CollectorService):
    """A second Xid that arrives while the first is evaluated within a long tick fires within a
    few slices. The tick for the first evaluates only what events marked: when it evaluated
    every node back since the last tick as well (hundreds after a restart, seconds at 4,096
    nodes), the second waited for all of them."""
    engine = busy.evaluator.engine
    slices_waited: int | None = None

    async def arrivals() -> None:
        nonlocal slices_waited
        await asyncio.sleep(0)  # the regular tick has begun
        bring_back(busy)
        xid(busy, "back-000")
        while busy.incidents.urgent_between == 0:  # its tick has begun
            await asyncio.sleep(0)
        xid(busy, "back-001")
        at = busy.incidents.slices
        while ("xid_application_error", "back-001") not in {
            (i.rule, i.node) for i in engine.open_incidents()
        }:
            await asyncio.sleep(0)
        slices_waited = busy.incidents.slices - at

    task = asyncio.create_task(arrivals())
    await busy.incidents.tick()
    while not task.done():  # the second's incident may come at the next tick
        await busy.incidents.tick(urgent=True)
    await task
    assert slices_waited is not None
    assert slices_waited <= 3, f"the second Xid waited {slices_waited} slices for its incident"
