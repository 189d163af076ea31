"""gRPC's asyncio stack wakes the event loop a byte per completion: drain the bytes it piles up.

grpcio's asyncio completion queue (``PollerCompletionQueue``, the default engine) has a thread
that takes each completion (a message read, a write done, a new call) from gRPC's core, puts it
on a queue and writes one byte to a socket pair. The event loop's reader for that socket reads
*one* byte and then handles every completion queued. When completions come faster than the
loop turns, the bytes pile up; a socket pair holds 278 one-byte writes (212,992 bytes of buffer
on Linux), and once it is full the thread blocks on its next write. From then on gRPC's core
hands the loop one completion per turn of the loop, whatever else the turn does.

That is what stalled a collector's restart: 3,400 streams opened within a second, their
completions filled the socket pair, and for ten seconds the nodes already back had their acks
written one completion a turn (an ack's write waited up to 8 s; an event sent then waited 12 s
for its ack: ``bench/ingest/reconnect.py``, docs/performance.md, tenth measurement). A thread
dump showed gRPC's poller thread blocked in ``write(fd, 1 byte)``.

:func:`drain_wakeups` wraps that reader: before gRPC's handler runs, it reads all but one of the
bytes waiting (the handler reads the last, as it expects to), so the thread never blocks while
the loop is merely busy. The handler still takes every queued completion, so nothing is lost: a
completion queued after the drain has its own byte still to come, which wakes the loop again.
"""

from __future__ import annotations

import array
import fcntl
import functools
import os
import termios
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

log = structlog.get_logger("collector.ingest.grpc_wakeups")

_HANDLER = "_handle_events"  # the reader grpcio's PollerCompletionQueue registers
_QUEUE_CLASS = "PollerCompletionQueue"


class DrainedWakeups:
    """gRPC's reader for its wakeup socket, with the surplus bytes read first."""

    def __init__(self, fd: int, handle: Callable[[], object]) -> None:
        """``fd``: the socket the loop watches; ``handle``: gRPC's own reader for it."""
        self.fd = fd
        self._handle = handle
        self.drained = 0  # surplus wakeup bytes read (completions that came in a burst)

    def __call__(self) -> None:
        """Leave one byte for gRPC's handler, which reads one and handles every completion."""
        waiting = array.array("i", [0])
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, waiting, True)  # noqa: FBT003 - ioctl's API
            if waiting[0] > 1:
                self.drained += len(os.read(self.fd, waiting[0] - 1))
        except OSError as exc:  # the socket went away: gRPC's handler says what is wrong
            log.debug("grpc_wakeups_not_drained", error=str(exc))
        self._handle()


def drain_wakeups(loop: asyncio.AbstractEventLoop) -> DrainedWakeups | None:
    """Wrap gRPC's wakeup reader on ``loop``; None when there is none (another engine).

    Call it once gRPC's asyncio stack has started on ``loop`` (after the server starts).
    Calling it again finds the reader already wrapped and returns it.
    """
    selector = getattr(loop, "_selector", None)
    if selector is None:
        return None
    for key in list(selector.get_map().values()):
        reader = key.data[0] if isinstance(key.data, tuple) and key.data else None
        callback = getattr(reader, "_callback", None)
        if isinstance(callback, DrainedWakeups):
            return callback
        # a bound method, or (grpcio 1.5x and later) a partial of one with the loop bound
        method = callback.func if isinstance(callback, functools.partial) else callback
        owner = getattr(method, "__self__", None)
        if getattr(method, "__name__", "") != _HANDLER or type(owner).__name__ != _QUEUE_CLASS:
            continue
        if not callable(callback):  # pragma: no cover - a bound method (or its partial) is
            continue
        drained = DrainedWakeups(key.fd, callback)
        loop.remove_reader(key.fd)
        loop.add_reader(key.fd, drained)
        return drained
    return None
