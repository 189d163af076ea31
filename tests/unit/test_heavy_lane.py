"""Large Reports take turns: the event loop runs other work between slices of them.

In a reconnect storm thousands of first Reports (5 ms each) were ready in one turn of the loop,
which then ran for seconds with no stream read and no event acked (probe acks 33 s at p50 at
4,096 nodes). The lane does them in order, a slice at a time.
"""

from __future__ import annotations

import asyncio
import functools

import pytest

from collector.ingest.heavy_lane import HeavyLane


class Timer:
    """Seconds that pass only when work says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_other_work_runs_between_slices_and_results_come_back_in_order():
    timer = Timer()
    lane = HeavyLane(timer, slice_s=0.02)
    done: list[int] = []
    others: list[int] = []

    def work(n: int) -> int:
        timer.now += 0.01  # each item takes 10 ms: two make a slice
        done.append(n)
        return n * n

    async def other() -> None:
        while len(done) < 10:
            others.append(len(done))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(other())
    results = await asyncio.gather(*(lane.run(functools.partial(work, n)) for n in range(10)))
    await watcher
    assert results == [n * n for n in range(10)]
    assert done == list(range(10))
    # the other task saw the lane's progress at every slice, two items at a time
    assert {0, 2, 4, 6, 8} <= set(others)
    assert lane.turns == 4
    assert lane.done == 10


async def test_an_error_goes_to_its_caller_only():
    lane = HeavyLane(Timer())

    def bad() -> int:
        raise ValueError("a report that breaks the contract")

    results = await asyncio.gather(
        lane.run(lambda: 1), lane.run(bad), lane.run(lambda: 3), return_exceptions=True
    )
    assert results[0] == 1
    assert isinstance(results[1], ValueError)
    assert results[2] == 3


async def test_a_caller_that_went_away_has_its_work_skipped():
    timer = Timer()
    lane = HeavyLane(timer, slice_s=0.0)  # one item a slice
    done: list[str] = []
    first = asyncio.create_task(lane.run(lambda: done.append("first")))
    gone = asyncio.create_task(lane.run(lambda: done.append("gone")))
    last = asyncio.create_task(lane.run(lambda: done.append("last")))
    await asyncio.sleep(0)  # all three queued
    gone.cancel()
    await asyncio.gather(first, last)
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert done == ["first", "last"]
