"""The agent's job socket: training ranks on the node send step reports here (Unix seqpacket).

Each rank process connects once (``SOCK_SEQPACKET``) and sends one JSON object of at most 2 KiB
per step, from :func:`fleetwatch.jobclient.report_step`. The kernel tells who connected
(``SO_PEERCRED``); the sender's scheduler job and the node's job claims decide whether it may
report for the job it names (:mod:`agent.jobs.claims`). A report that is not usable or not allowed
is counted by reason and logged (the first of each reason, then now and then); good ones wait in
a bounded queue until the link forwards them. A full queue drops the oldest report of the uid
holding the most, so one user's flood pushes out only its own.

Each connection has its own kernel queue (the sender's socket buffer, some hundreds of reports),
so one user's flood fills only its own connections, never another rank's. Each user holds at
most ``CONNECTIONS_PER_UID`` connections and the node ``MAX_CONNECTIONS``; beyond them a new
connection is closed at once (counted as ``uid_connections_full``, ``connections_full``), and
every connection is read in turn, a few reports at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import stat
from collections import Counter, deque
from pathlib import Path
from typing import TYPE_CHECKING, Final

import structlog

from agent.jobs.claims import SenderCheck
from agent.jobs.flight_recorder import HELLO, MAX_ANSWER_BYTES, RecorderChannels
from agent.jobs.peer_identity import PeerResolver, peer_credentials
from agent.jobs.rank_watch import RankWatch
from agent.jobs.report import JobReportError, parse_report, unsent_count
from agent.outbox.budget import ByteBudget
from fleetwatch.clock import SystemClock
from fleetwatch.signals import REFUSED_SIGNAL_PREFIX
from fleetwatch.wire.validate_jobs import MAX_DATAGRAM_BYTES

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent.jobs.peer_identity import Credentials, Peer
    from agent.poll.sampler import NodeInventory
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

log = structlog.get_logger("agent.jobs")

MAX_QUEUED: Final = 20_000
MAX_BATCH: Final = 2_000
LOG_EVERY: Final = 1000
STEP_OVERHEAD: Final = 8
# What a rank's process says as it ends (fleetwatch.jobclient, at interpreter exit).
FAREWELLS: Final = {b'{"v":1,"bye":"ok"}': "ok", b'{"v":1,"bye":"error"}': "error"}
READS_PER_WAKE: Final = 32  # reports read from one connection per wake: every one gets its turn
ACCEPTS_PER_WAKE: Final = 64
BACKLOG: Final = 1024  # connections the kernel holds before the agent accepts them
CONNECTIONS_PER_UID: Final = 64  # a rank process needs one; each holds one descriptor
MAX_CONNECTIONS: Final = 512


class _Held:
    __slots__ = ("size", "step", "uid")

    def __init__(self, step: pb.JobStep, uid: int | None) -> None:
        self.step: pb.JobStep | None = step
        self.uid = uid
        self.size = step.ByteSize() + STEP_OVERHEAD


class JobQueue:
    """Checked step reports waiting for the link, oldest first, bounded in count and bytes.

    The byte bound is the one the outbox's events share (``budget``). When a report does not fit,
    or the outbox sheds reports for an event (:meth:`shed`), the uid holding the most reports
    loses its oldest: each uid's share of the queue is what the others leave it. Either way the
    report is counted in ``dropped``. ``senders`` checks who sent each report.
    """

    def __init__(
        self,
        limit: int = MAX_QUEUED,
        budget: ByteBudget | None = None,
        senders: SenderCheck | None = None,
        ranks: RankWatch | None = None,
    ) -> None:
        """Empty; ``on_add`` (set by the agent) wakes the link's sender.

        ``ranks`` watches the processes that reported (under the senders' proc root unless
        given); :meth:`watch` reads them each poll.
        """
        self._order: deque[_Held] = deque()  # every held report in arrival order (and holes)
        self._by_uid: dict[int | None, deque[_Held]] = {}
        self._count = 0
        self._holes = 0
        self._limit = limit
        self._budget = budget or ByteBudget()
        self.senders = senders or SenderCheck(PeerResolver(Path("/proc")), SystemClock())
        self.ranks = ranks or RankWatch(self.senders.peers.proc_root)
        self.recorders = RecorderChannels()  # the ranks' Flight Recorder channels
        self._processes: list[pb.RankProcess] = []
        self.received = 0
        self.dropped = 0
        self.refused: Counter[str] = Counter()
        self.unsent = 0  # reports ranks could not send (our socket's queue was full)
        self.on_add: Callable[[], None] = lambda: None
        # The last report taken (its job, and when by ``now``): pre-flight refuses to qualify a
        # node a job is reporting from (agent/preflight/executor.py).
        self.now: Callable[[], float] = SystemClock().monotonic
        self.last_job = ""
        self.last_added: float | None = None

    def __len__(self) -> int:
        return self._count

    def held_by(self, uid: int | None) -> int:
        """Reports of ``uid`` waiting now."""
        return len(self._by_uid.get(uid, ()))

    def _evict(self) -> int:
        """Drop the oldest report of the uid holding the most; return its size."""
        uid = max(self._by_uid, key=lambda u: len(self._by_uid[u]))
        mine = self._by_uid[uid]
        held = mine.popleft()
        if not mine:
            del self._by_uid[uid]
        held.step = None
        self._count -= 1
        self._holes += 1
        self._budget.telemetry -= held.size
        if self._holes > self._count + 64:  # keep the order deque from filling with holes
            self._order = deque(h for h in self._order if h.step is not None)
            self._holes = 0
        return held.size

    def add(self, step: pb.JobStep, uid: int | None = None) -> None:
        """Queue a report of ``uid``; when full, drop the oldest of the biggest holder first."""
        held = _Held(step, uid)
        self.received += 1
        self.last_job, self.last_added = step.job_id, self.now()
        while self._count and (self._count >= self._limit or self._budget.room() < held.size):
            self._evict()
            self.dropped += 1
        if self._budget.room() < held.size:  # the events alone fill the bound
            self.dropped += 1
            return
        self._order.append(held)
        self._by_uid.setdefault(uid, deque()).append(held)
        self._count += 1
        self._budget.telemetry += held.size
        self.on_add()

    def shed(self, nbytes: int) -> int:
        """Drop reports (biggest holder's oldest first) until ``nbytes`` are free; return freed."""
        freed = 0
        while self._count and freed < nbytes:
            freed += self._evict()
            self.dropped += 1
        return freed

    def take(self, limit: int = MAX_BATCH) -> list[pb.JobStep]:
        """Up to ``limit`` reports, oldest first, removed from the queue."""
        steps: list[pb.JobStep] = []
        while self._order and len(steps) < limit:
            held = self._order.popleft()
            if held.step is None:
                self._holes -= 1
                continue
            mine = self._by_uid[held.uid]
            mine.popleft()  # a uid's reports leave in order: this is its oldest
            if not mine:
                del self._by_uid[held.uid]
            self._count -= 1
            self._budget.telemetry -= held.size
            steps.append(held.step)
        return steps

    def reject(self, error: JobReportError, sender: Peer | Credentials | None = None) -> None:
        """Count (and now and then log) a report that could not be used or was not allowed."""
        self.refused[error.reason] += 1
        count = self.refused[error.reason]
        if count == 1 or count % LOG_EVERY == 0:
            who = {} if sender is None else {"pid": sender.pid, "uid": sender.uid}
            log.warning(
                "job_report_refused", reason=error.reason, error=str(error), count=count, **who
            )

    @property
    def lost(self) -> int:
        """Reports lost for any reason (not sent, queue full, refused)."""
        return self.unsent + self.dropped + sum(self.refused.values())

    def samples(self) -> dict[str, int]:
        """The node signals this queue reports: received, lost, and refused by reason."""
        counts = {"agent_job_reports": self.received, "agent_job_reports_lost": self.lost}
        for reason, count in self.refused.items():
            counts[REFUSED_SIGNAL_PREFIX + reason] = count
        return counts

    def watch(self) -> None:
        """Read every rank process that reported here (each poll); the link sends what it saw."""
        self._processes = self.ranks.snapshot()
        if self._processes:
            self.on_add()

    def take_processes(self) -> list[pb.RankProcess]:
        """The rank processes as last read, once (the link sends them with its next report)."""
        processes, self._processes = self._processes, []
        return processes

    def receive(self, data: bytes, peer: Peer, inventory: NodeInventory) -> None:
        """Take one report from ``peer``: what it says, and whether they may say it."""
        farewell = FAREWELLS.get(data)
        if farewell is not None:  # the process is ending, and says how
            self.ranks.farewell(peer.pid, peer.start_ticks, farewell)
            return
        slurm = peer.scheduler.id if peer.scheduler and peer.scheduler.kind == "slurm" else ""
        try:
            step = parse_report(data, inventory, default_job=slurm)
            self.senders.admit(step.job_id, peer, step.rank)
        except JobReportError as exc:
            self.reject(exc, peer)
            return
        step.sender_uid = peer.uid
        step.sender_start_unix_ms = peer.start_unix_ms
        step.scheduler_job = peer.scheduler.label if peer.scheduler else ""
        self.unsent += unsent_count(data)
        self.ranks.saw(step.job_id, step.rank, peer.pid, peer.start_ticks, peer.uid)
        self.add(step, peer.uid)


class _Connection:
    """One rank process's connection: who it is (or why it may not report), read in turn."""

    __slots__ = ("creds", "peer", "recorder", "refusal", "sock")

    def __init__(
        self,
        sock: socket.socket,
        creds: Credentials | None,
        peer: Peer | None,
        refusal: JobReportError | None,
    ) -> None:
        self.sock = sock
        self.creds = creds
        self.peer = peer
        self.refusal = refusal  # set: every report it sends is refused for this
        self.recorder: tuple[int, int] | None = None  # (pid, start): serves its Flight Recorder


class JobSocket:
    """The listening socket and its connections, read on the event loop."""

    def __init__(
        self,
        sock: socket.socket,
        queue: JobQueue,
        inventory: Callable[[], NodeInventory],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Start accepting on ``sock`` (a listening seqpacket socket); :meth:`close` stops."""
        self._sock = sock
        self._queue = queue
        self._inventory = inventory
        self._loop = loop
        self._connections: dict[int, _Connection] = {}  # by descriptor
        self._per_uid: Counter[int] = Counter()
        loop.add_reader(sock.fileno(), self._acceptable)

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._connections)

    def _acceptable(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("job_socket_error", error=str(exc))
                return
            self._open(conn)

    def _open(self, conn: socket.socket) -> None:
        conn.setblocking(False)  # noqa: FBT003 - the socket API
        creds = peer_credentials(conn)
        uid = creds.uid if creds is not None else -1
        full = None
        if len(self._connections) >= MAX_CONNECTIONS:
            full = JobReportError("connections_full", f"{MAX_CONNECTIONS} ranks are connected")
        elif self._per_uid[uid] >= CONNECTIONS_PER_UID:
            what = f"uid {uid} holds {CONNECTIONS_PER_UID} connections, the most it may"
            full = JobReportError("uid_connections_full", what)
        if full is not None:
            self._queue.reject(full, creds)
            conn.close()
            return
        peer, refusal = None, None
        try:
            peer = self._queue.senders.sender(creds)
        except JobReportError as exc:
            refusal = exc  # read what it sent, and refuse each report for this
        connection = _Connection(conn, creds, peer, refusal)
        self._connections[conn.fileno()] = connection
        self._per_uid[uid] += 1
        self._loop.add_reader(conn.fileno(), self._readable, connection)

    def _readable(self, connection: _Connection) -> None:
        for _ in range(READS_PER_WAKE):
            try:
                size = MAX_DATAGRAM_BYTES if connection.recorder is None else MAX_ANSWER_BYTES
                data, _, flags, _ = connection.sock.recvmsg(size)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.info("job_connection_error", error=str(exc))
                self._drop(connection)
                return
            if not data and not flags & socket.MSG_TRUNC:
                self._drop(connection)  # the rank closed it (or sent an empty report)
                return
            self._take(connection, data, flags)

    def _take(self, connection: _Connection, data: bytes, flags: int) -> None:
        recorders = self._queue.recorders
        if connection.recorder is not None:  # an answer from a rank's Flight Recorder
            if flags & socket.MSG_TRUNC:
                recorders.answered(connection.recorder, b'{"error":"answer over 64 KiB"}')
            else:
                recorders.answered(connection.recorder, data)
        elif data == HELLO and connection.peer is not None:
            connection.recorder = (connection.peer.pid, connection.peer.start_ticks)
            recorders.opened(connection.recorder, connection.sock)
        elif flags & socket.MSG_TRUNC:
            what = f"step report is over {MAX_DATAGRAM_BYTES} bytes"
            too_large = JobReportError("too_large", what)
            self._queue.reject(too_large, connection.creds)
        elif connection.peer is None:
            refusal = connection.refusal or JobReportError("no_credentials", "no sender")
            self._queue.reject(refusal, connection.creds)
        else:
            self._queue.receive(data, connection.peer, self._inventory())

    def _drop(self, connection: _Connection) -> None:
        fd = connection.sock.fileno()
        if self._connections.pop(fd, None) is None:
            return
        if connection.recorder is not None:
            self._queue.recorders.closed(connection.recorder, connection.sock)
        uid = connection.creds.uid if connection.creds is not None else -1
        self._per_uid[uid] -= 1
        if self._per_uid[uid] <= 0:
            del self._per_uid[uid]
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(fd)
        connection.sock.close()

    def close(self) -> None:
        """Stop accepting and reading, and close the socket and every connection."""
        for connection in list(self._connections.values()):
            self._drop(connection)
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()


def _remove_stale(path: Path) -> None:
    """Remove a socket file nobody listens on; refuse to take over a live one."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return  # bind fails and says so
    except FileNotFoundError:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        path.unlink()  # left behind by an agent that is gone
        return
    except OSError as exc:
        if exc.errno != errno.EPROTOTYPE:
            raise
        # a socket of another type is bound there: it is live (a datagram socket, such as an
        # older agent's, refuses a connection of the wrong type only while it is open)
    finally:
        probe.close()
    msg = f"another process listens on {path}"
    raise OSError(msg)


def bind_job_socket(path: Path, mode: int) -> socket.socket:
    """Listen with a seqpacket socket at ``path`` (replacing a stale socket file), ``mode``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.bind(str(path))
        path.chmod(mode)
        sock.listen(BACKLOG)
        sock.setblocking(False)  # noqa: FBT003 - the socket API
    except OSError:
        sock.close()
        raise
    return sock


async def serve_job_socket(
    path: Path,
    mode: int,
    queue: JobQueue,
    inventory: Callable[[], NodeInventory],
) -> JobSocket:
    """Listen on ``path``; reports go to ``queue`` (close the returned socket to stop)."""
    sock = bind_job_socket(path, mode)
    reader = JobSocket(sock, queue, inventory, asyncio.get_running_loop())
    log.info("job_socket_open", path=str(path))
    return reader
