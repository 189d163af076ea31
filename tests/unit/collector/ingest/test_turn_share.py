"""Heavy messages take a bounded share of each turn of the event loop; light ones are not stuck.

A fake timer stands for the work's cost: each piece of work says how long it took.
"""

import asyncio
from collections.abc import Callable

import pytest

from collector.ingest.turns import TurnShare


class Costs:
    """A timer that work advances by its cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def work(self, name: str, cost_s: float, log: list[str]) -> Callable[[], str]:
        def run() -> str:
            self.now += cost_s
            log.append(name)
            return name

        return run


async def test_work_runs_inline_while_the_turn_has_budget():
    costs, log = Costs(), list[str]()
    share = TurnShare((0.004, 0.010), timer=costs)
    assert await share.run(costs.work("a", 0.001, log)) == "a"
    assert log == ["a"]
    assert share.queued == 0


async def test_past_the_budget_work_waits_for_later_turns_and_light_work_goes_first():
    """Four 3 ms pieces with a 4 ms budget: two run in this turn, the rest at later turns; a
    light callback that became ready meanwhile runs before them."""
    costs, log = Costs(), list[str]()
    share = TurnShare((0.004, 0.004), timer=costs)
    tasks = [asyncio.create_task(share.run(costs.work(n, 0.003, log))) for n in "abcd"]
    await asyncio.sleep(0)  # the tasks start: a and b fit this turn (b crosses the budget)
    assert log == ["a", "b"]
    asyncio.get_running_loop().call_soon(log.append, "light")
    assert await asyncio.gather(*tasks) == ["a", "b", "c", "d"]
    assert log.index("light") < log.index("c")
    assert share.queued == 2
    assert share.turns >= 1


async def test_queued_work_keeps_its_order_and_its_exceptions():
    costs, log = Costs(), list[str]()
    share = TurnShare((0.001, 0.001), timer=costs)

    def broken() -> str:
        costs.now += 0.002
        msg = "bad report"
        raise ValueError(msg)

    first = asyncio.create_task(share.run(costs.work("first", 0.002, log)))
    second = asyncio.create_task(share.run(broken))
    third = asyncio.create_task(share.run(costs.work("third", 0.002, log)))
    assert await first == "first"
    with pytest.raises(ValueError, match="bad report"):
        await second
    assert await third == "third"
    assert log == ["first", "third"]


async def test_work_whose_caller_went_away_is_not_run():
    costs, log = Costs(), list[str]()
    share = TurnShare((0.001, 0.001), timer=costs)
    first = asyncio.create_task(share.run(costs.work("first", 0.002, log)))
    gone = asyncio.create_task(share.run(costs.work("gone", 0.002, log)))
    last = asyncio.create_task(share.run(costs.work("last", 0.002, log)))
    await asyncio.sleep(0)  # first runs inline; the other two wait
    gone.cancel()
    assert await first == "first"
    assert await last == "last"
    assert log == ["first", "last"]


async def test_a_turn_with_more_else_to_do_gives_heavy_work_more_within_its_bound():
    """The budget is three times what the rest of the last turn took, within its bounds: an
    idle loop lets heavy work have the most, and never more."""
    costs, log = Costs(), list[str]()
    share = TurnShare((0.002, 0.006), timer=costs)
    tasks = [asyncio.create_task(share.run(costs.work(f"w{i}", 0.001, log))) for i in range(40)]
    await asyncio.sleep(0)
    ran_inline = len(log)
    per_turn: list[int] = []
    while len(log) < 40:
        before = len(log)
        costs.now += 0.010  # the rest of the turn: other callbacks took 10 ms
        await asyncio.sleep(0)
        per_turn.append(len(log) - before)
    await asyncio.gather(*tasks)
    assert ran_inline == 2  # the least budget before anything was measured
    assert max(per_turn) == 6  # 3 x 10 ms, held to the most: 6 ms, six pieces
