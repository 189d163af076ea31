"""Signed JSON webhooks: how the collector tells other systems (drain endpoints, chat, paging).

One delivery is one JSON envelope POSTed to one URL. The body is encoded once; every attempt
carries the same body and idempotency key, with a fresh timestamp and an HMAC-SHA256 signature
over ``timestamp + "." + body``. The key travels inside the signed body (``idempotency_key``),
which is what receivers de-duplicate by; the ``X-Fleetwatch-Idempotency-Key`` header repeats it
for older receivers and logs, but is not signed, so a replay could change it. Connection errors,
timeouts, 5xx and 429 are retried with exponential backoff on the injected clock; any other answer
is final. ``docs/webhooks.md`` is the contract a receiver implements.

The HTTP is the standard library's ``http.client``, run in a worker thread through
``asyncio.to_thread`` so the event loop never blocks; a delivery sends one request at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import http.client
import json
import math
import re
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

import structlog

import fleetwatch

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from fleetwatch.clock import Clock

__all__ = [
    "ENVELOPE_VERSION",
    "IDEMPOTENCY_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "DeliveryResult",
    "WebhookSender",
    "encode_envelope",
    "sign",
    "verify",
]

log = structlog.get_logger("collector.actions.webhook")

TIMESTAMP_HEADER: Final = "X-Fleetwatch-Timestamp"
SIGNATURE_HEADER: Final = "X-Fleetwatch-Signature"
IDEMPOTENCY_HEADER: Final = "X-Fleetwatch-Idempotency-Key"
ENVELOPE_VERSION: Final = 1

_SIGNATURE_PREFIX: Final = "sha256="
_MAX_TIMESTAMP_DIGITS: Final = 12
_KIND = re.compile(r"[a-z][a-z0-9_.]{0,63}")
# Names and ids only (collector.actions.guards builds them): no spaces, quotes or line breaks.
_KEY = re.compile(r"[A-Za-z0-9._:/-]{1,200}")
_ERROR_BODY_CHARS: Final = 200
_MAX_BACKOFF_EXPONENT: Final = 30


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """Return ``"sha256=" + hex(HMAC-SHA256(secret, timestamp + "." + body))``.

    Args:
        secret: the key shared with the receiver.
        timestamp: the ``X-Fleetwatch-Timestamp`` value, Unix seconds as decimal digits.
        body: the exact bytes of the request body.
    """
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return _SIGNATURE_PREFIX + mac.hexdigest()


def verify(  # noqa: PLR0913, PLR0917 - the signed parts, the time and the window
    secret: bytes,
    timestamp: str,
    body: bytes,
    signature: str,
    now: float,
    tolerance_s: float = 300,
) -> bool:
    """Tell whether ``signature`` signs ``timestamp`` and ``body`` and the timestamp is recent.

    A timestamp more than ``tolerance_s`` seconds before or after ``now`` is refused, so a
    captured request cannot be replayed later. The comparison takes constant time.

    Args:
        secret: the key shared with the sender.
        timestamp: the ``X-Fleetwatch-Timestamp`` header as received.
        body: the raw request body as received (before any JSON parsing).
        signature: the ``X-Fleetwatch-Signature`` header as received.
        now: the receiver's Unix time in seconds.
        tolerance_s: the accepted distance between ``timestamp`` and ``now``.

    Raises:
        ValueError: ``tolerance_s`` is negative or not finite.
    """
    if not (math.isfinite(tolerance_s) and tolerance_s >= 0):
        msg = f"tolerance_s must be a finite number >= 0, got {tolerance_s}"
        raise ValueError(msg)
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > _MAX_TIMESTAMP_DIGITS:
        return False
    if abs(now - int(timestamp)) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body)
    return hmac.compare_digest(expected.encode(), signature.encode())


def encode_envelope(
    *,
    kind: str,
    idempotency_key: str,
    sent_at: float,
    payload: Mapping[str, object],
) -> bytes:
    """Encode the body of a delivery: compact JSON with sorted keys, ASCII only.

    Args:
        kind: what the delivery is (``drain_request``, ``notification``, ...).
        idempotency_key: the key receivers de-duplicate by; here it is covered by the signature
            (the ``X-Fleetwatch-Idempotency-Key`` header repeats it, unsigned).
        sent_at: Unix seconds of the first attempt (rounded to milliseconds).
        payload: the action's own fields; must be JSON (no NaN or infinity).

    Raises:
        TypeError: the payload holds something JSON cannot express.
        ValueError: the payload holds NaN or infinity.
    """
    envelope = {
        "version": ENVELOPE_VERSION,
        "kind": kind,
        "idempotency_key": idempotency_key,
        "sent_at": round(sent_at, 3),
        "payload": dict(payload),
    }
    return json.dumps(envelope, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """What became of one delivery; the caller journals it.

    Attributes:
        delivered: the receiver answered 2xx.
        status: the HTTP status of the last attempt, ``None`` if it got no answer.
        attempts: requests made (1 to ``max_attempts``).
        error: why the last attempt failed, ``None`` when delivered.
        elapsed_s: seconds from the first attempt to the result, on the injected clock.
    """

    delivered: bool
    status: int | None
    attempts: int
    error: str | None
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class _Outcome:
    """One attempt."""

    status: int | None
    error: str | None
    retryable: bool
    retry_after_s: float | None = None


class WebhookSender:
    """Delivers signed JSON envelopes to one URL, retrying what is worth retrying."""

    __slots__ = (
        "_backoff_initial_s",
        "_backoff_max_s",
        "_clock",
        "_connect",
        "_endpoint",
        "_max_attempts",
        "_secret",
        "_target",
        "_timeout_s",
        "_user_agent",
    )

    def __init__(  # noqa: PLR0913 - one endpoint and its retry policy
        self,
        url: str,
        secret: bytes | None,
        clock: Clock,
        *,
        timeout_s: float = 5.0,
        max_attempts: int = 5,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 10.0,
    ) -> None:
        """Check every option now, so a bad configuration fails at start-up, not at 3 a.m.

        Args:
            url: an ``http://`` or ``https://`` URL (no user:password part).
            secret: the signing key shared with the receiver; ``None`` sends unsigned requests,
                for receivers that do not verify (a warning is logged once).
            clock: time for the signature timestamps and the waits between attempts.
            timeout_s: the most one attempt may take: connecting, sending, the whole answer.
            max_attempts: requests per delivery, the first included.
            backoff_initial_s: the wait after the first failed attempt; it doubles each time.
            backoff_max_s: the longest wait, also the cap on a receiver's ``Retry-After``.

        Raises:
            ValueError: an option is out of range; the message names it.
        """
        parts = urlsplit(url)
        if parts.scheme not in {"http", "https"}:
            msg = f"url must start with http:// or https://, not {parts.scheme or 'nothing'}://"
            raise ValueError(msg)
        if not parts.hostname:
            raise ValueError("url has no host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("url must not carry user:password; the signature authenticates")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ValueError("url has an invalid port") from exc
        if secret is not None and not secret:
            raise ValueError("secret must be non-empty bytes, or None for unsigned deliveries")
        _require_positive("timeout_s", timeout_s)
        _require_positive("backoff_initial_s", backoff_initial_s)
        _require_positive("backoff_max_s", backoff_max_s)
        if backoff_max_s < backoff_initial_s:
            msg = (
                f"backoff_max_s ({backoff_max_s}) must be >= "
                f"backoff_initial_s ({backoff_initial_s})"
            )
            raise ValueError(msg)
        if max_attempts < 1:
            msg = f"max_attempts must be at least 1, got {max_attempts}"
            raise ValueError(msg)

        host = parts.hostname
        connect: Callable[[], http.client.HTTPConnection]
        if parts.scheme == "https":
            context = ssl.create_default_context()
            connect = functools.partial(
                http.client.HTTPSConnection, host, port, timeout=timeout_s, context=context
            )
        else:
            connect = functools.partial(http.client.HTTPConnection, host, port, timeout=timeout_s)
        self._connect = connect
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._secret = secret
        self._clock = clock
        self._max_attempts = max_attempts
        self._timeout_s = timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._user_agent = f"fleetwatch/{fleetwatch.__version__}"
        # Scheme, host and port only: webhook paths often embed a token (chat services do).
        self._endpoint = f"{parts.scheme}://{parts.netloc}"
        if secret is None:
            log.warning("webhook_unsigned", endpoint=self._endpoint)

    @property
    def endpoint(self) -> str:
        """Scheme, host and port of the URL: safe to log, unlike a path that may hold a token."""
        return self._endpoint

    async def send(
        self,
        payload: Mapping[str, object],
        idempotency_key: str,
        *,
        kind: str = "notification",
    ) -> DeliveryResult:
        """Deliver ``payload`` in an envelope; never raises for a failed delivery.

        Args:
            payload: the action's fields, placed under ``"payload"`` in the envelope.
            idempotency_key: names this delivery for the receiver's de-duplication; the same
                logical action must always use the same key (1-200 of A-Z, a-z, 0-9 and
                ``. _ : / -``). It goes into the signed body, and into a header as well.
            kind: what the delivery is, e.g. ``drain_request`` or ``notification``.

        Returns:
            the outcome; ``delivered`` is true once the receiver answered 2xx.

        Raises:
            ValueError: ``kind`` or ``idempotency_key`` is malformed, or the payload holds NaN.
            TypeError: the payload holds something JSON cannot express.
        """
        if not _KIND.fullmatch(kind):
            msg = f"kind must be lowercase snake_case (a-z, 0-9, _ and .), got {kind!r}"
            raise ValueError(msg)
        if not _KEY.fullmatch(idempotency_key):
            msg = "idempotency_key must be 1-200 of A-Z, a-z, 0-9 and . _ : / -"
            raise ValueError(msg)
        started = self._clock.monotonic()
        body = encode_envelope(
            kind=kind, idempotency_key=idempotency_key, sent_at=self._clock.now(), payload=payload
        )
        logger = log.bind(endpoint=self._endpoint, kind=kind, idempotency_key=idempotency_key)
        outcome = _Outcome(status=None, error=None, retryable=False)
        attempt = 0
        while attempt < self._max_attempts:
            attempt += 1
            headers = self._headers(idempotency_key, body)
            outcome = await asyncio.to_thread(self._post, body, headers)
            if outcome.error is None:
                elapsed = self._clock.monotonic() - started
                logger.info(
                    "webhook_delivered",
                    status=outcome.status,
                    attempts=attempt,
                    elapsed_s=round(elapsed, 3),
                )
                return DeliveryResult(
                    delivered=True,
                    status=outcome.status,
                    attempts=attempt,
                    error=None,
                    elapsed_s=elapsed,
                )
            if not outcome.retryable or attempt == self._max_attempts:
                break
            delay = self._delay(attempt, outcome.retry_after_s)
            logger.warning(
                "webhook_attempt_failed",
                attempt=attempt,
                status=outcome.status,
                error=outcome.error,
                retry_in_s=delay,
            )
            await self._clock.sleep(delay)
        elapsed = self._clock.monotonic() - started
        logger.error(
            "webhook_not_delivered",
            status=outcome.status,
            attempts=attempt,
            error=outcome.error,
            retryable=outcome.retryable,
            elapsed_s=round(elapsed, 3),
        )
        return DeliveryResult(
            delivered=False,
            status=outcome.status,
            attempts=attempt,
            error=outcome.error,
            elapsed_s=elapsed,
        )

    def _headers(self, idempotency_key: str, body: bytes) -> dict[str, str]:
        """Headers for one attempt, stamped and signed now."""
        timestamp = str(int(self._clock.now()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": self._user_agent,
            IDEMPOTENCY_HEADER: idempotency_key,
            TIMESTAMP_HEADER: timestamp,
        }
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = sign(self._secret, timestamp, body)
        return headers

    def _delay(self, attempt: int, retry_after_s: float | None) -> float:
        """The wait after failed attempt number ``attempt`` (1-based)."""
        if retry_after_s is not None:
            return min(retry_after_s, self._backoff_max_s)
        exponent = min(attempt - 1, _MAX_BACKOFF_EXPONENT)
        return min(self._backoff_initial_s * 2.0**exponent, self._backoff_max_s)

    def _post(self, body: bytes, headers: dict[str, str]) -> _Outcome:
        """Make one request; runs in a worker thread.

        The socket timeout bounds each read; the whole attempt is bounded too: a receiver that
        trickles its answer a byte at a time has its connection shut at ``timeout_s``.
        """
        connection = self._connect()
        expired = threading.Event()
        deadline = threading.Timer(self._timeout_s, _cut_off, (connection, expired))
        deadline.daemon = True
        deadline.start()
        try:
            connection.request("POST", self._target, body=body, headers=headers)
            response = connection.getresponse()
            text = response.read(_ERROR_BODY_CHARS * 4)
            status = response.status
            retry_after = _retry_after_s(response.getheader("Retry-After"))
        except ssl.SSLCertVerificationError as exc:
            return _Outcome(status=None, error=_describe(exc), retryable=False)
        except (OSError, http.client.HTTPException) as exc:
            error = _describe(exc)
            if expired.is_set():
                error = f"TimeoutError: no whole answer within {self._timeout_s:g} s ({error})"
            return _Outcome(status=None, error=error, retryable=True)
        finally:
            deadline.cancel()
            connection.close()
        if 200 <= status < 300:  # noqa: PLR2004 - the 2xx range
            return _Outcome(status=status, error=None, retryable=False)
        answer = " ".join(text.decode("utf-8", errors="replace").split())[:_ERROR_BODY_CHARS]
        error = f"HTTP {status} {response.reason}" + (f": {answer}" if answer else "")
        retryable = status >= 500 or status == 429  # noqa: PLR2004 - server errors, rate limits
        return _Outcome(status=status, error=error, retryable=retryable, retry_after_s=retry_after)


def _cut_off(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The attempt's time is up: shut its socket, so the read blocked on it returns."""
    expired.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _require_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        msg = f"{name} must be a finite number > 0, got {value}"
        raise ValueError(msg)


def _retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header; ``None`` when absent or not a number of seconds."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
