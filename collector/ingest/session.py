"""One agent's stream, from the collector's side.

Hello first (validated; it names the node and declares its inventory; over mTLS, the node must be
one the client certificate names), then a Welcome back with the highest sequence number already
journaled for that boot. After that: Reports update the fleet model, Events are checked,
journaled (deduplicated by node, boot and sequence) and acked only after the commit. Anything
that breaks the contract ends the stream with a status that says what was wrong, and is counted;
what was already journaled stays journaled.

Hostile load (see docs/ingest.md): each node has a budget of events and of report samples per
second (:mod:`collector.ingest.throttle`); past it, the session stops reading the node's stream
until the budget allows, so the node's own agent holds what waits and no other node is slowed. A
flood of alike events is journaled as one row standing for many (:mod:`collector.ingest.coalesce`).
A report sample that breaks the contract or holds an impossible value is refused on its own; an
event stamped by a clock that cannot be right is journaled with the time it was received.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import grpc
import structlog
from google.protobuf.message import DecodeError

from collector.exceptions import JournalFullError
from collector.ingest.session_events import StreamEvents, Warnings
from collector.ingest.throttle import DEFAULT_LIMITS, IngestThrottle
from collector.ingest.turns import TurnShare
from collector.store.events import NodeRow, collector_event
from fleetwatch import __version__
from fleetwatch.clock import unix_ms
from fleetwatch.model import EventKind, Target
from fleetwatch.wire.plausible import time_problem
from fleetwatch.wire.settings import MAX_MESSAGE_BYTES
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import Inventory, SampleScreen, WireError, validate_hello
from fleetwatch.wire.validate_jobs import validate_job_report
from fleetwatch.wire.validate_preflight import ScreenedResult, screen_result

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.ingest.throttle import Budget, IngestLimits, NodeIngest
    from collector.jobs.book import JobBook
    from collector.model.fleet import FleetModel
    from collector.stats import CollectorStats
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock

log = structlog.get_logger("collector.ingest.session")

HELLO_TIMEOUT_S: Final = 30.0
# A long wait for a node's budget is slept in steps this long, the node marked alive after each.
PACE_STEP_S: Final = 1.0
# A Report with this many target groups and single samples together is heavy (a node's first:
# 169 groups, 1,500 samples; a busy node's steady Report: 0-9): it runs in the loop's share
# for heavy work (collector.ingest.turns), so that a fleet's first Reports leave room each turn
# for the nodes already back.
HEAVY_REPORT_ENTRIES: Final = 32

_STATUS: Final = {
    "oversized": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "protocol": grpc.StatusCode.FAILED_PRECONDITION,
    "identity": grpc.StatusCode.PERMISSION_DENIED,
}


def parse_message(raw: bytes) -> pb.AgentMessage:
    """Decode one message from an agent; raise WireError saying why it is unusable."""
    if len(raw) > MAX_MESSAGE_BYTES:
        msg = f"message of {len(raw)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit"
        raise WireError("oversized", msg)
    message = pb.AgentMessage()
    try:
        message.ParseFromString(raw)
    except DecodeError as exc:
        msg = f"not a valid AgentMessage ({len(raw)} bytes): {exc}"
        raise WireError("malformed", msg) from exc
    if message.WhichOneof("body") is None:
        msg = (
            f"AgentMessage ({len(raw)} bytes) carries no hello, report, event, result or job report"
        )
        raise WireError("malformed", msg)
    return message


class StreamNotReadyError(ConnectionError):
    """The node's new stream has not finished its Hello: ask again shortly."""


class SessionRegistry:
    """At most one live stream per node: a new Hello for a node replaces the old stream.

    It also holds what must outlive one stream: every node's ingest budget, and the journal
    write a node's previous stream may still have in flight.
    """

    def __init__(self, limits: IngestLimits = DEFAULT_LIMITS) -> None:
        """No streams yet; every node gets ``limits``."""
        self._tasks: dict[str, asyncio.Task[object]] = {}
        self._sessions: dict[str, StreamSession] = {}
        self._writes: dict[str, asyncio.Future[None]] = {}
        self.throttle = IngestThrottle(limits)
        self.heavy = TurnShare()  # heavy Reports (a node's first): a share of each loop turn

    def session(self, node: str) -> StreamSession | None:
        """The node's live stream, to send it a command."""
        return self._sessions.get(node)

    def claim(self, node: str, session: StreamSession | None = None) -> None:
        """Make the current task the node's stream, cancelling a previous one."""
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - always called from a task
            return
        old = self._tasks.get(node)
        if old is not None and old is not task and not old.done():
            log.info("stream_superseded", node=node)
            old.cancel()
        self._tasks[node] = task
        if session is not None:
            self._sessions[node] = session

    def release(self, node: str) -> bool:
        """Forget the current task as the node's stream; return False if it was superseded."""
        if self._tasks.get(node) is asyncio.current_task():
            del self._tasks[node]
            self._sessions.pop(node, None)
            return True
        return False

    def track_write(self, node: str, write: asyncio.Future[None]) -> None:
        """Remember the node's journal write in flight (it finishes even if its stream ends)."""
        self._writes[node] = write

        def done(finished: asyncio.Future[None]) -> None:
            if self._writes.get(node) is write:
                del self._writes[node]
            if not finished.cancelled():
                finished.exception()  # its stream saw it, or is gone: not "never retrieved"

        write.add_done_callback(done)

    async def settle(self, node: str) -> None:
        """Wait until no journal write of an earlier stream of ``node`` is in flight.

        A stream cancelled while its commit ran leaves the commit running; the next stream must
        not read the journal's highest sequence number before that commit lands, or it would
        take events the commit covers for new ones.
        """
        write = self._writes.get(node)
        if write is not None and not write.done():
            await asyncio.wait({write})  # never cancels the write, even if this task is


class StreamSession:
    """Handles one agent stream from Hello to disconnect."""

    def __init__(  # noqa: PLR0913 - the server passes its shared collaborators
        self,
        *,
        fleet: FleetModel,
        journal: Journal,
        stats: CollectorStats,
        registry: SessionRegistry,
        clock: Clock,
        config: pb.Config,
        xid_class: Callable[[int], str],
        jobs: JobBook | None = None,
        verify_identity: bool = False,
    ) -> None:
        """Share the collector's model, journal and counters (and its jobs, if it keeps any).

        ``xid_class``: an Xid's class in the collector's catalog, the one that classes events.
        ``verify_identity``: the stream is mTLS, and its Hello must name a node that the client
        certificate names (see :func:`check_identity`).
        """
        self._verify_identity = verify_identity
        self._xid_class = xid_class
        self._jobs = jobs
        self._fleet = fleet
        self._journal = journal
        self._stats = stats
        self._registry = registry
        self._clock = clock
        self._config = config
        self._node = ""
        self._boot_id = ""
        self._inventory = Inventory()
        self._screen = SampleScreen(self._inventory)
        self._context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage] | None = None
        self._write_lock = asyncio.Lock()
        self._commands: dict[str, asyncio.Future[pb.CommandResult]] = {}
        self._preflight: dict[str, asyncio.Future[ScreenedResult]] = {}
        self.peer_host = ""  # the agent's address as this end sees it (pre-flight rendezvous)
        self._ingest: NodeIngest | None = None
        self._events: StreamEvents | None = None
        self._last_report_ms = 0
        self._warnings = Warnings()

    async def _send(self, message: pb.CollectorMessage) -> None:
        """Write to the agent; one write at a time (acks and commands share the stream)."""
        if self._context is None:
            msg = "the stream has not said Hello yet"
            raise StreamNotReadyError(msg)
        async with self._write_lock:
            await self._context.write(message)

    async def command(self, command: pb.Command, timeout_s: float) -> pb.CommandResult:
        """Send a command to the agent and wait for its result (TimeoutError if none comes)."""
        waiter: asyncio.Future[pb.CommandResult] = asyncio.get_running_loop().create_future()
        self._commands[command.command_id] = waiter
        try:
            await self._send(pb.CollectorMessage(command=command))
            return await asyncio.wait_for(waiter, timeout_s)
        finally:
            self._commands.pop(command.command_id, None)

    async def preflight(self, task: pb.PreflightTask, timeout_s: float) -> ScreenedResult:
        """Send a pre-flight task and wait for its result (TimeoutError if none comes in time).

        ConnectionError when the stream closes first. Only a result from this node's own
        stream, naming a task sent on it, answers it.
        """
        waiter: asyncio.Future[ScreenedResult] = asyncio.get_running_loop().create_future()
        self._preflight[task.task_id] = waiter
        try:
            await self._send(pb.CollectorMessage(preflight_task=task))
            return await asyncio.wait_for(waiter, timeout_s)
        finally:
            self._preflight.pop(task.task_id, None)

    def _preflight_result(self, result: pb.PreflightResult) -> None:
        """Screen a result; refused ones (and refused measurements) are counted by reason."""
        stats = self._stats.preflight_refused
        try:
            screened = screen_result(result)
        except WireError as exc:
            stats[exc.reason] += 1
            self._warnings.warn("preflight_result_refused", reason=exc.reason, error=str(exc))
            return
        for reason, count in screened.rejected.items():
            stats[reason] += count
            self._warnings.warn(
                "preflight_measurement_refused", reason=reason, error=screened.examples[reason]
            )
        waiter = self._preflight.get(screened.task_id)
        if waiter is None or waiter.done():
            stats["unknown_task"] += 1
            self._warnings.warn("preflight_result_refused", reason="unknown_task")
            return
        waiter.set_result(screened)

    async def run(self, context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage]) -> None:
        """Serve the stream until the agent goes away or breaks the contract."""
        peer = context.peer()
        self.peer_host = peer_host(peer)
        self._stats.streams_active += 1
        self._stats.streams_total += 1
        try:
            await self._serve(context)
        except WireError as exc:
            self._stats.rejected[exc.reason] += 1
            log.warning(
                "message_rejected",
                peer=peer,
                node=self._node or None,
                reason=exc.reason,
                error=str(exc),
            )
            await context.abort(_STATUS.get(exc.reason, grpc.StatusCode.INVALID_ARGUMENT), str(exc))
        except JournalFullError as exc:
            # Nothing of it was committed, so nothing is acked: the agent keeps its events and
            # sends them again once the journal has room (journal_disk_full says so, once).
            self._stats.rejected["journal_full"] += 1
            log.warning("stream_refused_journal_full", peer=peer, node=self._node or None)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            log.exception("stream_failed", peer=peer, node=self._node or None)
            raise
        finally:
            for waiter in self._commands.values():
                if not waiter.done():
                    waiter.set_exception(ConnectionError("the agent's stream closed"))
            for pending in self._preflight.values():
                if not pending.done():
                    pending.set_exception(ConnectionError("the agent's stream closed"))
            self._stats.streams_active -= 1
            if self._node and self._registry.release(self._node):
                self._fleet.on_disconnect(self._node)
                log.info("stream_closed", node=self._node, peer=peer)

    async def _read(
        self,
        context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage],
    ) -> pb.AgentMessage | None:
        raw: object = await context.read()
        if not isinstance(raw, bytes):  # grpc.aio.EOF: the agent closed its side
            return None
        return parse_message(raw)

    async def _serve(self, context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage]) -> None:
        try:
            first = await asyncio.wait_for(self._read(context), HELLO_TIMEOUT_S)
        except TimeoutError as exc:
            msg = f"no Hello within {HELLO_TIMEOUT_S:.0f} s"
            raise WireError("protocol", msg) from exc
        if first is None:
            return
        if first.WhichOneof("body") != "hello":
            msg = f"the first message must be a Hello, not {first.WhichOneof('body')}"
            raise WireError("protocol", msg)
        await self._hello(first.hello, context)
        await self._messages(context)

    async def _messages(
        self, context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage]
    ) -> None:
        """Dispatch messages until the agent closes its side.

        While a run of alike events is held, the next read runs beside a timer so that the run
        is journaled by its deadline even if nothing more comes.
        """
        events = self._events
        if events is None:  # pragma: no cover - set by the Hello
            return
        pending: asyncio.Future[pb.AgentMessage | None] | None = None
        try:
            while True:
                held_until = events.held_until
                if held_until is None and pending is None:
                    message = await self._read(context)
                else:
                    if pending is None:
                        pending = asyncio.ensure_future(self._read(context))
                    if held_until is not None and not await self._ready_by(pending, held_until):
                        await events.flush()
                        continue
                    message = await pending
                    pending = None
                if message is None:
                    await events.flush()  # the agent closed cleanly: journal and ack the run
                    return
                await self._dispatch(message, events)
        finally:
            if pending is not None:
                pending.cancel()

    async def _ready_by(
        self, pending: asyncio.Future[pb.AgentMessage | None], deadline: float
    ) -> bool:
        """Wait for ``pending`` until ``deadline`` (monotonic); True when it is done."""
        await asyncio.sleep(0)  # a message already there is taken without a timer
        wait = deadline - self._clock.monotonic()
        if pending.done() or wait <= 0:
            return pending.done()
        sleeper = asyncio.ensure_future(self._clock.sleep(wait))
        waiting: set[asyncio.Future[Any]] = {pending, sleeper}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
        return pending.done()

    async def _hello(
        self,
        hello: pb.Hello,
        context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage],
    ) -> None:
        self._inventory = validate_hello(hello)
        self._screen = SampleScreen(self._inventory)
        if self._verify_identity:
            check_identity(hello.node, context)  # before it can replace the node's stream
        self._node, self._boot_id = hello.node, hello.boot_id
        self._warnings.node = self._node
        self._registry.claim(self._node, self)
        await self._registry.settle(self._node)  # an earlier stream's commit lands first
        mono, unix = self._clock.monotonic(), self._clock.now()
        ingest = self._ingest = self._registry.throttle.node(self._node, mono)
        was_unreachable = self._fleet.on_hello(hello, mono, unix)
        # One commit for the Hello and the lookup, shared with the Hellos that come with it.
        high = await self._journal.open_stream(
            NodeRow(
                hello.node,
                hello.boot_id,
                hello.SerializeToString(),
                int(unix * 1000),
                reachable=True,
            ),
        )
        if was_unreachable:
            await self.node_reachable()
        self._events = StreamEvents(
            node=self._node,
            boot_id=self._boot_id,
            journaled=high,
            resume_seq=hello.resume_seq,
            journal=self._journal,
            fleet=self._fleet,
            stats=self._stats,
            clock=self._clock,
            limits=self._registry.throttle.limits,
            ingest=ingest,
            ack=self._ack,
            track_write=self._registry.track_write,
            warnings=self._warnings,
            xid_class=self._xid_class,
        )
        log.info(
            "stream_open",
            node=self._node,
            boot_id=self._boot_id,
            gpus=len(hello.gpus),
            ib_ports=len(hello.ib_ports),
            journaled_seq=high,
            agent_version=hello.agent_version,
        )
        welcome = pb.Welcome(
            collector_version=__version__,
            journaled=pb.Ack(boot_id=self._boot_id, seq=high),
            config=self._config,
            grouped_reports=True,
        )
        self._context = context
        await self._send(pb.CollectorMessage(welcome=welcome))

    async def node_reachable(self) -> None:
        """Journal that a node the collector had given up on is talking again."""
        await self._journal.append(
            collector_event(self._node, EventKind.NODE_REACHABLE, self._clock, "stream opened"),
        )
        self._fleet.apply_event(self._node, EventKind.NODE_REACHABLE, Target.node(), 0)
        await self._journal.set_reachable(
            self._node,
            reachable=True,
            last_seen_ms=unix_ms(self._clock),
        )

    async def _dispatch(self, message: pb.AgentMessage, events: StreamEvents) -> None:
        if self._fleet.touch(self._node, self._clock.monotonic(), self._clock.now()):
            await self.node_reachable()
        body = message.WhichOneof("body")
        if body == "report":
            await self._pace("samples", await self._take_report(message.report))
        elif body == "event":
            await events.take(message.event, self._inventory)
            await self._pace("events", 1)
        elif body == "job_report":
            validate_job_report(message.job_report, self._inventory)
            self._stats.job_steps += len(message.job_report.steps)
            if self._jobs is not None:
                self._jobs.ingest(self._node, message.job_report)
        elif body == "preflight_result":
            self._preflight_result(message.preflight_result)
        elif body == "command_result":
            result = message.command_result
            log.info("command_result", node=self._node, id=result.command_id, ok=result.ok)
            waiter = self._commands.pop(result.command_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(result)
        else:
            msg = "Hello sent twice on one stream"
            raise WireError("protocol", msg)

    async def _pace(self, budget: Budget, cost: int) -> None:
        """Charge the node's budget; when over it, stop reading the stream until it allows."""
        if self._ingest is None or self._events is None or cost <= 0:
            return
        wait = self._ingest.take(budget, cost, self._clock.monotonic())
        if wait <= 0:
            return
        self._warnings.warn("ingest_throttled", budget=budget, wait_s=round(wait, 3))
        end = self._clock.monotonic() + wait
        while (left := end - self._clock.monotonic()) > 0:
            held_until = self._events.held_until
            if held_until is not None and held_until < end:  # a held run is due meanwhile
                await self._clock.sleep(max(held_until - self._clock.monotonic(), 0.0))
                await self._events.flush()
                continue
            await self._clock.sleep(min(left, PACE_STEP_S))
            # The node is talking; only we are not listening: it must not look silent.
            if self._fleet.touch(self._node, self._clock.monotonic(), self._clock.now()):
                await self.node_reachable()

    async def _take_report(self, report: pb.Report) -> int:
        """Apply a Report (a heavy one in the loop's share for heavy work); its sample count."""
        if len(report.targets) + len(report.samples) < HEAVY_REPORT_ENTRIES:
            return self._report(report)
        heavy = self._registry.heavy
        if heavy.full():
            self._stats.reports_deferred += 1
        return await heavy.run(partial(self._report, report))

    def _report(self, report: pb.Report) -> int:
        """Screen and apply a Report; return how many samples it carried."""
        screened = self._screen.screen(report)
        self._check_report_time(report.time_unix_ms)
        for reason, count in screened.rejected.items():
            self._stats.samples_rejected[reason] += count
            self._warnings.warn("sample_refused", reason=reason, error=screened.examples[reason])
        self._stats.counter_resets += self._fleet.apply_keyed(self._node, screened.accepted)
        self._stats.reports += 1
        self._stats.samples += screened.count
        return screened.count

    def _check_report_time(self, time_ms: int) -> None:
        """Count a report time that cannot be right (reports are placed by receipt anyway)."""
        if time_ms <= 0:  # not stamped
            return
        problem = time_problem(time_ms, unix_ms(self._clock))
        if problem is None and time_ms < self._last_report_ms:
            problem = "backwards"
        if problem is not None:
            self._stats.bad_times[f"report_time_{problem}"] += 1
            self._warnings.warn("report_time_wrong", problem=problem, time_unix_ms=time_ms)
        self._last_report_ms = max(self._last_report_ms, time_ms)

    async def _ack(self, seq: int) -> None:
        await self._send(pb.CollectorMessage(ack=pb.Ack(boot_id=self._boot_id, seq=seq)))


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:10.0.0.5:51234`` -> ``10.0.0.5``); "" if none."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return ""


def check_identity(
    node: str, context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage]
) -> None:
    """Raise WireError("identity") unless the peer's client certificate names ``node``.

    The names are those gRPC gives as the peer's identity: the certificate's subject alternative
    names, or its Common Name when it has none. ``fleetwatch certs node`` puts the node name in
    both.
    """
    names = [raw.decode("utf-8", "replace") for raw in context.peer_identities() or ()]
    if node not in names:
        shown = ", ".join(repr(n) for n in names[:8]) or "no name"
        msg = f"the Hello is for node {node!r}, but the client certificate names {shown}"
        raise WireError("identity", msg)


async def handle_stream(
    session: StreamSession,
    context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage],
) -> None:
    """Entry point for the gRPC handler; a superseded stream ends quietly."""
    with contextlib.suppress(asyncio.CancelledError):
        await session.run(context)
