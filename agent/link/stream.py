"""The agent's end of the stream: connect, say Hello, replay the outbox, send changes, heartbeat.

One bidirectional gRPC stream per connection. Two tasks share it: the sender (events first, then
changed samples, or an empty Report as a heartbeat) and the reader (acks, config, commands). Writes
go through one lock because gRPC allows one write in flight at a time. When either task ends the
stream is torn down and the link reconnects after a jittered, growing delay.

With several collectors (agent/link/collector_list.py) the link starts on the node's own and, when a
connect fails, no Welcome comes in time or the stream ends, tries the next in the list after a
short jittered delay; the delay grows only once a whole round of the list has failed. The new
collector's Welcome says what the journal holds, and the outbox replays the rest, as on any
reconnect. The link's place in the list and its moves travel as node samples
(:data:`INDEX_SIGNAL`, :data:`AWAY_SIGNAL`, :data:`FAILOVERS_SIGNAL`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Final, TypeAlias

import grpc
import structlog

from agent.link.collector_list import CollectorRotation
from fleetwatch.clock import unix_ms, wait_for_event
from fleetwatch.model import Target
from fleetwatch.wire import settings
from fleetwatch.wire.grouped import report_of
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from google.protobuf.message import Message

    from agent.jobs.listener import JobQueue
    from agent.link.backoff import Backoff
    from agent.link.commands import CommandRunner
    from agent.link.intervals import Intervals
    from agent.outbox.changes import LiveSamples
    from agent.outbox.queue import Outbox
    from agent.preflight.executor import PreflightExecutor
    from fleetwatch.clock import Clock

    Call: TypeAlias = grpc.aio.StreamStreamCall[Message, pb.CollectorMessage]

log = structlog.get_logger("agent.link")

# A connection that stayed up this long counts as healthy: the next failure starts the backoff
# from its smallest delay again.
HEALTHY_AFTER_S = 10.0
WELCOME_TIMEOUT_S = 30.0
# A collector that does not complete the TCP (and TLS) handshake in this time is given up on
# (gRPC's own limit is 20 s): a powered-off host should not hold the agent from the next one.
CONNECT_TIMEOUT_S = 5.0

INDEX_SIGNAL: Final = "agent_collector_index"  # the position in the list streamed to (from 0)
AWAY_SIGNAL: Final = "agent_collector_away"  # 1 while not on the node's own collector
FAILOVERS_SIGNAL: Final = "agent_collector_failovers"  # moves to another collector so far

# Why the link left a collector (the reason of ``collector_failover``).
CONNECT_FAILED: Final = "connect_failed"  # no connection, or the Hello was refused
NO_WELCOME: Final = "no_welcome"  # connected, but no Welcome within the timeout
STREAM_LOST: Final = "stream_lost"  # the stream broke after its Welcome
STREAM_CLOSED: Final = "stream_closed"  # the collector ended the stream (say, it shut down)


class ProtocolError(Exception):
    """The collector broke the contract (e.g. no Welcome after Hello)."""


def _raise_if_cancelled() -> None:
    """End the link when its task is being cancelled, whatever error the stream ended with.

    gRPC can turn the cancellation of a task awaiting a call into an error of its own (the
    call's CANCELLED, or InvalidStateError: 'RPC already finished'). Taken for a broken stream,
    it made the link reconnect for ever, and an agent stopping (or a simulated crash) waited on
    it: a CI run's agent restart hung for two minutes.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class CollectorLink:
    """Keeps one stream to a collector alive for as long as the agent runs."""

    def __init__(  # noqa: PLR0913 - everything here is an injected collaborator
        self,
        *,
        targets: Sequence[str],
        hello: Callable[[], pb.Hello],
        outbox: Outbox,
        live: LiveSamples,
        clock: Clock,
        backoff: Backoff,
        intervals: Intervals,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str | None = None,
        welcome_timeout: float = WELCOME_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        start: int = 0,
        commands: CommandRunner | None = None,
        jobs: JobQueue | None = None,
        preflight: PreflightExecutor | None = None,
    ) -> None:
        """Nothing connects until :meth:`run`, which starts on ``targets[start]``.

        ``credentials`` None is plaintext; with TLS, ``server_name`` is the name every
        collector's certificate must carry (None: the host of the target connected to).
        """
        self.rotation = CollectorRotation(targets, start)
        self.target = self.rotation.current
        self._hello = hello
        self._outbox = outbox
        self._live = live
        self._clock = clock
        self._backoff = backoff
        self.intervals = intervals
        self._credentials = credentials
        self._server_name = server_name
        self._welcome_timeout = welcome_timeout
        self._connect_timeout = connect_timeout
        self._commands = commands
        self._jobs = jobs
        self._preflight = preflight
        self._running: set[asyncio.Task[None]] = set()
        self.connected = False
        self.connections = 0
        self.grouped_reports = False  # what the last Welcome said (Report.targets read)
        self.failures = 0
        self._welcomed = False  # this attempt got its Welcome
        self.cut_until = 0.0  # monotonic: no stream before then (see cut_off)

    def cut_off(self, seconds: float) -> None:
        """End the stream now and open none for ``seconds``: a network partition, simulated.

        The agent goes on watching meanwhile; its events wait in the outbox and are sent when
        the link comes back. For the simulator and tests: nothing in production calls it.
        """
        self.cut_until = self._clock.monotonic() + seconds
        self._live.changed.set()  # the sender sees the cut at once

    async def run(self) -> None:
        """Connect, stream, and reconnect (to the next collector) with backoff, until cancelled."""
        while True:
            if (cut := self.cut_until - self._clock.monotonic()) > 0:
                await self._clock.sleep(cut)
            self.target = self.rotation.current
            self._publish()
            started = self._clock.monotonic()
            self._welcomed = False
            reason = STREAM_CLOSED
            try:
                await self._connect_once()
            except grpc.aio.AioRpcError as exc:
                _raise_if_cancelled()
                self.failures += 1
                reason = STREAM_LOST if self._welcomed else CONNECT_FAILED
                log.warning(
                    "stream_failed",
                    collector=self.target,
                    code=exc.code().name,
                    detail=exc.details(),
                )
            except Exception as exc:  # noqa: BLE001 - whatever broke this stream, reconnect
                # e.g. ProtocolError, OSError, or asyncio.InvalidStateError when gRPC finished
                # the call between our read and our write.
                _raise_if_cancelled()
                self.failures += 1
                reason = self._reason(exc)
                log.warning(
                    "stream_failed",
                    collector=self.target,
                    code=type(exc).__name__,
                    detail=str(exc),
                )
            finally:
                self.connected = False
            await self._clock.sleep(self._next(reason, self._clock.monotonic() - started))

    def _reason(self, exc: Exception) -> str:
        if self._welcomed:
            return STREAM_LOST
        return NO_WELCOME if isinstance(exc, TimeoutError) else CONNECT_FAILED

    def _next(self, reason: str, lasted: float) -> float:
        """Move on to the next collector; return how long to wait before connecting to it."""
        rotation = self.rotation
        left = rotation.current
        delay = rotation.next_try(self._backoff, healthy=lasted >= HEALTHY_AFTER_S)
        if rotation.current != left:
            log.warning(
                "collector_failover",
                **{"from": left, "to": rotation.current},
                reason=reason,
                failovers=rotation.moves,
                delay_s=round(delay, 3),
            )
        return delay

    def _publish(self) -> None:
        """Hand the link's place in the list to the next report, with the node's samples."""
        node, rotation = Target.node(), self.rotation
        self._live.update(
            {
                (node, INDEX_SIGNAL): rotation.index,
                (node, AWAY_SIGNAL): int(rotation.away),
                (node, FAILOVERS_SIGNAL): rotation.moves,
            },
        )

    def _channel(self) -> grpc.aio.Channel:
        options: list[tuple[str, int | str]] = [
            *settings.client_options(),
            # gRPC's connect timeout is the smallest reconnect backoff (20 s by default).
            ("grpc.min_reconnect_backoff_ms", int(self._connect_timeout * 1000)),
            # Each attempt its own connection: channels in one process otherwise share one
            # from a global pool, with the reconnect backoff (up to 120 s) it grew while the
            # collector was down, under our own backoff.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if self._credentials is None:
            return grpc.aio.insecure_channel(self.target, options=options)
        if self._server_name is not None:
            options.append(("grpc.ssl_target_name_override", self._server_name))
        return grpc.aio.secure_channel(self.target, self._credentials, options=options)

    async def _connect_once(self) -> None:
        async with self._channel() as channel:
            call: Call = channel.stream_stream(
                settings.STREAM_METHOD,
                request_serializer=pb.AgentMessage.SerializeToString,
                response_deserializer=pb.CollectorMessage.FromString,
            )()
            try:
                await self._stream(call)
            finally:
                call.cancel()

    async def _stream(self, call: Call) -> None:
        hello = self._hello()
        # Numbers below it are acked or lost: the stream may start past what the journal holds.
        hello.resume_seq = self._outbox.resume_seq
        # A collector that takes the stream but never answers (say, a stuck journal) must not
        # hold the agent forever: keepalive sees a healthy transport, so time out ourselves.
        first = await asyncio.wait_for(self._handshake(call, hello), self._welcome_timeout)
        # Python 3.11's wait_for returns the answer and drops a cancellation that came with it:
        # the link streamed on, and an agent stopping (or a simulated crash) waited on it.
        _raise_if_cancelled()
        if not isinstance(first, pb.CollectorMessage) or first.WhichOneof("body") != "welcome":
            msg = "collector did not answer the Hello with a Welcome"
            raise ProtocolError(msg)
        welcome = first.welcome
        if welcome.journaled.boot_id not in ("", hello.boot_id):
            msg = f"Welcome is for boot {welcome.journaled.boot_id}, not {hello.boot_id}"
            raise ProtocolError(msg)
        self._outbox.welcome(welcome.journaled.seq)
        self.intervals.apply(welcome.config)
        # A collector that says so reads samples grouped by target (half the bytes); an older
        # one reads only one Sample each.
        self.grouped_reports = welcome.grouped_reports
        self._welcomed = True
        self.connected = True
        self.connections += 1
        log.info(
            "stream_open",
            collector=self.target,
            journaled_seq=welcome.journaled.seq,
            replay=len(self._outbox),
        )
        lock = asyncio.Lock()
        tasks = {
            asyncio.create_task(self._send_loop(call, lock), name="link-send"),
            asyncio.create_task(self._read_loop(call, lock), name="link-read"),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await task
        for task in done:
            task.result()  # re-raise what ended the stream

    @staticmethod
    async def _handshake(call: Call, hello: pb.Hello) -> object:
        """Say Hello; return the collector's first answer (a Welcome, if it keeps the contract)."""
        await call.write(pb.AgentMessage(hello=hello))
        return await call.read()

    async def _command(self, call: Call, lock: asyncio.Lock, command: pb.Command) -> None:
        if self._commands is None:
            result = pb.CommandResult(
                command_id=command.command_id,
                ok=False,
                detail="this agent runs no commands",
            )
        else:
            result = await self._commands.run(command)
        try:
            await self._write(call, lock, pb.AgentMessage(command_result=result))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            log.warning("command_result_lost", id=command.command_id, error=str(exc))

    async def _preflight_task(self, call: Call, lock: asyncio.Lock, task: pb.PreflightTask) -> None:
        """Carry a pre-flight task out on the executor's thread; send its result back."""
        if self._preflight is None:
            result = pb.PreflightResult(
                run_id=task.run_id[:64],
                task_id=task.task_id[:64],
                refused="this agent runs no pre-flight checks",
            )
        else:
            result = await self._preflight.run(task)
        try:
            await self._write(call, lock, pb.AgentMessage(preflight_result=result))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            log.warning("preflight_result_lost", task=task.task_id[:64], error=str(exc))

    async def _write(self, call: Call, lock: asyncio.Lock, msg: pb.AgentMessage) -> None:
        async with lock:
            await call.write(msg)

    async def _send_loop(self, call: Call, lock: asyncio.Lock) -> None:
        sent_seq = self._outbox.acked_seq
        last_write = self._clock.monotonic()
        first_report = True
        while True:
            if self._clock.monotonic() < self.cut_until:
                msg = "cut off from the collector (a simulated network partition)"
                raise ConnectionError(msg)
            self._live.changed.clear()
            for event in self._outbox.after(sent_seq):
                await self._write(call, lock, pb.AgentMessage(event=event))
                sent_seq = event.seq
                last_write = self._clock.monotonic()
            await self._send_job_steps(call, lock)
            # A new stream starts with every value; a failed write ends the stream, and the
            # next one starts with every value again, so nothing taken here is lost.
            changes = self._live.take_all() if first_report else self._live.take_changes()
            due = self._clock.monotonic() - last_write >= self.intervals.heartbeat
            if changes or due or first_report:
                report = report_of(unix_ms(self._clock), changes, grouped=self.grouped_reports)
                await self._write(call, lock, pb.AgentMessage(report=report))
                last_write = self._clock.monotonic()
                first_report = False
            now = self._clock.monotonic()
            wait = self.intervals.heartbeat - (now - last_write)
            held = self._live.next_due()  # a gauge held back by its pace
            if held is not None:
                wait = min(wait, held - now)
            # until a poll changed something, a held gauge or the next heartbeat is due
            await wait_for_event(self._live.changed, max(wait, 0.0), self._clock)

    async def _send_job_steps(self, call: Call, lock: asyncio.Lock) -> None:
        """Forward the queued step reports (lost with the stream if a write fails)."""
        if self._jobs is None:
            return
        processes = self._jobs.take_processes()
        while steps := self._jobs.take():
            report = pb.JobReport(steps=steps, dropped=self._jobs.lost, processes=processes)
            processes = []
            await self._write(call, lock, pb.AgentMessage(job_report=report))
        if processes:
            report = pb.JobReport(dropped=self._jobs.lost, processes=processes)
            await self._write(call, lock, pb.AgentMessage(job_report=report))

    async def _read_loop(self, call: Call, lock: asyncio.Lock) -> None:
        while True:
            msg = await call.read()
            if not isinstance(msg, pb.CollectorMessage):
                log.info("stream_closed_by_collector", collector=self.target)
                return
            body = msg.WhichOneof("body")
            if body == "ack":
                if msg.ack.boot_id == self._outbox.boot_id:
                    self._outbox.ack(msg.ack.seq)
                else:
                    log.warning("ack_for_other_boot", boot_id=msg.ack.boot_id)
            elif body == "config":
                self.intervals.apply(msg.config)
            elif body == "command":
                # Run it beside the stream: a reset takes seconds, acks must keep flowing.
                task = asyncio.create_task(self._command(call, lock, msg.command))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
            elif body == "preflight_task":
                # Minutes of measuring, on a thread of the executor's: the stream goes on.
                work = self._preflight_task(call, lock, msg.preflight_task)
                task = asyncio.create_task(work, name="preflight")
                self._running.add(task)
                task.add_done_callback(self._running.discard)
            else:
                log.warning("unexpected_collector_message", body=body)
