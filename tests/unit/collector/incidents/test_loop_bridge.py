"""The HTTP threads' bridge to the event loop: a bounded wait, and no work done behind a 503."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, cast

import pytest

from collector.exceptions import LoopBusyError
from collector.incidents.service import DrainDesk
from fleetwatch.testing import wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

    from collector.actions.dispatcher import Dispatcher


class Desk:
    """What DrainDesk asks of the dispatcher, counting the calls that ran on the loop."""

    def __init__(self) -> None:
        self.reads = 0
        self.releases: list[str] = []
        self.go = threading.Event()  # cleared: a release is held until the test sets it
        self.go.set()

    def drains(self) -> dict[str, Any]:
        self.reads += 1
        return {"drained": []}

    async def release(self, node: str, _reason: str, _by: str = "") -> bool:
        await asyncio.sleep(0)
        while not self.go.is_set():  # a slow release, as long as the test wants
            await asyncio.sleep(0.01)
        self.releases.append(node)
        return True


async def turns(count: int) -> None:
    """Give the loop ``count`` turns: work queued before this runs to its end meanwhile."""
    for _ in range(count):
        await asyncio.sleep(0)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running on a thread of its own, as the collector's does."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def desk_on(loop: asyncio.AbstractEventLoop, dispatcher: Desk, wait_s: float) -> DrainDesk:
    desk = DrainDesk(cast("Dispatcher", dispatcher))
    desk.bind(loop)
    desk.wait_s = wait_s
    return desk


class TestLoopBridge:
    def test_work_the_loop_had_not_begun_never_runs(self, loop):
        """The loop is held (a callback that blocks it) past the wait: the call raises
        LoopBusyError saying nothing was done, and once the loop is free the work does not run."""
        dispatcher = Desk()
        desk = desk_on(loop, dispatcher, wait_s=0.1)
        free = threading.Event()
        loop.call_soon_threadsafe(free.wait)
        with pytest.raises(LoopBusyError, match="nothing was done") as caught:
            desk.release("node-1", "fixed")
        assert caught.value.started is False
        with pytest.raises(LoopBusyError):
            desk.drains()
        free.set()
        # Queued before these turns, the work (a turn, or two for a release) would run in them.
        asyncio.run_coroutine_threadsafe(turns(5), loop).result(timeout=10)
        assert (dispatcher.releases, dispatcher.reads) == ([], 0)

    def test_work_that_began_is_said_to_be_under_way(self, loop):
        """A release that began but outlasts the wait: LoopBusyError says it may still take
        effect, and it does. (What the loop answers in time is returned as ever.)"""
        dispatcher = Desk()
        dispatcher.go.clear()  # the release outlasts any wait, until let go below
        # A wait the idle loop answers (and begins the release) within on a loaded machine.
        desk = desk_on(loop, dispatcher, wait_s=1.0)
        assert desk.drains() == {"drained": []}
        with pytest.raises(LoopBusyError, match="may still take effect") as caught:
            desk.release("node-1", "fixed")
        assert caught.value.started is True
        assert dispatcher.releases == []
        dispatcher.go.set()
        released = wait_until(lambda: dispatcher.releases == ["node-1"], what="the release")
        asyncio.run_coroutine_threadsafe(released, loop).result(timeout=30)

    def test_a_closed_loop_is_busy_not_a_crash(self):
        loop = asyncio.new_event_loop()
        loop.close()
        desk = desk_on(loop, Desk(), wait_s=0.1)
        with pytest.raises(LoopBusyError, match="nothing was done"):
            desk.drains()
