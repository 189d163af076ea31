"""The agent's job socket: training ranks on the node send step reports here (Unix datagrams).

Each datagram is one JSON object from :func:`fleetwatch.jobclient.report_step`. A report that is
not usable (not JSON, a missing or out-of-range field, a GPU this node does not have) is counted
by reason and logged (the first of each reason, then now and then); good ones wait in a bounded
queue until the link forwards them. A full queue drops its oldest reports and counts them: step
reports are metrics, the next ones tell the same story.

The kernel queues few datagrams per socket (``net.unix.max_dgram_qlen``, often 10 to 512); a rank
that finds it full drops its report and tells how many it dropped with its next one, so the loss
is counted here too. Nodes with many ranks per agent may raise that sysctl.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import stat
from collections import Counter, deque
from typing import TYPE_CHECKING, Any, Final

import structlog

from agent.budget import ByteBudget
from fleetwatch.config_file import short_repr
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import WireError
from fleetwatch.wire.validate_jobs import validate_job_step

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from agent.sampler import NodeInventory

log = structlog.get_logger("agent.jobs")

MAX_QUEUED: Final = 20_000
MAX_BATCH: Final = 2_000
RECEIVE_BUFFER: Final = 1 << 20
LOG_EVERY: Final = 1000
STEP_OVERHEAD: Final = 8


class JobReportError(ValueError):
    """A datagram is not a usable step report; ``reason`` is a short label for counting."""

    def __init__(self, reason: str, message: str) -> None:
        """Keep the label apart from the message."""
        super().__init__(message)
        self.reason = reason


def _field(report: dict[str, Any], key: str, kind: type, *, required: bool = False) -> Any:  # noqa: ANN401 - JSON values
    value = report.get(key)
    if value is None:
        if required:
            raise JobReportError("missing_field", f"step report has no {key!r}")
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        msg = f"step report field {key!r} must be {kind.__name__}, got {type(value).__name__}"
        raise JobReportError("bad_type", msg)
    if isinstance(value, float) and not math.isfinite(value):
        raise JobReportError("bad_value", f"step report field {key!r} is not finite")
    return value


def _gpu_uuid(gpu: object, inventory: NodeInventory) -> str:
    if gpu is None:
        return ""
    if isinstance(gpu, int) and not isinstance(gpu, bool):
        for g in inventory.gpus:
            if g.index == gpu:
                return g.uuid
        raise JobReportError("unknown_gpu", f"this node has no GPU with index {gpu}")
    if isinstance(gpu, str):
        for g in inventory.gpus:
            if g.uuid.lower() == gpu.lower():
                return g.uuid
        raise JobReportError("unknown_gpu", f"this node has no GPU {gpu[:80]!r}")
    raise JobReportError("bad_type", "step report field 'gpu' must be an index or a GPU UUID")


def parse_report(data: bytes, inventory: NodeInventory) -> pb.JobStep:
    """Turn one datagram into a checked JobStep, or raise JobReportError saying why not."""
    try:
        return _parse(data, inventory)
    except (ValueError, OverflowError, TypeError) as exc:
        if isinstance(exc, JobReportError):
            raise
        # numbers beyond what the wire carries (a 2**40 rank, a time of 1e308)
        msg = f"step report value out of range: {str(exc)[:200]}"
        raise JobReportError("bad_value", msg) from exc


def _parse(data: bytes, inventory: NodeInventory) -> pb.JobStep:
    try:
        report = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JobReportError("not_json", f"step report is not JSON: {exc}") from exc
    except RecursionError as exc:  # [[[[... nested deeper than the parser goes
        raise JobReportError("not_json", "step report is not JSON: nested too deeply") from exc
    if not isinstance(report, dict):
        raise JobReportError("not_json", "step report must be a JSON object")
    if report.get("v", 1) != 1:
        shown = short_repr(report.get("v"))
        raise JobReportError("version", f"step report version {shown} is not 1")
    step = pb.JobStep(
        job_id=_field(report, "job", str, required=True),
        rank=_nonnegative(_field(report, "rank", int, required=True), "rank"),
        step=_nonnegative(_field(report, "step", int, required=True), "step"),
        time_unix_ms=int(_field(report, "time", float, required=True) * 1000),
        step_time_s=_field(report, "step_time", float, required=True),
        tokens=_field(report, "tokens", float) or 0.0,
        gpu_uuid=_gpu_uuid(report.get("gpu"), inventory),
        world_size=_nonnegative(_field(report, "world_size", int) or 0, "world_size"),
        params=_field(report, "params", float) or 0.0,
        flops_per_token=_field(report, "flops_per_token", float) or 0.0,
    )
    compute = _field(report, "compute_time", float)
    if compute is not None:
        step.compute_time_s = compute
    checkpoint = _field(report, "checkpoint", list)
    if checkpoint is not None:
        if len(checkpoint) != 2 or not all(  # noqa: PLR2004 - a pair
            isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
            for t in checkpoint
        ):
            raise JobReportError("bad_value", "step report checkpoint must be [start, end]")
        step.checkpoint_start_unix_ms = int(checkpoint[0] * 1000)
        step.checkpoint_end_unix_ms = int(checkpoint[1] * 1000)
    try:
        validate_job_step(step)
    except WireError as exc:
        raise JobReportError("bad_value", str(exc)) from exc
    return step


def unsent_count(data: bytes) -> int:
    """How many reports the sender could not send before this one (0 when it says nothing)."""
    try:
        value = json.loads(data).get("unsent", 0)
    except (ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and 0 < value < 2**31 else 0


def _nonnegative(value: int, key: str) -> int:
    if value < 0 or value >= 2**63:
        raise JobReportError("bad_value", f"step report field {key!r} must be 0 or more")
    return value


class JobQueue:
    """Checked step reports waiting for the link, oldest first, bounded in count and bytes.

    The byte bound is the one the outbox's events share (``budget``): a report that does not fit
    pushes out the oldest reports, and the outbox sheds them (:meth:`shed`) when an event needs
    the room. Either way the report is counted in ``dropped``.
    """

    def __init__(self, limit: int = MAX_QUEUED, budget: ByteBudget | None = None) -> None:
        """Empty; ``on_add`` (set by the agent) wakes the link's sender."""
        self._steps: deque[pb.JobStep] = deque()
        self._limit = limit
        self._budget = budget or ByteBudget()
        self.received = 0
        self.dropped = 0
        self.invalid: Counter[str] = Counter()
        self.unsent = 0  # reports ranks could not send (our socket's queue was full)
        self.on_add: Callable[[], None] = lambda: None

    def __len__(self) -> int:
        return len(self._steps)

    def _pop(self) -> int:
        size = _size(self._steps.popleft())
        self._budget.telemetry -= size
        return size

    def add(self, step: pb.JobStep) -> None:
        """Queue a report; drop the oldest when full (in count, or in the shared bytes)."""
        size = _size(step)
        self.received += 1
        while self._steps and (len(self._steps) >= self._limit or self._budget.room() < size):
            self._pop()
            self.dropped += 1
        if self._budget.room() < size:  # the events alone fill the bound
            self.dropped += 1
            return
        self._steps.append(step)
        self._budget.telemetry += size
        self.on_add()

    def shed(self, nbytes: int) -> int:
        """Drop the oldest reports until ``nbytes`` are free (or none is left); return freed."""
        freed = 0
        while self._steps and freed < nbytes:
            freed += self._pop()
            self.dropped += 1
        return freed

    def take(self, limit: int = MAX_BATCH) -> list[pb.JobStep]:
        """Up to ``limit`` reports, oldest first, removed from the queue."""
        count = min(limit, len(self._steps))
        steps = [self._steps.popleft() for _ in range(count)]
        self._budget.telemetry -= sum(_size(s) for s in steps)
        return steps

    def reject(self, error: JobReportError) -> None:
        """Count (and now and then log) a report that could not be used."""
        self.invalid[error.reason] += 1
        count = self.invalid[error.reason]
        if count == 1 or count % LOG_EVERY == 0:
            log.warning("job_report_rejected", reason=error.reason, error=str(error), count=count)

    @property
    def lost(self) -> int:
        """Reports lost for any reason (not sent, queue full, unusable)."""
        return self.unsent + self.dropped + sum(self.invalid.values())


def _size(step: pb.JobStep) -> int:
    """Bytes a held report counts for: its wire size plus a little framing."""
    return step.ByteSize() + STEP_OVERHEAD


class _Receiver(asyncio.DatagramProtocol):
    def __init__(self, queue: JobQueue, inventory: Callable[[], NodeInventory]) -> None:
        self._queue = queue
        self._inventory = inventory

    def datagram_received(self, data: bytes, addr: object) -> None:  # noqa: ARG002 - senders are anonymous
        try:
            step = parse_report(data, self._inventory())
        except JobReportError as exc:
            self._queue.reject(exc)
            return
        self._queue.unsent += unsent_count(data)
        self._queue.add(step)

    def error_received(self, exc: Exception) -> None:
        log.warning("job_socket_error", error=str(exc))


def _remove_stale(path: Path) -> None:
    """Remove a socket file nobody listens on; refuse to take over a live one."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return  # bind fails and says so
    except FileNotFoundError:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        path.unlink()  # left behind by an agent that is gone
        return
    finally:
        probe.close()
    msg = f"another process listens on {path}"
    raise OSError(msg)


def bind_job_socket(path: Path, mode: int) -> socket.socket:
    """Bind a datagram socket at ``path`` (replacing a stale socket file) with ``mode``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind(str(path))
        path.chmod(mode)
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
) -> asyncio.DatagramTransport:
    """Listen on ``path``; reports go to ``queue`` (close the transport to stop)."""
    sock = bind_job_socket(path, mode)
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: _Receiver(queue, inventory),
        sock=sock,
    )
    log.info("job_socket_open", path=str(path))
    return transport
