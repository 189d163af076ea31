"""Who may change state through the HTTP API (silences, drain releases).

With a token configured, a change must carry ``Authorization: Bearer <token>``, from any client
address; the token is compared in constant time. Without one, changes are accepted from
loopback clients only, and only while the API itself listens on a loopback address: off
loopback, nobody may change anything until a token is configured. Reads are never guarded.
What a change records as who made it (a silence's ``created_by``) is no more than the server
can tell, never what the request claims (:meth:`ChangeGuard.identity`): the name of the token
it carried (a token file may hold several, one per person or tool: ``NAME TOKEN`` per line),
and for a client on this host the local user the kernel says owns its socket
(:mod:`collector.api.peer_user`).

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
from pathlib import Path
from typing import TYPE_CHECKING, Final

import structlog

from collector.api.peer_user import peer_uid, user_name
from fleetwatch.tls import is_loopback

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Callable

log = structlog.get_logger("collector.http")

_SCHEME: Final = "bearer "
_MAX_TOKENS: Final = 1_000
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@-")


def parse_tokens(secret: bytes) -> dict[bytes, str]:
    """The API tokens a secret holds, each with its name ("" for a lone unnamed token).

    A secret is one token, or lines of ``NAME TOKEN`` (blank lines and ``#`` comments skipped).
    Names are letters, digits and ``._@-``; names and tokens are each unique.

    Raises:
        ValueError: a line is not ``NAME TOKEN``, a name is bad or repeated, a token repeated;
            the message names the line and the name, never a token.
    """
    lines = secret.splitlines()
    if len(lines) == 1 and len(lines[0].split()) == 1:
        return {lines[0].strip(): ""}
    tokens: dict[bytes, str] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith(b"#"):
            continue
        fields = line.split()
        if len(fields) != 2:  # noqa: PLR2004 - a name and a token
            msg = f"line {number}: expected NAME TOKEN, found {len(fields)} fields"
            raise ValueError(msg)
        name = fields[0].decode("ascii", "replace")
        if not set(name) <= _NAME_CHARS or len(name) > 64:  # noqa: PLR2004
            msg = f"line {number}: a token's name is letters, digits and ._@- (up to 64)"
            raise ValueError(msg)
        if name in tokens.values():
            msg = f"line {number}: the name {name} is given twice"
            raise ValueError(msg)
        if fields[1] in tokens:
            msg = f"line {number}: {name}'s token is the same as {tokens[fields[1]]}'s"
            raise ValueError(msg)
        tokens[fields[1]] = name
    if not tokens:
        msg = "no token in it"
        raise ValueError(msg)
    if len(tokens) > _MAX_TOKENS:
        msg = f"{len(tokens)} tokens: at most {_MAX_TOKENS}"
        raise ValueError(msg)
    return tokens


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

    __slots__ = ("_check", "_proc_root", "_tokens", "refusals")

    def __init__(
        self,
        *,
        token: bytes | None,
        listen_host: str,
        refused: Counter[str],
        proc_root: Path = Path("/proc"),
    ) -> None:
        """Choose the check once: by token, loopback only, or none allowed.

        ``token`` is the configured API token secret (None: none; one token or named ones, as
        :func:`parse_tokens` reads it), ``listen_host`` the address the API is bound to,
        ``refused`` the counter refusals are added to, by reason; ``proc_root`` is where the
        kernel's socket tables are read to name a local client's user.

        Raises:
            ValueError: the secret is empty or holds no valid tokens (:func:`parse_tokens`).
        """
        if token is not None and not token.strip():
            msg = "an API token must not be empty"
            raise ValueError(msg)
        self._tokens = parse_tokens(token) if token is not None else None
        self._proc_root = proc_root
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
        return self._tokens is not None

    def identity(
        self, client: tuple[str, int], server: tuple[str, int], authorization: str | None
    ) -> str:
        """Who a change this guard let through came from, as far as the server can tell.

        ``token NAME`` (or ``token`` for an unnamed one): the token it carried; ``user NAME``:
        the local user the kernel says owns the client's socket (a client on this host);
        both, comma-separated, when both are known; ``loopback``: a local client whose user
        could not be found (another network namespace).
        """
        said: list[str] = []
        if self._tokens is not None:
            name = self._tokens.get(self._sent(authorization) or b"")
            said.append(f"token {name}" if name else "token")
        if is_loopback(client[0]):
            uid = peer_uid(client, server, self._proc_root)
            said.append(f"user {user_name(uid)}" if uid is not None else "loopback")
        return ", ".join(said) or "unknown"

    @staticmethod
    def _sent(authorization: str | None) -> bytes | None:
        header = (authorization or "").strip()
        if not header.lower().startswith(_SCHEME):
            return None
        return header[len(_SCHEME) :].strip().encode("latin-1", "replace")

    def check(
        self, *, client: str, authorization: str | None, method: str, path: str
    ) -> Refusal | None:
        """None when the request may proceed; else the refusal, counted and logged."""
        refusal = self._check(client, authorization)
        if refusal is not None:
            self.refusals.record(refusal, client=client, method=method, path=path)
        return refusal

    def _by_token(self, _client: str, authorization: str | None) -> Refusal | None:
        sent = self._sent(authorization)
        if sent is None:
            return Refusal(
                HTTPStatus.UNAUTHORIZED,
                "missing_token",
                "this change needs an API token: send Authorization: Bearer <token>",
            )
        # Every token is compared, so the time taken says nothing about which one nearly matched.
        matched = False
        for token in self._tokens or {}:
            matched |= hmac.compare_digest(sent, token)
        if not matched:
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
