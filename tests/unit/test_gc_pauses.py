"""The collector freezes what survives each full collection, and thaws it now and then."""

from __future__ import annotations

import asyncio
from typing import Any

from collector.gc_pauses import YOUNG_THRESHOLD, FullCollectionFreezer
from fleetwatch.testing import FakeClock


class FakeGc:
    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.calls: list[str] = []
        self.threshold = (700, 10, 10)

    def collect(self, generation: int) -> None:
        for callback in list(self.callbacks):
            callback("start", {"generation": generation})
            callback("stop", {"generation": generation, "collected": 0, "uncollectable": 0})

    def get_threshold(self) -> tuple[int, int, int]:
        return self.threshold

    def set_threshold(self, threshold0: int, threshold1: int, threshold2: int) -> None:
        self.threshold = (threshold0, threshold1, threshold2)

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")

    def get_freeze_count(self) -> int:
        return 0


async def step(clock: FakeClock, seconds: float = 1.0) -> None:
    clock.advance(seconds)
    for _ in range(5):
        await asyncio.sleep(0)


async def test_survivors_of_a_full_collection_are_frozen_and_thawed_hourly():
    clock = FakeClock()
    fake = FakeGc()
    freezer = FullCollectionFreezer(clock, gc_module=fake, thaw_every_s=3600.0)
    task = asyncio.create_task(freezer.run())
    await step(clock, 0.0)
    await step(clock)
    assert fake.calls == []  # no collection yet
    assert fake.threshold == (YOUNG_THRESHOLD, 10, 10)
    fake.collect(0)
    fake.collect(1)
    await step(clock)
    assert fake.calls == []  # young collections leave things be
    fake.collect(2)
    await step(clock)
    assert fake.calls == ["freeze"]
    await step(clock)
    assert fake.calls == ["freeze"]  # once per full collection
    fake.collect(2)
    await step(clock, 3600.0)
    assert fake.calls == ["freeze", "unfreeze"]  # an hour on: the whole heap is walked again
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert fake.callbacks == []
    assert fake.threshold == (700, 10, 10)  # the interpreter as it was
    assert fake.calls[-1] == "unfreeze"
