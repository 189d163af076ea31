"""The NVML guard: a hung call costs one deadline, later calls fail fast, one thread at most."""

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent.exceptions import SourceError
from agent.poll.sampler import Sampler
from agent.sim.hardware import SimNode
from agent.sources.nvml import NvmlSource
from agent.sources.nvml_events import NvmlEventWatcher
from agent.sources.nvml_guard import NvmlGuard, NvmlHungError
from agent.sources.sysfs import SysfsReader
from fleetwatch.clock import SystemClock
from fleetwatch.model import EventKind, SampleKey, SampleValue, Target
from fleetwatch.testing import FakeClock, wait_until
from rules.xid_catalog import load_catalog

DEADLINE_S = 0.3
hung_key = (Target.node(), "agent_nvml_hung")


def worker_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "nvml-calls" and t.is_alive()}


class TestNvmlGuard:
    def test_values_and_errors_come_back(self):
        """A call that returns gives its value; one that raises raises the same error here."""
        guard = NvmlGuard(DEADLINE_S)
        assert guard.run("answer", lambda: 42) == 42
        with pytest.raises(SourceError, match="boom"):
            guard.run("fails", lambda: (_ for _ in ()).throw(SourceError("nvml", "boom")))
        assert not guard.hung
        assert guard.timed_out == 0
        guard.close()

    async def test_a_hung_call_ends_the_wait_and_later_calls_fail_fast(self):
        """The stuck call raises after the deadline; calls after it are refused without running
        (not queued behind it); once it returns, calls run again. Each step is logged once."""
        guard = NvmlGuard(DEADLINE_S)
        gate = threading.Event()
        ran: list[str] = []
        before = worker_threads()  # idle workers of earlier tests may still be about
        try:
            with capture_logs() as logs:
                with pytest.raises(NvmlHungError) as first:
                    guard.run("stuck call", gate.wait)
                assert first.value.timed_out
                assert guard.hung
                for _ in range(5):
                    with pytest.raises(NvmlHungError, match="stuck call") as later:
                        guard.run("later call", lambda: ran.append("later"))
                    assert not later.value.timed_out
                assert (guard.timed_out, guard.refused) == (1, 5)
                assert len(worker_threads() - before) == 1  # no second thread to get around it
            gate.set()
            await wait_until(lambda: not guard.hung, what="the stuck call to return")
            with capture_logs() as back:
                assert guard.run("after", lambda: "fine") == "fine"
            assert ran == []  # the refused calls never ran, not even after the release
        finally:
            gate.set()
            guard.close()
        assert [e["event"] for e in logs] == ["nvml_call_hung"]
        assert [e["event"] for e in back] == ["nvml_call_returned"]
        assert back[0]["call"] == "stuck call"

    async def test_an_awaited_call_leaves_the_loop_free(self):
        """Awaited, a call stuck in NVML holds only its caller: other tasks run meanwhile."""
        guard = NvmlGuard(600)  # a deadline this test never reaches
        gate = threading.Event()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        beside = asyncio.create_task(ticker())
        try:
            stuck = asyncio.create_task(guard.call("stuck call", lambda: gate.wait() and "back"))
            await wait_until(lambda: ticks > 1000, what="other tasks to run meanwhile")
            assert not stuck.done()
            gate.set()
            assert await stuck == "back"
            assert guard.timed_out == 0
        finally:
            gate.set()
            beside.cancel()
            guard.close()

    async def test_an_awaited_call_has_the_deadline_and_the_refusals(self):
        """An awaited call that hangs raises at the deadline; later ones are refused at once
        (not queued behind it); once it returns, calls run again."""
        guard = NvmlGuard(DEADLINE_S)
        gate = threading.Event()
        try:
            with pytest.raises(NvmlHungError) as first:
                await guard.call("stuck call", gate.wait)
            assert first.value.timed_out
            with pytest.raises(NvmlHungError, match="not tried"):
                await guard.call("later call", lambda: None)
            gate.set()
            await wait_until(lambda: not guard.hung, what="the stuck call to return")
            assert await guard.call("after", lambda: "fine") == "fine"
            assert (guard.timed_out, guard.refused) == (1, 1)
        finally:
            gate.set()
            guard.close()

    async def test_a_cancelled_call_ends_even_as_its_work_returns(self):
        """A call cancelled just as NVML answers is cancelled, not carried on (a cancelled poll
        went on polling, and the agent could not stop): whatever the loop did with the answer
        before the cancellation, a cancel of an unfinished call is honoured."""
        guard = NvmlGuard(600)
        loop = asyncio.get_running_loop()
        queued = threading.Event()  # set once a thread queued a callback on the loop
        call_soon_threadsafe = loop.call_soon_threadsafe

        def noted(*args: Any, **kwargs: Any) -> asyncio.Handle:
            handle = call_soon_threadsafe(*args, **kwargs)
            queued.set()
            return handle

        loop.call_soon_threadsafe = noted  # type: ignore[method-assign,assignment]
        try:
            for steps in range(5):  # loop iterations between the answer and the cancellation
                working, answer = threading.Event(), threading.Event()

                def work(
                    working: threading.Event = working, answer: threading.Event = answer
                ) -> bool:
                    working.set()
                    return answer.wait()

                call = asyncio.create_task(guard.call("answer", work))
                await wait_until(working.is_set, what="the work to start")
                queued.clear()
                answer.set()
                # Holding the loop until the worker has returned and queued its wake-up.
                assert queued.wait(timeout=30), "the worker did not wake the loop"
                for _ in range(steps):
                    await asyncio.sleep(0)
                if call.cancel():
                    with pytest.raises(asyncio.CancelledError):
                        await call
                else:
                    assert await call
        finally:
            loop.call_soon_threadsafe = call_soon_threadsafe  # type: ignore[method-assign]
            guard.close()

    async def test_an_awaited_call_gives_its_value_or_its_error(self):
        """What the work returns comes back; what it raises is raised to the awaiting task."""
        guard = NvmlGuard(DEADLINE_S)
        assert await guard.call("answer", lambda: 42) == 42
        with pytest.raises(SourceError, match="boom"):
            await guard.call("fails", lambda: (_ for _ in ()).throw(SourceError("nvml", "boom")))
        assert not guard.hung
        guard.close()

    def test_a_nested_call_runs_on_the_worker_itself(self):
        """Work handed to the guard may call guarded methods: they run inline, not deadlocked."""
        guard = NvmlGuard(DEADLINE_S)
        assert guard.run("outer", lambda: guard.run("inner", lambda: 7) + 1) == 8
        guard.close()

    async def test_the_worker_ends_when_closed(self):
        """close() ends the worker thread."""
        guard = NvmlGuard(DEADLINE_S)
        before = worker_threads()
        guard.run("warm", lambda: None)
        (worker,) = worker_threads() - before
        guard.close()
        await wait_until(lambda: not worker.is_alive(), what="worker to end")

    def test_a_deadline_must_be_positive(self):
        """Zero or negative deadlines are refused."""
        with pytest.raises(ValueError, match="timeout_s"):
            NvmlGuard(0)


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode("node-a", tmp_path / "sys", FakeClock(), gpus=4, nvlinks=2, ib_ports=2)


def sampler_for(node: SimNode, *, events: NvmlEventWatcher | None = None) -> Sampler:
    return Sampler(
        nvml=NvmlSource(node.nvml, call_timeout_s=DEADLINE_S),
        nvml_events=events,
        sysfs=SysfsReader(node.sysfs.root),
        kmsg=node.kmsg,
        udev=node.udev,
        catalog=load_catalog(),
        clock=node.clock,
    )


def gpus_sampled(samples: dict[SampleKey, SampleValue], node: SimNode) -> list[int]:
    return [g.index for g in node.gpus if (Target.gpu(g.uuid), "gpu_present") in samples]


class TestSamplerWhenNvmlHangs:
    async def test_the_kernel_log_is_read_while_the_gpu_read_waits(self, node: SimNode):
        """The GPU read is awaited: with NVML hung and its deadline far off, a wake-up's read
        of the kernel log gives the Xid at once, and the GPU read finishes once NVML answers."""
        sampler = Sampler(
            nvml=NvmlSource(node.nvml, call_timeout_s=600),  # a deadline this test never reaches
            sysfs=SysfsReader(node.sysfs.root),
            kmsg=node.kmsg,
            udev=node.udev,
            catalog=load_catalog(),
            clock=node.clock,
        )
        sampler.discover()
        node.nvml_hang(1)
        try:
            devices = asyncio.create_task(sampler.poll_devices())
            await wait_until(lambda: node.nvml.blocked == 1, what="the GPU read to hang")
            node.xid(3, 13)
            events = sampler.poll_events().events
            assert [(e.kind, e.xid) for e in events] == [(EventKind.XID, 13)]
            assert not devices.done()
            assert sampler._nvml.guard.timed_out == 0
        finally:
            node.nvml_hang_clear()
        assert gpus_sampled((await devices).samples, node) == [0, 1, 2, 3]
        sampler.close()

    async def test_the_poll_goes_on_without_nvml_and_nvml_comes_back(self, node: SimNode):
        """GPU 2 hangs: the poll returns with GPUs 0 and 1, the kernel log's Xid and the IB
        ports; the next poll leaves NVML out at once; after the release every GPU is back."""
        sampler = sampler_for(node)
        sampler.discover()
        await sampler.poll()
        before = worker_threads()
        node.nvml_hang(2)
        try:
            node.xid(3, 13)  # the kernel log line (and an NVML event nobody waits for here)
            with capture_logs() as logs:
                hung = await sampler.poll()
            assert [(e.kind, e.xid) for e in hung.events] == [(EventKind.XID, 13)]
            assert gpus_sampled(hung.samples, node) == [0, 1]
            assert (Target.ib_port("mlx5_1", 1), "ib_state") in hung.samples
            assert hung.samples[Target.node(), "agent_nvml_hung"] == 1
            assert hung.samples[Target.node(), "agent_nvml_calls_timed_out"] == 1
            (stuck,) = [e for e in logs if e["event"] == "gpu_read_hung"]
            assert stuck["gpu_index"] == 2
            assert sampler.source_errors["nvml"] == 0  # a hang is not a read error per GPU

            node.ib_port_down(0)
            with capture_logs() as quiet:
                refused = await sampler.poll()
            assert gpus_sampled(refused.samples, node) == []
            assert [e.kind for e in refused.events] == [EventKind.IB_PORT_DOWN]
            assert refused.samples[Target.node(), "agent_nvml_calls_timed_out"] == 1
            assert [e for e in quiet if e["log_level"] in ("warning", "error")] == []
            assert len(worker_threads() - before) <= 1  # this sampler's one worker, stuck
            assert node.nvml.blocked == 1
        finally:
            node.nvml_hang_clear()
        await wait_until(lambda: not sampler._nvml.guard.hung, what="the stuck call to return")
        back = (await sampler.poll()).samples
        assert gpus_sampled(back, node) == [0, 1, 2, 3]
        assert back[hung_key] == 0
        sampler.close()

    def test_discovery_that_hangs_fails_whole_and_is_tried_again(self, node: SimNode):
        """A GPU whose identity does not come back fails discovery (no GPU silently left out)."""
        sampler = sampler_for(node)
        node.nvml_hang(1)
        try:
            with pytest.raises(NvmlHungError):
                sampler.discover()
            assert sampler.inventory.gpus == ()
            with pytest.raises(NvmlHungError, match="not tried"):
                sampler.discover()  # tried again while it still hangs: refused at once
        finally:
            node.nvml_hang_clear()
        inventory = None
        for _ in range(100):  # the stuck call returns; discovery then works
            try:
                inventory = sampler.discover()
                break
            except NvmlHungError:
                threading.Event().wait(0.05)
        assert inventory is not None
        assert [g.index for g in inventory.gpus] == [0, 1, 2, 3]
        sampler.close()


class TestEventWatcherWhenNvmlHangs:
    async def test_drain_never_blocks_and_stop_leaves_a_waiting_thread(self, node: SimNode):
        """With the event wait stuck, drain returns at once and stop returns without freeing the
        event set under the waiting call; after the release the thread ends."""
        watcher = NvmlEventWatcher(node.nvml, SystemClock(), timeout_ms=50)
        handles = {g.uuid: g for g in node.gpus}
        node.nvml.nvmlInit()
        assert watcher.start(handles)
        node.nvml_hang(0)
        try:
            await wait_until(lambda: node.nvml.blocked == 1, what="the wait to hang")
            node.xid(1, 31)  # queued in the event set, not delivered: the wait is stuck
            assert watcher.drain() == []
            with capture_logs() as logs:
                watcher.stop()
            assert [e["event"] for e in logs] == ["nvml_event_wait_hung"]
            assert node.nvml.event_sets  # not freed while a thread waits on it
        finally:
            node.nvml_hang_clear()
        await wait_until(lambda: not watcher.running, what="thread to end")
