"""The HTTP server's connections: how many, and how long a client may take over its request.

The standard library's ThreadingHTTPServer gives each connection a thread and waits for its
request without end: 200 half-sent requests held 200 threads and 200 files for as long as their
clients liked, and under a 256-file limit the collector ran out of files for ``/healthz`` and
for the agents' gRPC streams alike. Here:

- a connection has :attr:`ConnectionLimits.header_timeout_s` from its accept for the request
  line and headers, then :attr:`~ConnectionLimits.body_timeout_s` for the body: totals, not a
  socket timeout per read, so a client dripping a byte a second is closed as surely as a silent
  one; an answer must be taken within :attr:`~ConnectionLimits.write_timeout_s`;
- at most :attr:`~ConnectionLimits.max_connections` are open, and at most a quarter of the
  process's limit on open files (``RLIMIT_NOFILE``; the rest is for the agents' streams, the
  journal and the logs), so that connections alone cannot run it out. At the cap, a new connection
  closes the oldest one still sending its request (a slow client makes room for a quick one),
  or, when every connection is being answered, is answered ``503`` at once and closed;
- running out of files (``EMFILE``) pauses accepting for a moment instead of spinning on it.

Each refusal is counted and logged through :class:`~collector.api.auth.Refusals`: reasons
``read_timeout``, ``evicted``, ``too_many_connections`` and, for what the standard library's
request parser refuses (a malformed request line, too many headers), ``bad_request``.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import resource
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final

import structlog

from collector.api.auth import Refusal

if TYPE_CHECKING:
    from collections.abc import Callable

    from _typeshed import WriteableBuffer

    from collector.api.auth import Refusals

log = structlog.get_logger("collector.http")

RETRY_AFTER_S: Final = 1
FILE_SHARE: Final = 4  # HTTP connections may hold 1/FILE_SHARE of the process's file limit
MIN_CONNECTIONS: Final = 8
# How long accepting pauses after the process ran out of files, and how often that is logged.
OUT_OF_FILES_PAUSE_S: Final = 0.1
OUT_OF_FILES_LOG_EVERY_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How many connections, and how long each may take (seconds)."""

    # Prometheus scrapes each shard target on a connection of its own: at 4,096 nodes that is
    # 821 targets in a 15 s interval, and with 128 the collector refused (503) and evicted
    # scrapes whenever answers were slow to start.
    max_connections: int = 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    write_timeout_s: float = 30.0


def file_limit() -> int | None:
    """The process's soft limit on open files (None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def connection_cap(limits: ConnectionLimits, files: int | None) -> int:
    """How many connections may be open under ``limits`` and a limit of ``files`` open files."""
    if files is None:
        return limits.max_connections
    return min(limits.max_connections, max(MIN_CONNECTIONS, files // FILE_SHARE))


class DeadlineReader(io.RawIOBase):
    """Reads a socket against one deadline for many reads (a socket timeout is per read)."""

    def __init__(self, sock: socket.socket, monotonic: Callable[[], float]) -> None:
        """Read ``sock``; no deadline until one is set."""
        super().__init__()
        self._sock = sock
        self._monotonic = monotonic
        self.deadline = math.inf
        self.phase = "headers"
        self.timed_out: str | None = None  # the phase whose deadline passed

    def readable(self) -> bool:
        """A reader."""
        return True

    def start(self, phase: str, seconds: float) -> None:
        """From now on reads are for ``phase`` and must be done within ``seconds``."""
        self.phase = phase
        self.deadline = self._monotonic() + seconds

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        """One read of the socket, waiting at most until the deadline."""
        left = self.deadline - self._monotonic()
        if left <= 0:
            self.timed_out = self.phase
            msg = f"the client took too long to send its {self.phase}"
            raise TimeoutError(msg)
        self._sock.settimeout(None if math.isinf(left) else left)
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            self.timed_out = self.phase
            raise


@dataclass(slots=True)
class _Connection:
    sock: socket.socket
    client: str
    answering: bool = False  # its request is read: it is not closed for a newcomer
    evicted: bool = False


class BoundedHandler(BaseHTTPRequestHandler):
    """A request handler that reads under deadlines and answers errors as JSON."""

    server: BoundedHTTPServer  # the server it is made for
    _reader: DeadlineReader

    def setup(self) -> None:
        """Read through a :class:`DeadlineReader`; the header deadline runs from now."""
        super().setup()
        self.rfile.close()  # the file StreamRequestHandler opened: ours replaces it
        self._reader = DeadlineReader(self.connection, self.server.monotonic)
        self._reader.start("headers", self.server.limits.header_timeout_s)
        self.rfile = io.BufferedReader(self._reader)

    def handle(self) -> None:
        """Serve the request; count and log a client that was too slow to send it."""
        try:
            super().handle()
        finally:
            if self._reader.timed_out is not None:
                self.server.refuse(
                    Refusal(
                        HTTPStatus.REQUEST_TIMEOUT,
                        "read_timeout",
                        f"the {self._reader.timed_out} took too long",
                    ),
                    str(self.client_address[0]),
                    method=getattr(self, "command", None) or "-",
                    path=getattr(self, "path", None) or "-",
                )

    def read_body(self, length: int) -> bytes:
        """``length`` bytes of body, within the body deadline (TimeoutError past it)."""
        self._reader.start("body", self.server.limits.body_timeout_s)
        return self.rfile.read(length)

    def begin_answer(self) -> bool:
        """Mark the request as read; False when its connection was closed for a newcomer.

        What arrived on a closed connection may be cut short: do not act on it.
        """
        return self.server.answering(self.request)

    def send_response(self, code: int, message: str | None = None) -> None:
        """Start the answer, which the client must take within the write deadline."""
        self.connection.settimeout(self.server.limits.write_timeout_s)
        super().send_response(code, message)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Answer the standard library's refusals as a JSON error, counted and logged.

        These are a malformed request line, too many headers, an unsupported method.
        """
        del explain  # the message says it
        self.close_connection = True
        if self.server.evicted(self.request):
            return  # closed for a newcomer: what it sent was cut short, and nobody listens
        status = HTTPStatus(code)
        text = message or status.phrase
        self.server.refuse(
            Refusal(status, "bad_request", text),
            str(self.client_address[0]),
            method=getattr(self, "command", None) or "-",
            path=getattr(self, "path", None) or "-",
        )
        body = json.dumps({"error": text}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002, ANN401
        """Quiet: requests are not worth a log line each; refusals are logged where made."""


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, with :class:`ConnectionLimits` on how many and how slow."""

    daemon_threads = True
    # The listen backlog (socketserver's default is 5): Prometheus opens a connection per shard
    # target, hundreds within a scrape interval, and a full backlog makes the kernel drop SYNs
    # (retried a second later, then three) instead of queueing them for a thread.
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BoundedHandler],
        *,
        limits: ConnectionLimits,
        refusals: Refusals,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Bind and listen on ``address``; ``refusals`` counts and logs what is refused.

        The cap on connections comes from ``limits`` and the process's limit on open files
        (``files``, read now; None: no limit). An IPv6 address (``::1``, ``::``) gets an IPv6
        socket; ``::`` takes IPv4 too, where the kernel maps it (Linux's default).
        """
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.files = file_limit()
        self.limits = limits
        if self.cap < limits.max_connections:
            log.warning(
                "http_connections_capped",
                connections=self.cap,
                file_limit=self.files,
                hint="raise LimitNOFILE in the collector's unit (docs/deploy.md)",
            )
        self.monotonic = monotonic
        self._refusals = refusals
        self._lock = threading.Lock()
        self._open: dict[socket.socket, _Connection] = {}
        self._files_logged = -math.inf
        super().__init__(address, handler)  # last: a failed bind calls server_close()

    @property
    def cap(self) -> int:
        """How many connections may be open: ``limits`` under the file limit."""
        return connection_cap(self.limits, self.files)

    def counts(self) -> tuple[int, int]:
        """Connections open now: (still sending their request, being answered)."""
        with self._lock:
            live = [c for c in self._open.values() if not c.evicted]
        answering = sum(c.answering for c in live)
        return len(live) - answering, answering

    def refuse(self, refusal: Refusal, client: str, *, method: str, path: str) -> None:
        """Count and log ``refusal`` of a request from ``client``."""
        self._refusals.record(refusal, client=client, method=method, path=path, why=refusal.message)

    def answering(self, sock: socket.socket) -> bool:
        """Mark ``sock``'s request as read; False when it was closed for a newcomer."""
        with self._lock:
            connection = self._open.get(sock)
            if connection is None or connection.evicted:
                return False
            connection.answering = True
            return True

    def evicted(self, sock: socket.socket) -> bool:
        """True when ``sock`` was closed for a newcomer."""
        with self._lock:
            connection = self._open.get(sock)
        return connection is not None and connection.evicted

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept one connection; out of files, pause a moment so as not to spin on accept."""
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._out_of_files(exc)
            raise

    def _out_of_files(self, exc: OSError) -> None:
        now = self.monotonic()
        if now - self._files_logged >= OUT_OF_FILES_LOG_EVERY_S:
            self._files_logged = now
            waiting, answering = self.counts()
            log.error(
                "http_out_of_files",
                error=exc.strerror,
                http_sending=waiting,
                http_answering=answering,
                hint="raise LimitNOFILE in the collector's unit (docs/deploy.md)",
            )
        time.sleep(OUT_OF_FILES_PAUSE_S)

    def process_request(self, request: Any, client_address: Any) -> None:  # noqa: ANN401
        """Admit the connection (closing a slow one at the cap), or answer 503 and close it."""
        sock: socket.socket = request
        victim: _Connection | None = None
        with self._lock:
            live = [c for c in self._open.values() if not c.evicted]
            if len(live) >= self.cap:
                victim = next((c for c in live if not c.answering), None)
                if victim is None:
                    admitted = False
                else:
                    victim.evicted = admitted = True
            else:
                admitted = True
            if admitted:
                self._open[sock] = _Connection(sock, str(client_address[0]))
        if victim is not None:
            with contextlib.suppress(OSError):
                victim.sock.shutdown(socket.SHUT_RDWR)  # its thread's read ends at once
            self.refuse(
                Refusal(
                    HTTPStatus.REQUEST_TIMEOUT,
                    "evicted",
                    "closed while still sending its request, to make room for a new connection",
                ),
                victim.client,
                method="-",
                path="-",
            )
        if admitted:
            super().process_request(request, client_address)
        else:
            self._turn_away(sock, client_address)

    def _turn_away(self, sock: socket.socket, client_address: Any) -> None:  # noqa: ANN401
        """Answer 503 without waiting on the client (this is the accepting thread)."""
        refusal = Refusal(
            HTTPStatus.SERVICE_UNAVAILABLE,
            "too_many_connections",
            f"the collector's HTTP server is answering {self.cap} requests already; retry shortly",
        )
        body = json.dumps({"error": refusal.message}).encode()
        head = (
            "HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: {RETRY_AFTER_S}\r\n"
            "Connection: close\r\n\r\n"
        )
        with contextlib.suppress(OSError):
            sock.settimeout(0.0)  # non-blocking
            with contextlib.suppress(BlockingIOError):
                sock.recv(65536)  # what the client sent already: closing on it would reset
            sock.send(head.encode() + body)
        self.refuse(refusal, str(client_address[0]), method="-", path="-")
        self.shutdown_request(sock)

    def shutdown_request(self, request: Any) -> None:  # noqa: ANN401
        """Forget the connection, then close it."""
        with self._lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def server_close(self) -> None:
        """Stop listening and end every open connection (their threads then finish)."""
        super().server_close()
        with self._lock:
            socks = list(self._open)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:  # noqa: ANN401, ARG002
        """One structured line for what escaped a handler: quiet when the client hung up."""
        exc = sys.exc_info()[1]
        client = str(client_address[0])
        if isinstance(exc, ConnectionError):
            log.info("http_client_gone", client=client, error=type(exc).__name__)
        else:
            log.error("http_connection_failed", client=client, exc_info=exc)
