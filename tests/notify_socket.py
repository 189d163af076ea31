"""A stand-in for systemd's notify socket: binds where NOTIFY_SOCKET points, records messages."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Self

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
# The kernel's time for each datagram, as it queued it (Linux's SO_TIMESTAMPNS, which Python's
# socket module does not name; this value on x86-64 and arm64): a struct timespec.
_SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("qq")


@dataclass(frozen=True, slots=True)
class Notification:
    """One datagram: its KEY=VALUE lines, and the sender's pid as the kernel vouches for it.

    ``at`` is when it was sent (the kernel queued it), on the monotonic clock: not when it was
    read, which on a loaded machine may come late for one and on time for the next.
    """

    lines: tuple[str, ...]
    pid: int
    at: float = field(default_factory=time.monotonic)

    def get(self, key: str) -> str | None:
        """The value of ``key`` in this message."""
        return next(
            (line.partition("=")[2] for line in self.lines if line.startswith(f"{key}=")), None
        )


class NotifySocket:
    """Receives what a daemon sends to ``address`` ('/path' or '@abstract'), with SO_PASSCRED."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.setblocking(False)
        self.received: list[Notification] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def drain(self) -> list[Notification]:
        """Take every datagram waiting now; return the new ones."""
        new = []
        room = socket.CMSG_SPACE(_CREDS.size) + socket.CMSG_SPACE(_TIMESPEC.size)
        while True:
            try:
                data, ancdata, _, _ = self.sock.recvmsg(4096, room)
            except BlockingIOError:
                break
            pid, at = 0, time.monotonic()
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _CREDS.unpack(payload[: _CREDS.size])[0]
                elif level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack(payload[: _TIMESPEC.size])
                    at -= time.time() - (sec + nsec / 1e9)  # the wall clock's age, moved over
            new.append(Notification(tuple(data.decode().split("\n")), pid, at))
        self.received.extend(new)
        return new

    def with_line(self, line: str, after: float = 0.0) -> list[Notification]:
        """Every message so far that carries ``line`` (sent after monotonic ``after``)."""
        self.drain()
        return [n for n in self.received if line in n.lines and n.at > after]

    def with_key(self, key: str) -> list[Notification]:
        """Every message so far that sets ``key``."""
        self.drain()
        return [n for n in self.received if n.get(key) is not None]

    def wait_for(
        self, line: str, timeout: float = 30.0, count: int = 1, after: float = 0.0
    ) -> list[Notification]:
        """Block until ``count`` messages carry ``line``; AssertionError listing what came."""
        deadline = time.monotonic() + timeout
        while len(self.with_line(line, after)) < count:
            if time.monotonic() > deadline:
                msg = (
                    f"no {count} x {line!r} in {timeout} s; got {[n.lines for n in self.received]}"
                )
                raise AssertionError(msg)
            time.sleep(0.01)
        return self.with_line(line, after)[:count]

    async def wait_for_async(
        self, line: str, timeout: float = 15.0, count: int = 1
    ) -> list[Notification]:
        """:meth:`wait_for` without blocking the event loop."""
        deadline = time.monotonic() + timeout
        while len(self.with_line(line)) < count:
            if time.monotonic() > deadline:
                msg = (
                    f"no {count} x {line!r} in {timeout} s; got {[n.lines for n in self.received]}"
                )
                raise AssertionError(msg)
            await asyncio.sleep(0.01)
        return self.with_line(line)[:count]
