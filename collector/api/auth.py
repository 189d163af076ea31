"""Who may change state through the HTTP API (silences, drain releases).

With a token configured, a change must carry ``Authorization: Bearer <token>``, from any client
address; the token is compared in constant time. Without one, changes are accepted from
loopback clients only, and only while the API itself listens on a loopback address: off
loopback, nobody may change anything until a token is configured. Reads are never guarded.
What a change records as who made it (a silence's ``created_by``) is no more than the guard
knows: :attr:`ChangeGuard.identity`.

Every refusal is counted by reason (``fleetwatch_api_requests_refused_total``) and logged with
the client's address, never with what it sent as a token. :class:`Refusals` does the counting
and logging for the API's other refusals too (:mod:`collector.api.browsers`,
:mod:`collector.api.connections`), so one counter holds every reason; the reasons are listed in
:data:`collector.export.catalog.API_REFUSAL_REASONS`, each exposed at 0 until it happens.
"""

from __future__ import annotations

import hmac
import threading
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Final

import structlog

from fleetwatch.tls import is_loopback

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Callable

log = structlog.get_logger("collector.http")

_SCHEME: Final = "bearer "


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was refused: the status to answer with, the counted reason, the message."""

    status: HTTPStatus
    reason: str
    message: str


class Refusals:
    """Counts refused requests by reason and logs each one; thread-safe."""

    __slots__ = ("_counter", "_lock")

    def __init__(self, counter: Counter[str]) -> None:
        """``counter`` is the collector's own (read by the scrape thread)."""
        self._counter = counter
        self._lock = threading.Lock()

    def record(
        self, refusal: Refusal, *, client: str, method: str, path: str, **detail: object
    ) -> None:
        """Count ``refusal`` and log it as ``api_request_refused`` with what identifies it."""
        with self._lock:
            self._counter[refusal.reason] += 1
        log.warning(
            "api_request_refused",
            reason=refusal.reason,
            client=client,
            method=method,
            path=path[:200],
            **detail,
        )


class ChangeGuard:
    """Decides whether one state-changing request may proceed; thread-safe."""

    __slots__ = ("_check", "_token", "refusals")

    def __init__(self, *, token: bytes | None, listen_host: str, refused: Counter[str]) -> None:
        """Choose the check once: by token, loopback only, or none allowed.

        ``token`` is the configured API token (None: none), ``listen_host`` the address the
        API is bound to, ``refused`` the counter refusals are added to, by reason.
        """
        if token is not None and not token:
            msg = "an API token must not be empty"
            raise ValueError(msg)
        self._token = token
        self.refusals = Refusals(refused)
        self._check: Callable[[str, str | None], Refusal | None]
        if token is not None:
            self._check = self._by_token
        elif is_loopback(listen_host):
            self._check = self._loopback_only
        else:
            self._check = self._refuse_all

    @property
    def requires_token(self) -> bool:
        """True when changes need the bearer token."""
        return self._token is not None

    @property
    def identity(self) -> str:
        """Who a change this guard let through came from, as far as the server can tell.

        ``token``: it carried the API token (there is one, and it names nobody); ``loopback``:
        a client on loopback, without a token to show (a TCP peer's local user is not known:
        the kernel gives peer credentials on Unix sockets only).
        """
        return "token" if self._token is not None else "loopback"

    def check(
        self, *, client: str, authorization: str | None, method: str, path: str
    ) -> Refusal | None:
        """None when the request may proceed; else the refusal, counted and logged."""
        refusal = self._check(client, authorization)
        if refusal is not None:
            self.refusals.record(refusal, client=client, method=method, path=path)
        return refusal

    def _by_token(self, _client: str, authorization: str | None) -> Refusal | None:
        header = (authorization or "").strip()
        if not header.lower().startswith(_SCHEME):
            return Refusal(
                HTTPStatus.UNAUTHORIZED,
                "missing_token",
                "this change needs an API token: send Authorization: Bearer <token>",
            )
        sent = header[len(_SCHEME) :].strip().encode("latin-1")
        if self._token is None or not hmac.compare_digest(sent, self._token):
            return Refusal(HTTPStatus.UNAUTHORIZED, "bad_token", "the API token is not valid")
        return None

    @staticmethod
    def _loopback_only(client: str, _authorization: str | None) -> Refusal | None:
        if is_loopback(client):
            return None
        return Refusal(
            HTTPStatus.FORBIDDEN,
            "not_loopback",
            "without an API token, changes are accepted from loopback only",
        )

    @staticmethod
    def _refuse_all(_client: str, _authorization: str | None) -> Refusal:
        return Refusal(
            HTTPStatus.FORBIDDEN,
            "no_token_configured",
            "changes are refused: the API listens off loopback and the collector has no API "
            "token (set api_token_file or api_token_env in [collector])",
        )
