"""HTTP to the collector's API as browsers and broken clients send it: any header, any bytes.

urllib fills in ``Host`` and ``Content-Type`` itself and refuses malformed requests; these
helpers send exactly what a test says (blocking: call them off the event loop).
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: status, headers (lower-case names) and the body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | str | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """One request with exactly ``headers`` (``Host`` too, when given); no Content-Type added."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def raw(port: int, data: bytes) -> Answer:
    """Send ``data`` as it is, read until the server closes, and parse the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        sock.sendall(data)
        return read_answer(sock)


def read_answer(sock: socket.socket) -> Answer:
    """Read until the server closes ``sock``; parse what came as an HTTP answer."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split()[1]), headers, body)


def half_sent(port: int, data: bytes) -> socket.socket:
    """A connection that sent ``data`` (a request cut short) and then nothing more."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    sock.sendall(data)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """Wait (up to the socket's timeout) for the server to close ``sock``; True when it did.

    False when the wait ran out with the connection still open.
    """
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def refused(port: int) -> dict[str, float]:
    """``fleetwatch_api_requests_refused_total`` by reason, as a scrape shows it."""
    text = request(port, "GET", "/metrics").body.decode()
    prefix = 'fleetwatch_api_requests_refused_total{reason="'
    return {
        line[len(prefix) :].partition('"')[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }
