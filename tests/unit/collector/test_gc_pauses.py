"""The collector freezes its heap ten times a second and collects it all now and then."""

from __future__ import annotations

import asyncio
from typing import Any

from collector.gc_pauses import (
    FREEZE_EVERY_S,
    GARBAGE_LIMIT,
    GROWTH_CHECK_EVERY_S,
    MIN_BASELINE,
    NODES_FLOOR,
    YOUNG_THRESHOLD,
    Freezer,
)
from fleetwatch.testing import FakeClock


class FakeGc:
    """The gc module's calls, recorded; ``blocks`` (the heap) and ``garbage`` set by the test."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.calls: list[str] = []
        self.threshold = (700, 10, 10)
        self.blocks = 0
        self.garbage = 0  # what the next full collection finds

    def natural(self, generation: int) -> None:
        """A collection the interpreter ran by itself."""
        for callback in list(self.callbacks):
            callback("start", {"generation": generation})
            callback("stop", {"generation": generation, "collected": 0, "uncollectable": 0})

    def collect(self) -> int:
        self.calls.append("collect")
        self.natural(2)
        found, self.garbage = self.garbage, 0
        return found

    def get_threshold(self) -> tuple[int, int, int]:
        return self.threshold

    def set_threshold(self, threshold0: int, threshold1: int, threshold2: int) -> None:
        self.threshold = (threshold0, threshold1, threshold2)

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")

    def get_freeze_count(self) -> int:
        raise AssertionError("counting frozen objects walks the heap (170 ms at 4,096 nodes)")

    def heap_blocks(self) -> int:
        return self.blocks


async def turns(n: int) -> None:
    """Let the freezer's loop go round ``n`` times (FakeClock.sleep moves time itself)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def seconds(s: float) -> None:
    """Let ``s`` seconds of the freezer's loop pass (and a few turns more)."""
    await turns(round(s / FREEZE_EVERY_S) + 3)


def freezer_on(
    fake: FakeGc, full_every_s: float = 3600.0, nodes: list[int] | None = None
) -> tuple[Freezer, asyncio.Task[None]]:
    """A freezer on ``fake``; ``nodes[0]`` is the connected nodes (none when not given)."""
    connected = nodes if nodes is not None else [0]
    freezer = Freezer(
        FakeClock(),
        gc_module=fake,
        full_every_s=full_every_s,
        heap_blocks=fake.heap_blocks,
        nodes=lambda: connected[0],
    )
    return freezer, asyncio.create_task(freezer.run())


def young_frozen(freezer: Freezer) -> bool:
    """Read afresh (a plain attribute read is narrowed by mypy across awaits)."""
    return freezer.young_frozen


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_the_heap_is_frozen_every_tenth_of_a_second_and_put_back_at_the_end():
    fake = FakeGc()
    _, task = freezer_on(fake)
    await turns(1)
    assert fake.threshold == (YOUNG_THRESHOLD, 10, 10)
    assert fake.calls == ["freeze"]  # at start
    await turns(10)
    # a young collection never sees more than a tenth of a second's objects
    assert fake.calls == ["freeze"] * 11
    assert "collect" not in fake.calls
    await stop(task)
    assert fake.callbacks == []
    assert fake.threshold == (700, 10, 10)  # the interpreter as it was
    assert fake.calls[-1] == "unfreeze"


async def test_everything_is_collected_once_the_heap_doubles():
    fake = FakeGc()
    fake.blocks = 3_000_000
    freezer, task = freezer_on(fake)
    await seconds(GROWTH_CHECK_EVERY_S)
    assert "collect" not in fake.calls  # the same size: nothing to look for
    fake.blocks = 5_999_999
    await seconds(GROWTH_CHECK_EVERY_S)
    assert "collect" not in fake.calls
    fake.blocks = 6_000_000
    fake.calls.clear()
    await seconds(GROWTH_CHECK_EVERY_S)
    assert fake.calls[fake.calls.index("collect") - 1 : fake.calls.index("collect") + 2] == [
        "unfreeze",
        "collect",
        "freeze",
    ]
    assert freezer.full_runs == 1
    await stop(task)


async def test_a_small_heap_is_not_collected_for_every_doubling():
    fake = FakeGc()
    fake.blocks = 250_000  # a collector just started
    freezer, task = freezer_on(fake)
    fake.blocks = 750_000  # tripled, but far below twice MIN_BASELINE
    await seconds(2 * GROWTH_CHECK_EVERY_S)
    assert freezer.full_runs == 0
    fake.blocks = 2 * MIN_BASELINE
    await seconds(GROWTH_CHECK_EVERY_S)
    assert freezer.full_runs == 1
    await stop(task)


async def test_a_fleet_coming_back_is_not_collected_while_its_heap_grows_with_it():
    """A restart's storm grows the heap with each node back: no full collection (0.3-1 s
    with the loop stopped, while the nodes already back wait for acks) until the heap has
    doubled per connected node."""
    fake = FakeGc()
    fake.blocks = MIN_BASELINE  # a collector just started, no node connected
    connected = [0]
    freezer, task = freezer_on(fake, nodes=connected)
    await turns(1)  # started: the heap and the nodes measured
    for back in (512, 1024, 2048, 4096):  # ~3,800 blocks a node
        connected[0] = back
        fake.blocks = MIN_BASELINE + 3_800 * back
        await seconds(GROWTH_CHECK_EVERY_S)
    assert freezer.full_runs == 0  # 16.6 million blocks, 4,096 nodes: the same per node
    limit = 2 * MIN_BASELINE * 4096 / NODES_FLOOR
    fake.blocks = round(limit) - 1
    await seconds(GROWTH_CHECK_EVERY_S)
    assert freezer.full_runs == 0
    fake.blocks = round(limit)  # twice the heap per node: something grows that is not nodes
    await seconds(GROWTH_CHECK_EVERY_S)
    assert freezer.full_runs == 1
    # measured again from here: 4,096 nodes and what the collection left
    fake.blocks = 2 * round(limit) - 1
    await seconds(GROWTH_CHECK_EVERY_S)
    assert freezer.full_runs == 1
    fake.blocks = 2 * round(limit)
    await seconds(GROWTH_CHECK_EVERY_S)
    assert freezer.full_runs == 2
    await stop(task)


async def test_a_fleet_that_shrinks_still_collects_when_the_heap_doubles():
    """Fewer nodes than at the last collection never raise the limit above twice the heap."""
    fake = FakeGc()
    fake.blocks = 8_000_000
    connected = [4096]
    freezer, task = freezer_on(fake, nodes=connected)
    await turns(1)
    connected[0] = 100
    fake.blocks = 16_000_000
    await seconds(GROWTH_CHECK_EVERY_S)
    assert freezer.full_runs == 1
    await stop(task)


async def test_everything_is_collected_at_least_every_full_every_s():
    fake = FakeGc()
    freezer, task = freezer_on(fake, full_every_s=5.0)
    await seconds(5.0)
    assert freezer.full_runs == 1
    assert fake.calls.count("collect") == 1
    await stop(task)


async def test_cycles_coming_fast_hand_young_objects_back_to_the_collector_until_they_stop():
    fake = FakeGc()
    freezer, task = freezer_on(fake, full_every_s=1.0)
    fake.garbage = GARBAGE_LIMIT + 1
    await seconds(1.0)
    assert freezer.full_runs == 1
    assert not young_frozen(freezer)
    fake.calls.clear()
    await turns(5)
    assert fake.calls == []  # young collections find the cycles now
    fake.natural(0)
    await turns(1)
    assert fake.calls == []
    fake.natural(2)  # the interpreter's own full collection: its survivors are frozen
    await turns(1)
    assert fake.calls == ["freeze"]
    fake.garbage = 10  # the next full collection finds little: frozen ten times a second again
    await seconds(1.0)
    assert young_frozen(freezer)
    fake.calls.clear()
    await turns(3)
    assert fake.calls == ["freeze"] * 3
    await stop(task)
