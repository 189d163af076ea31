"""One Alertmanager's ``POST /api/v2/alerts``: the standard library's ``http.client``.

:meth:`AlertmanagerEndpoint.post` blocks: the forwarder (:mod:`collector.actions.alertmanager`)
runs it in a worker thread. The whole request is bounded by the timeout, a refusal (non-2xx) is
its status and the first :data:`ERROR_BODY_CHARS` characters of its answer, and no error raises.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import socket
import ssl
import threading
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

import fleetwatch

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

__all__ = ["API_PATH", "ERROR_BODY_CHARS", "AlertmanagerEndpoint"]

API_PATH: Final = "/api/v2/alerts"
ERROR_BODY_CHARS: Final = 200  # of a refusal's answer, in the error


class AlertmanagerEndpoint:
    """One Alertmanager: POSTs a batch of alerts, in a worker thread."""

    __slots__ = ("_connect", "_headers", "_path", "_timeout_s", "url")

    def __init__(
        self, url: str, *, timeout_s: float, token: bytes | None = None, ca_file: Path | None = None
    ) -> None:
        """``url``: the Alertmanager's base URL (checked by the config); ``ca_file``: https only.

        Raises:
            OSError: the CA file cannot be read or holds no certificate (ssl.SSLError).
        """
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
        connect: Callable[[], http.client.HTTPConnection]
        if parts.scheme == "https":
            context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            connect = functools.partial(
                http.client.HTTPSConnection, host, port, timeout=timeout_s, context=context
            )
        else:
            connect = functools.partial(http.client.HTTPConnection, host, port, timeout=timeout_s)
        self.url = url  # metrics and logs name the Alertmanager by it
        self._connect = connect
        self._path = parts.path.rstrip("/") + API_PATH
        self._timeout_s = timeout_s
        self._headers = {
            "Content-Type": "application/json",
            "User-Agent": f"fleetwatch/{fleetwatch.__version__}",
        }
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token.decode('utf-8', 'replace')}"

    def post(self, body: bytes) -> str | None:
        """Send one batch; None when Alertmanager took it, else why not (runs in a thread).

        The whole request is bounded by the timeout: an answer that trickles in has its
        connection shut when the time is up.
        """
        connection = self._connect()
        expired = threading.Event()
        deadline = threading.Timer(self._timeout_s, _cut_off, (connection, expired))
        deadline.daemon = True
        deadline.start()
        try:
            connection.request("POST", self._path, body=body, headers=self._headers)
            response = connection.getresponse()
            text = response.read(ERROR_BODY_CHARS * 4)
        except (OSError, http.client.HTTPException) as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if expired.is_set():
                return f"TimeoutError: no whole answer within {self._timeout_s:g} s ({error})"
            return error
        finally:
            deadline.cancel()
            connection.close()
        if 200 <= response.status < 300:  # noqa: PLR2004 - the 2xx range
            return None
        answer = " ".join(text.decode("utf-8", errors="replace").split())[:ERROR_BODY_CHARS]
        return f"HTTP {response.status} {response.reason}" + (f": {answer}" if answer else "")


def _cut_off(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The request's time is up: shut its socket, so the read blocked on it returns."""
    expired.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
