"""The agent's link against collectors that misbehave."""

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from agent.link.backoff import Backoff
from agent.link.intervals import Intervals
from agent.link.stream import CollectorLink
from agent.outbox.changes import LiveSamples
from agent.outbox.queue import Outbox
from fleetwatch.clock import SystemClock
from fleetwatch.model import SampleKey, SampleValue, Target
from fleetwatch.testing import wait_until
from fleetwatch.wire import settings
from fleetwatch.wire.grouped import keyed_samples
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

pytestmark = pytest.mark.integration


async def test_silent_collector_is_abandoned_and_retried(tmp_path: Path):
    """A collector that takes the stream but never sends a Welcome does not hold the agent:
    the link gives up after its timeout and tries again."""
    hellos = 0

    async def silent(_requests: object, context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
        nonlocal hellos
        await context.read()
        hellos += 1
        await asyncio.sleep(3600)

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        settings.SERVICE_NAME,
        {"Stream": grpc.stream_stream_rpc_method_handler(silent)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    link = CollectorLink(
        targets=[f"127.0.0.1:{port}"],
        hello=lambda: pb.Hello(node="n", boot_id="b", protocol_version=1),
        outbox=Outbox("b"),
        live=LiveSamples(),
        clock=SystemClock(),
        backoff=Backoff(0.05, 0.1),
        intervals=Intervals(poll=1.0, heartbeat=1.0),
        welcome_timeout=0.2,
    )
    task = asyncio.create_task(link.run())
    try:
        await wait_until(lambda: link.failures >= 2, timeout=10, what="two abandoned attempts")
        assert hellos >= 2
        assert not link.connected
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)


async def test_a_cancel_that_grpc_turns_into_its_own_error_still_ends_the_link():
    """gRPC may answer the cancellation of a task awaiting a call with an error of its own
    (InvalidStateError 'RPC already finished', or CANCELLED): the link must end, not retry."""
    link = CollectorLink(
        targets=["127.0.0.1:1"],
        hello=lambda: pb.Hello(node="n", boot_id="b", protocol_version=1),
        outbox=Outbox("b"),
        live=LiveSamples(),
        clock=SystemClock(),
        backoff=Backoff(0.01, 0.02),
        intervals=Intervals(poll=1.0, heartbeat=1.0),
    )
    streaming = asyncio.Event()

    async def stream_that_swallows_cancel() -> None:
        streaming.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise asyncio.InvalidStateError("RPC already finished.") from None

    link._connect_once = stream_that_swallows_cancel  # type: ignore[method-assign]
    task = asyncio.create_task(link.run())
    await asyncio.wait_for(streaming.wait(), 5)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done, "the link went on after its task was cancelled"
    assert task.cancelled()
    assert link.failures == 0


async def test_a_cancel_that_comes_with_the_welcome_still_ends_the_link():
    """The link's task cancelled just as the Welcome arrived (a simulated crash right after a
    connect): Python 3.11's wait_for hands back the Welcome and drops the cancellation, and the
    link streamed on, its stream open, the crash waiting on it (a test hung two minutes)."""

    async def collector(
        requests: object, context: grpc.aio.ServicerContext[pb.AgentMessage, pb.CollectorMessage]
    ) -> None:
        await context.read()  # the Hello
        await context.write(pb.CollectorMessage(welcome=pb.Welcome(collector_version="t")))
        while isinstance(await context.read(), pb.AgentMessage):
            pass

    server, port = await stand_in(collector)
    clock = SystemClock()
    link = link_to(port, LiveSamples(), clock)
    handshake = link._handshake

    async def welcomed_as_cancelled(call: object, hello: pb.Hello) -> object:
        first = await handshake(call, hello)  # type: ignore[arg-type]
        task.cancel()  # comes in the same turn of the loop as the Welcome
        return first

    link._handshake = welcomed_as_cancelled  # type: ignore[method-assign]
    task = asyncio.create_task(link.run())
    try:
        done, _ = await asyncio.wait({task}, timeout=10)
        assert done, "the link went on after its task was cancelled"
        assert task.cancelled()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)


StandIn = Callable[
    [object, grpc.aio.ServicerContext[pb.AgentMessage, pb.CollectorMessage]], Awaitable[None]
]


async def stand_in(collector: StandIn) -> tuple[grpc.aio.Server, int]:
    """A started gRPC server whose Stream method is ``collector``; and its port."""
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        settings.SERVICE_NAME,
        {
            "Stream": grpc.stream_stream_rpc_method_handler(
                collector,
                request_deserializer=pb.AgentMessage.FromString,
                response_serializer=pb.CollectorMessage.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def link_to(port: int, live: LiveSamples, clock: SystemClock) -> CollectorLink:
    """An agent's link to the stand-in on ``port``: node "n", a 1 s poll, a 30 s heartbeat."""
    return CollectorLink(
        targets=[f"127.0.0.1:{port}"],
        hello=lambda: pb.Hello(node="n", boot_id="b", protocol_version=1),
        outbox=Outbox("b"),
        live=live,
        clock=clock,
        backoff=Backoff(0.05, 0.1),
        intervals=Intervals(poll=1.0, heartbeat=30.0),
    )


class TakenAt(LiveSamples):
    """Live samples that note when the sender took each value of one series, by its clock.

    A take_all is timed before it reads the clock and a take_changes after, so two notes are
    at least as far apart as the takes that the pace judged. ``then`` is an update made right
    after the first take_all, at the same moment on the agent's clock.
    """

    __slots__ = ("_key", "_now", "taken", "then")

    def __init__(
        self,
        key: SampleKey,
        gauge_interval: float,
        monotonic: Callable[[], float],
        then: dict[SampleKey, SampleValue],
    ) -> None:
        super().__init__(gauge_interval, monotonic)
        self._key = key
        self._now = monotonic
        self.then = then
        self.taken: list[tuple[float, SampleValue]] = []

    def take_all(self) -> list[tuple[SampleKey, SampleValue]]:
        at = self._now()
        taken = super().take_all()
        self._note(at, taken)
        if self.then:
            self.update(self.then)
            self.then = {}
        return taken

    def take_changes(self) -> list[tuple[SampleKey, SampleValue]]:
        taken = super().take_changes()
        self._note(self._now(), taken)
        return taken

    def _note(self, at: float, taken: list[tuple[SampleKey, SampleValue]]) -> None:
        self.taken += [(at, value) for key, value in taken if key == self._key]


async def test_a_held_gauge_travels_when_its_pace_is_over_without_another_change():
    """A GPU's temperature that moved once, right after it travelled, is held back by
    gauge_interval; the sender wakes for it when it is due, though nothing else changes."""
    reports: list[dict[str, float]] = []
    clock = SystemClock()

    async def collector(
        requests: object, context: grpc.aio.ServicerContext[pb.AgentMessage, pb.CollectorMessage]
    ) -> None:
        await context.read()  # the Hello
        await context.write(pb.CollectorMessage(welcome=pb.Welcome(collector_version="t")))
        while isinstance(msg := await context.read(), pb.AgentMessage):
            if msg.WhichOneof("body") == "report":
                reports.append({s.signal: s.int_value or s.real_value for s in msg.report.samples})

    server, port = await stand_in(collector)
    key = (Target.gpu("GPU-00000000-0000"), "temperature_celsius")
    live = TakenAt(key, 0.6, clock.monotonic, then={key: 75})  # moved at once: held
    live.update({key: 60})
    link = link_to(port, live, clock)
    task = asyncio.create_task(link.run())
    try:
        await wait_until(
            lambda: any(v.get("temperature_celsius") == 75 for v in reports),
            what="the held temperature",
        )
        (first_at, first), (at, held) = live.taken
        assert (first, held) == (60, 75)
        # at its pace by the agent's clock, and not at the heartbeat's 30 s
        assert 0.6 <= at - first_at < link.intervals.heartbeat, at - first_at
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)


@pytest.mark.parametrize("grouped", [True, False])
async def test_the_agent_groups_its_samples_only_for_a_collector_that_reads_them(grouped):
    """After a Welcome with grouped_reports the first Report carries its samples grouped by
    target (Report.targets); a collector that does not say so (an older one) gets one Sample
    each, which is all it reads."""
    first: list[pb.Report] = []

    async def collector(
        requests: object, context: grpc.aio.ServicerContext[pb.AgentMessage, pb.CollectorMessage]
    ) -> None:
        await context.read()  # the Hello
        welcome = pb.Welcome(collector_version="t", grouped_reports=grouped)
        await context.write(pb.CollectorMessage(welcome=welcome))
        while isinstance(msg := await context.read(), pb.AgentMessage):
            if msg.WhichOneof("body") == "report" and not first:
                first.append(msg.report)

    server, port = await stand_in(collector)
    clock = SystemClock()
    gpu = Target.gpu("GPU-00000000-0000")
    live = LiveSamples(0.0, clock.monotonic)
    live.update(
        {
            (gpu, "temperature_celsius"): 60,
            (gpu, "power_watts"): 350.5,
            (Target.nvlink("GPU-00000000-0000", 3), "nvlink_up"): 1,
            (Target.ib_port("mlx5_0", 1), "ib_state"): "ACTIVE",
        }
    )
    link = link_to(port, live, clock)
    task = asyncio.create_task(link.run())
    try:
        await wait_until(lambda: bool(first), timeout=10, what="the first report")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)
    report = first[0]
    values = {(key[0], signal): value for key, signal, value in keyed_samples(report)}
    assert {k: v for k, v in values.items() if k[0] != pb.TARGET_KIND_NODE} == {
        (pb.TARGET_KIND_GPU, "temperature_celsius"): 60,
        (pb.TARGET_KIND_GPU, "power_watts"): 350.5,
        (pb.TARGET_KIND_NVLINK, "nvlink_up"): 1,
        (pb.TARGET_KIND_IB_PORT, "ib_state"): "ACTIVE",
    }
    if grouped:  # the GPU, its NVLink, the port and the link's own node samples
        assert not report.samples
        assert len(report.targets) == 4
        gpu_group = next(g for g in report.targets if g.target.kind == pb.TARGET_KIND_GPU)
        assert list(gpu_group.int_signals) == ["temperature_celsius"]
        assert list(gpu_group.real_values) == [350.5]
    else:
        assert not report.targets
        assert len(report.samples) == len(values)
