"""One stream's events, from the collector's side: order, replays, clocks, coalescing, commit.

Events of a boot are numbered from 1 without gaps. Within a stream they must come in order (a
skipped or repeated number ends the stream); the first after a Hello may repeat numbers already
journaled (a replay after a reconnect), and those are acked again and dropped, but it may not
skip a number the journal lacks (``seq_gap``: the ack for it would cover events never journaled)
unless the Hello declared that number settled for the agent (``resume_seq``).
Each new event is read off the wire once, after it is checked, into a
:class:`~collector.ingest.node_event.NodeEvent` classed by the collector's Xid catalog (the class
the agent sent is logged where it differs, and decides nothing); it is journaled and acked once
committed (the ack is cumulative: everything up to its number is safe). An event the database
refuses (``journal_refused``) ends its own stream only.

A flood of alike events is held and journaled as one row (:mod:`collector.ingest.coalesce`); the
ack then stops before the held run until its row is committed. An event stamped by a clock that
cannot be right (before 2000, or far ahead of the collector's) is journaled with the time it was
received and the agent's time noted in its detail, and counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING, Final

import structlog

from collector.exceptions import RowRefusedError
from collector.ingest.coalesce import HeldRun, RepeatWindows, Stamp
from collector.ingest.node_event import node_event
from collector.store.events import EventRow
from fleetwatch.clock import unix_ms
from fleetwatch.wire.plausible import time_problem
from fleetwatch.wire.repeats import occurrences
from fleetwatch.wire.validate import MAX_DETAIL, WireError, validate_event

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from collector.ingest.node_event import NodeEvent
    from collector.ingest.throttle import IngestLimits, NodeIngest
    from collector.model.fleet import FleetModel
    from collector.stats import CollectorStats
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
    from fleetwatch.wire.validate import Inventory

log = structlog.get_logger("collector.ingest.session")

# Repeated warnings (throttling, refused samples, bad clocks) are logged the first time and then
# once every this many, per stream and kind.
LOG_EVERY: Final = 1000


class Warnings:
    """Warnings of one stream, each logged the first time and then every :data:`LOG_EVERY`."""

    __slots__ = ("_counts", "node")

    def __init__(self) -> None:
        """No warnings yet; ``node`` is filled in once the stream says Hello."""
        self.node = ""
        self._counts: Counter[str] = Counter()

    def warn(self, what: str, **kw: object) -> None:
        """Count ``what`` and log it when its count is 1 or a multiple of LOG_EVERY."""
        self._counts[what] += 1
        count = self._counts[what]
        if count == 1 or count % LOG_EVERY == 0:
            log.warning(what, node=self.node, count=count, **kw)


class StreamEvents:
    """The events of one stream of one boot of one node."""

    def __init__(  # noqa: PLR0913 - the stream's identity and the collector's shared parts
        self,
        *,
        node: str,
        boot_id: str,
        journaled: int,
        resume_seq: int = 0,
        journal: Journal,
        fleet: FleetModel,
        stats: CollectorStats,
        clock: Clock,
        limits: IngestLimits,
        ingest: NodeIngest,
        ack: Callable[[int], Awaitable[None]],
        track_write: Callable[[str, asyncio.Future[None]], None],
        warnings: Warnings,
        xid_class: Callable[[int], str],
    ) -> None:
        """Start after ``journaled``, the boot's highest number already in the journal.

        ``resume_seq``: the Hello's; the first event may skip numbers below it (0: none).
        ``xid_class``: an Xid's class in the collector's catalog in use now.
        """
        self._node = node
        self._boot_id = boot_id
        self._journaled = journaled
        self._resume_seq = resume_seq
        self._next_seq: int | None = None
        self._journal = journal
        self._fleet = fleet
        self._stats = stats
        self._clock = clock
        self._ingest = ingest
        self._ack = ack
        self._track_write = track_write
        self._warnings = warnings
        self._xid_class = xid_class
        self._hold_s = limits.hold_s
        self._windows = RepeatWindows(limits.repeat_window_s, limits.repeat_burst)
        self._run: HeldRun | None = None

    @property
    def held_until(self) -> float | None:
        """When the held run must be journaled (monotonic), or None when none is held."""
        return None if self._run is None else self._run.deadline

    async def take(self, wire: pb.Event, inventory: Inventory) -> None:
        """Check, journal (or hold) and ack one event from the stream."""
        validate_event(wire, inventory)
        self._check_order(wire.seq)
        if wire.seq <= self._journaled:
            # Sent again after a reconnect. A coalesced row covers numbers it does not hold
            # itself, so the journal's highest number (not its unique key) is the test.
            self._stats.events_duplicate += 1
            await self._ack(wire.seq)
            return
        event = node_event(wire, node=self._node, boot_id=self._boot_id, xid_class=self._xid_class)
        if event.classes_differ:
            self._warnings.warn(
                "xid_class_differs",
                xid=event.xid,
                agent_said=event.agent_xid_class,
                xid_class=event.xid_class,
            )
        stamp = self._stamp(event)
        key = event.key
        alone = self._windows.admit(key, stamp.time_ms)
        run = self._run
        if run is not None and (alone or run.key != key):
            await self.flush()
        if not alone:
            if self._run is None:
                self._run = HeldRun.start(event, stamp, self._hold_s)
            else:
                self._run.add(event, stamp)
            return
        row = self._row(event, event.seq, stamp.time_ms, stamp.detail)
        await self._commit(row, event, events=1, count=occurrences(stamp.detail))
        await self._ack(event.seq)

    async def flush(self) -> None:
        """Journal the held run, if any, as one row; then ack through its last event."""
        run, self._run = self._run, None
        if run is None:
            return
        detail = run.detail(self._clock.monotonic())
        row = self._row(run.first, run.last_seq, run.last_time_ms, detail)
        await self._commit(row, run.first, events=run.events, count=run.occurrences)
        await self._ack(run.last_seq)

    def _check_order(self, seq: int) -> None:
        if self._next_seq is None:
            if seq > self._journaled + 1:
                self._gap(seq)
        elif seq != self._next_seq:
            msg = f"event seq {seq} out of order: expected {self._next_seq}"
            raise WireError("out_of_order", msg)
        self._next_seq = seq + 1

    def _gap(self, seq: int) -> None:
        """The stream's first event skips numbers the journal lacks: refuse it unless declared.

        The cumulative ack for ``seq`` would say the numbers in between are journaled. The
        agent may declare them settled in its Hello (``resume_seq``: acked by a journal this one
        is not, such as a collector's before its journal was restored from a backup, or lost
        with its spool); then the stream is taken and the gap logged. Either way it is counted.
        """
        self._stats.seq_gaps += 1
        first = self._journaled + 1
        missing = f"{first}" if seq - 1 == first else f"{first}..{seq - 1}"
        if seq <= self._resume_seq:
            log.warning(
                "seq_gap_declared",
                node=self._node,
                boot_id=self._boot_id,
                journal_lacks=missing,
                first_seq=seq,
            )
            return
        said = f"resume_seq {self._resume_seq}" if self._resume_seq else "no resume_seq"
        msg = (
            f"event seq {seq} skips {missing}: the journal holds this boot's events through "
            f"{self._journaled}, and the Hello said {said}; events must follow on without a gap"
        )
        raise WireError("seq_gap", msg)

    def _stamp(self, event: NodeEvent) -> Stamp:
        """The event's time and detail as journaled: the receipt time when its own is wrong."""
        received = unix_ms(self._clock)
        now = self._clock.monotonic()
        problem = time_problem(event.time_ms, received)
        if problem is None:
            return Stamp(event.time_ms, event.detail, now)
        self._stats.bad_times[f"event_time_{problem}"] += 1
        self._warnings.warn(
            "event_time_wrong", problem=problem, seq=event.seq, time_unix_ms=event.time_ms
        )
        note = f" [agent time {event.time_ms} ms is in the {problem}; time of receipt used]"
        return Stamp(received, event.detail[: MAX_DETAIL - len(note)] + note, now)

    def _row(self, event: NodeEvent, seq: int, time_ms: int, detail: str) -> EventRow:
        target = event.target
        return EventRow(
            node=event.node,
            boot_id=event.boot_id,
            seq=seq,
            time_ms=time_ms,
            received_ms=unix_ms(self._clock),
            kind=event.kind.value,
            target_kind=target.kind,
            gpu_uuid=target.gpu_uuid,
            target_index=target.index,
            device=target.device,
            xid=event.xid,
            xid_class=event.xid_class,
            detail=detail,
        )

    async def _commit(self, row: EventRow, event: NodeEvent, *, events: int, count: int) -> None:
        """Journal ``row``, standing for ``events`` events and ``count`` occurrences.

        The write runs in a task of its own, shielded: if the stream is cancelled meanwhile the
        commit still lands and still reaches the fleet model, and the node's next stream waits
        for it (:meth:`collector.ingest.session.SessionRegistry.settle`) before it reads the
        journal.
        """
        write = asyncio.ensure_future(self._write(row, event, events=events, count=count))
        self._track_write(self._node, write)
        try:
            await asyncio.shield(write)
        except RowRefusedError as exc:
            # The database refused this row alone (its neighbours in the commit went in): the
            # stream ends here, nothing after it is acked.
            msg = f"event seq {row.seq} could not be journaled: {exc}"
            raise WireError("journal_refused", msg) from exc

    async def _write(self, row: EventRow, event: NodeEvent, *, events: int, count: int) -> None:
        row_id = await self._journal.append(row)
        seq = row.seq or 0
        self._journaled = max(self._journaled, seq)
        if not row_id:
            self._stats.events_duplicate += events
            return
        self._stats.events_journaled += events
        self._fleet.apply_event(event.node, event.kind, event.target, event.xid, count)
        if events == 1:
            log.info("event_journaled", node=self._node, seq=seq, kind=event.kind.value, id=row_id)
            return
        self._stats.events_coalesced += events
        self._ingest.coalesced += events
        log.info(
            "events_coalesced",
            node=self._node,
            seq=seq,
            kind=event.kind.value,
            events=events,
            occurrences=count,
            id=row_id,
        )
