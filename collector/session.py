"""One agent's stream, from the collector's side.

Hello first (validated; it names the node and declares its inventory; over mTLS, the node must be
one the client certificate names), then a Welcome back with the highest sequence number already
journaled for that boot. After that: Reports update the fleet model, Events are checked,
journaled (deduplicated by node, boot and sequence) and acked only after the commit. Anything
that breaks the contract ends the stream with a status that says what was wrong, and is counted;
what was already journaled stays journaled.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Final

import grpc
import structlog
from google.protobuf.message import DecodeError

from collector.store_sqlite import EventRow, NodeRow
from fleetwatch import __version__
from fleetwatch.clock import unix_ms
from fleetwatch.model import EventKind, Target, event_kind_from_pb
from fleetwatch.wire.settings import MAX_MESSAGE_BYTES
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import (
    Inventory,
    WireError,
    validate_event,
    validate_hello,
    validate_report,
)
from fleetwatch.wire.validate_jobs import validate_job_report

if TYPE_CHECKING:
    from collector.fleet import FleetModel
    from collector.jobs.book import JobBook
    from collector.journal import Journal
    from collector.stats import CollectorStats
    from fleetwatch.clock import Clock

log = structlog.get_logger("collector.session")

HELLO_TIMEOUT_S: Final = 30.0

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


class SessionRegistry:
    """At most one live stream per node: a new Hello for a node replaces the old stream."""

    def __init__(self) -> None:
        """No streams yet."""
        self._tasks: dict[str, asyncio.Task[object]] = {}
        self._sessions: dict[str, StreamSession] = {}

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
        jobs: JobBook | None = None,
        verify_identity: bool = False,
    ) -> None:
        """Share the collector's model, journal and counters (and its jobs, if it keeps any).

        ``verify_identity``: the stream is mTLS, and its Hello must name a node that the client
        certificate names (see :func:`check_identity`).
        """
        self._verify_identity = verify_identity
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
        self._next_seq: int | None = None
        self._journaled = 0
        self._context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage] | None = None
        self._write_lock = asyncio.Lock()
        self._commands: dict[str, asyncio.Future[pb.CommandResult]] = {}

    async def _send(self, message: pb.CollectorMessage) -> None:
        """Write to the agent; one write at a time (acks and commands share the stream)."""
        if self._context is None:
            msg = "the stream has not said Hello yet"
            raise RuntimeError(msg)
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

    async def run(self, context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage]) -> None:
        """Serve the stream until the agent goes away or breaks the contract."""
        peer = context.peer()
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
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            log.exception("stream_failed", peer=peer, node=self._node or None)
            raise
        finally:
            for waiter in self._commands.values():
                if not waiter.done():
                    waiter.set_exception(ConnectionError("the agent's stream closed"))
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
        while (message := await self._read(context)) is not None:
            await self._dispatch(message)

    async def _hello(
        self,
        hello: pb.Hello,
        context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage],
    ) -> None:
        self._inventory = validate_hello(hello)
        if self._verify_identity:
            check_identity(hello.node, context)  # before it can replace the node's stream
        self._node, self._boot_id = hello.node, hello.boot_id
        self._registry.claim(self._node, self)
        mono, unix = self._clock.monotonic(), self._clock.now()
        was_unreachable = self._fleet.on_hello(hello, mono, unix)
        await self._journal.save_node(
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
        high = await self._journal.high_seq(self._node, self._boot_id)
        self._journaled = high
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

    async def _dispatch(self, message: pb.AgentMessage) -> None:
        if self._fleet.touch(self._node, self._clock.monotonic(), self._clock.now()):
            await self.node_reachable()
        body = message.WhichOneof("body")
        if body == "report":
            validate_report(message.report, self._inventory)
            self._fleet.apply_report(self._node, message.report)
            self._stats.reports += 1
            self._stats.samples += len(message.report.samples)
        elif body == "event":
            seq = await self._event(message.event)
            await self._send(pb.CollectorMessage(ack=pb.Ack(boot_id=self._boot_id, seq=seq)))
        elif body == "job_report":
            validate_job_report(message.job_report, self._inventory)
            self._stats.job_steps += len(message.job_report.steps)
            if self._jobs is not None:
                self._jobs.ingest(self._node, message.job_report)
        elif body == "command_result":
            result = message.command_result
            log.info("command_result", node=self._node, id=result.command_id, ok=result.ok)
            waiter = self._commands.pop(result.command_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(result)
        else:
            msg = "Hello sent twice on one stream"
            raise WireError("protocol", msg)

    async def _event(self, event: pb.Event) -> int:
        validate_event(event, self._inventory)
        if self._next_seq is None:
            if event.seq > self._journaled + 1:
                self._stats.seq_gaps += 1
                log.warning(
                    "seq_gap",
                    node=self._node,
                    boot_id=self._boot_id,
                    journaled=self._journaled,
                    first_seq=event.seq,
                )
        elif event.seq != self._next_seq:
            msg = f"event seq {event.seq} out of order: expected {self._next_seq}"
            raise WireError("out_of_order", msg)
        self._next_seq = event.seq + 1
        kind = event_kind_from_pb(event.kind)
        target = Target.from_pb(event.target)
        row_id = await self._journal.append(
            EventRow(
                node=self._node,
                boot_id=self._boot_id,
                seq=event.seq,
                time_ms=event.time_unix_ms,
                received_ms=unix_ms(self._clock),
                kind=kind.value,
                target_kind=target.kind,
                gpu_uuid=target.gpu_uuid,
                target_index=target.index,
                device=target.device,
                xid=event.xid,
                xid_class=event.xid_class,
                detail=event.detail,
            ),
        )
        if row_id:
            self._stats.events_journaled += 1
            self._fleet.apply_event(self._node, kind, target, event.xid)
            log.info("event_journaled", node=self._node, seq=event.seq, kind=kind.value, id=row_id)
        else:
            self._stats.events_duplicate += 1
        self._journaled = max(self._journaled, event.seq)
        return event.seq


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


def collector_event(node: str, kind: EventKind, clock: Clock, detail: str) -> EventRow:
    """An event the collector raises itself (no boot id, no sequence number)."""
    now = unix_ms(clock)
    return EventRow(
        node=node,
        boot_id="",
        seq=None,
        time_ms=now,
        received_ms=now,
        kind=kind.value,
        target_kind="node",
        detail=detail,
    )


async def handle_stream(
    session: StreamSession,
    context: grpc.aio.ServicerContext[bytes, pb.CollectorMessage],
) -> None:
    """Entry point for the gRPC handler; a superseded stream ends quietly."""
    with contextlib.suppress(asyncio.CancelledError):
        await session.run(context)
