"""A real webhook receiver for the demo and tests: stands in for a chat, paging or drain endpoint.

It implements the receiving side of ``docs/webhooks.md`` on its own, with the standard library
only, and does not import the sender: a test of the two together checks the published contract,
not one function against itself. It verifies signatures, refuses stale ones, de-duplicates by
the idempotency key inside the signed body (never by the unsigned header, which a replay can
change) and can be told to fail the next requests, to exercise the sender's retries.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final, Self

if TYPE_CHECKING:
    from fleetwatch.clock import Clock

__all__ = ["Delivery", "ReceivedRequest", "WebhookReceiver"]

MAX_BODY_BYTES: Final = 1 << 20
_MAX_TIMESTAMP_DIGITS: Final = 12
_POLL_INTERVAL_S: Final = 0.05
_MISMATCH: Final = "X-Fleetwatch-Idempotency-Key differs from the signed body's idempotency_key"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One accepted delivery, recorded once per idempotency key.

    Attributes:
        idempotency_key: the envelope's ``idempotency_key``, which the signature covers.
        body: the parsed JSON body (the envelope).
        headers: the request headers, names in lower case.
        received_at: the receiver's clock (Unix seconds) when the request arrived.
        path: the request path.
    """

    idempotency_key: str
    body: dict[str, Any]
    headers: dict[str, str]
    received_at: float
    path: str


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    """Any POST that reached the receiver, with the status it was answered; for checking retries.

    Attributes:
        path: the request path.
        headers: the request headers, names in lower case.
        body: the raw body.
        status: the status the receiver answered.
        received_at: the receiver's clock (Unix seconds) when the request arrived.
    """

    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    received_at: float


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: dict[str, str]
    headers: dict[str, str] | None = None


class WebhookReceiver:
    """Accepts fleetwatch webhooks over HTTP on a daemon thread and remembers them."""

    def __init__(
        self,
        *,
        clock: Clock,
        secret: bytes | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        tolerance_s: float = 300.0,
    ) -> None:
        """Bind now (a busy port fails here); serve on :meth:`start`.

        Args:
            clock: the receiver's time, for the replay window and ``received_at``.
            secret: the key shared with the sender; ``None`` accepts unsigned requests (and
                ignores any signature).
            host: the address to bind.
            port: the port to bind; 0 picks a free one (see :attr:`port`).
            tolerance_s: how far a request's timestamp may be from ``clock.now()``.

        Raises:
            ValueError: ``secret`` is empty or ``tolerance_s`` is negative or not finite.
            OSError: the address cannot be bound.
        """
        if secret is not None and not secret:
            raise ValueError("secret must be non-empty bytes, or None to accept unsigned requests")
        if not (math.isfinite(tolerance_s) and tolerance_s >= 0):
            msg = f"tolerance_s must be a finite number >= 0, got {tolerance_s}"
            raise ValueError(msg)
        self._clock = clock
        self._secret = secret
        self._tolerance_s = tolerance_s
        self._changed = threading.Condition()
        self._deliveries: list[Delivery] = []
        self._requests: list[ReceivedRequest] = []
        self._seen_keys: set[str] = set()
        self._duplicates = 0
        self._mismatched = 0
        self._rejected = 0
        self._fail_remaining = 0
        self._fail_status = HTTPStatus.SERVICE_UNAVAILABLE.value
        self._fail_retry_after: str | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver._handle(self)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                """Quiet: tests and the demo look at the recorded deliveries instead."""

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._host = host
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when asked for port 0)."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://host:port`` of this receiver; append any path."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    @property
    def duplicates(self) -> int:
        """Requests that repeated an accepted idempotency key (answered 200, not recorded)."""
        with self._changed:
            return self._duplicates

    @property
    def mismatched(self) -> int:
        """Requests refused with 400 because the idempotency header differs from the body's key."""
        with self._changed:
            return self._mismatched

    @property
    def rejected(self) -> int:
        """Requests refused with 401 for a missing, wrong or stale signature."""
        with self._changed:
            return self._rejected

    def start(self) -> None:
        """Serve in the background.

        Raises:
            RuntimeError: the receiver was already started.
        """
        if self._thread is not None:
            raise RuntimeError("webhook receiver already started")
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL_S},  # how quickly stop() is noticed
            name="webhook-receiver",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port; safe to call twice or before :meth:`start`."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def fail_next(self, count: int, status: int = 503, *, retry_after: str | None = None) -> None:
        """Answer the next ``count`` requests with ``status`` before looking at them.

        Args:
            count: how many requests to fail (replaces any earlier instruction).
            status: the error status, 400 to 599.
            retry_after: a ``Retry-After`` header to send with each failure.

        Raises:
            ValueError: ``count`` is negative or ``status`` is not an error status.
        """
        if count < 0:
            msg = f"count must be >= 0, got {count}"
            raise ValueError(msg)
        if not 400 <= status <= 599:  # noqa: PLR2004 - the error statuses
            msg = f"status must be between 400 and 599, got {status}"
            raise ValueError(msg)
        with self._changed:
            self._fail_remaining = count
            self._fail_status = status
            self._fail_retry_after = retry_after

    def deliveries(self) -> list[Delivery]:
        """Return a copy of the accepted deliveries, oldest first."""
        with self._changed:
            return list(self._deliveries)

    def requests(self) -> list[ReceivedRequest]:
        """Return a copy of every POST received, oldest first, whatever it was answered."""
        with self._changed:
            return list(self._requests)

    def wait_for(self, count: int, timeout_s: float) -> bool:
        """Block until at least ``count`` deliveries were accepted; False after ``timeout_s``."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._deliveries) >= count, timeout_s)

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        """Answer one POST (runs on a handler thread)."""
        received_at = self._clock.now()
        headers = {name.lower(): value for name, value in req.headers.items()}
        try:
            length = int(headers.get("content-length", ""))
        except ValueError:
            self._reply(req, _Answer(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length"}))
            return
        if not 0 <= length <= MAX_BODY_BYTES:
            self._reply(req, _Answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "too large"}))
            return
        body = req.rfile.read(length)
        with self._changed:
            answer = self._decide(req.path, headers, body, received_at)
            self._requests.append(
                ReceivedRequest(req.path, headers, body, int(answer.status), received_at)
            )
            self._changed.notify_all()
        self._reply(req, answer)

    def _decide(
        self, path: str, headers: dict[str, str], body: bytes, received_at: float
    ) -> _Answer:
        """Choose the answer and record what it implies; called with the lock held."""
        if self._fail_remaining > 0:
            self._fail_remaining -= 1
            extra = {"Retry-After": self._fail_retry_after} if self._fail_retry_after else None
            return _Answer(self._fail_status, {"error": "failure injected by the test"}, extra)
        problem = self._signature_problem(headers, body, received_at)
        if problem is not None:
            self._rejected += 1
            return _Answer(HTTPStatus.UNAUTHORIZED, {"error": problem})
        parsed = _parse(headers, body)
        if isinstance(parsed, _Answer):
            if parsed.body.get("error") == _MISMATCH:
                self._mismatched += 1
            return parsed
        key, envelope = parsed
        if key in self._seen_keys:
            self._duplicates += 1
            return _Answer(HTTPStatus.OK, {"status": "duplicate"})
        self._seen_keys.add(key)
        self._deliveries.append(Delivery(key, envelope, headers, received_at, path))
        return _Answer(HTTPStatus.OK, {"status": "accepted"})

    def _signature_problem(self, headers: dict[str, str], body: bytes, now: float) -> str | None:
        """Why the request's signature is not acceptable, or None when it is (or not required)."""
        if self._secret is None:
            return None
        timestamp = headers.get("x-fleetwatch-timestamp")
        signature = headers.get("x-fleetwatch-signature")
        if not timestamp or not signature:
            return "missing X-Fleetwatch-Timestamp or X-Fleetwatch-Signature"
        if (
            not (timestamp.isascii() and timestamp.isdigit())
            or len(timestamp) > _MAX_TIMESTAMP_DIGITS
        ):
            return "malformed X-Fleetwatch-Timestamp"
        if abs(now - int(timestamp)) > self._tolerance_s:
            return "timestamp outside the accepted window (stale or in the future)"
        mac = hmac.new(self._secret, timestamp.encode() + b"." + body, hashlib.sha256)
        if not hmac.compare_digest(f"sha256={mac.hexdigest()}".encode(), signature.encode()):
            return "signature does not match"
        return None

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, answer: _Answer) -> None:
        data = json.dumps(answer.body).encode()
        req.send_response(answer.status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        for name, value in (answer.headers or {}).items():
            req.send_header(name, value)
        req.end_headers()
        req.wfile.write(data)


def _parse(headers: dict[str, str], body: bytes) -> tuple[str, dict[str, Any]] | _Answer:
    """The idempotency key and the envelope of a request, or the 400 it deserves.

    The key is the envelope's ``idempotency_key``: the signature covers the body, not the
    ``X-Fleetwatch-Idempotency-Key`` header, so a captured request replayed with a new header
    value must still be recognised as the delivery it repeats. A header that disagrees with the
    body was changed on the way and is refused.
    """
    try:
        envelope = json.loads(body)
    except ValueError:
        return _Answer(HTTPStatus.BAD_REQUEST, {"error": "body is not JSON"})
    if not isinstance(envelope, dict):
        return _Answer(HTTPStatus.BAD_REQUEST, {"error": "body is not a JSON object"})
    key = envelope.get("idempotency_key")
    if not isinstance(key, str) or not key:
        return _Answer(HTTPStatus.BAD_REQUEST, {"error": "body has no idempotency_key string"})
    header = headers.get("x-fleetwatch-idempotency-key")
    if header is not None and header != key:
        return _Answer(HTTPStatus.BAD_REQUEST, {"error": _MISMATCH})
    return key, envelope
