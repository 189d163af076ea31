"""A job socket of the tests' own: listens as the agent does and hands back what ranks sent.

It accepts every connection (as the agent's socket does, ``SOCK_SEQPACKET``) and reads them in the
order they came, so what one process sent comes back in the order it was sent.
"""

from __future__ import annotations

import select
import socket
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


class SeqpacketListener:
    """Listens at ``path``; :meth:`recv` returns the next message from any connection."""

    def __init__(self, path: Path, timeout: float = 2.0) -> None:
        """Bind and listen at ``path``; :meth:`recv` waits up to ``timeout`` seconds."""
        self.path = path
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(str(path))
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.connections: list[socket.socket] = []
        self.accepted = 0

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return
            conn.setblocking(False)
            self.connections.append(conn)
            self.accepted += 1

    def poll(self) -> bytes | None:
        """The next message waiting now, or None."""
        self._accept()
        for conn in list(self.connections):
            try:
                data = conn.recv(65536)
            except BlockingIOError:
                continue
            if not data:  # the sender closed it
                self.connections.remove(conn)
                conn.close()
                continue
            return data
        return None

    def recv(self, timeout: float | None = None) -> bytes:
        """The next message, waiting up to ``timeout`` (TimeoutError when none came)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while (data := self.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                msg = f"nothing arrived at {self.path}"
                raise TimeoutError(msg)
            select.select([self.sock, *self.connections], [], [], left)
        return data

    def close(self) -> None:
        """Close the connections and the socket."""
        for conn in self.connections:
            conn.close()
        self.sock.close()
