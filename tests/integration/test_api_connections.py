"""Slow and idle HTTP connections are not held forever (issue 18, item 4).

Real connections to a real collector on loopback. Where a test waits for the server to close a
connection, the wait is bounded by the client's socket timeout (10 s), far past the limits set
here (0.5 s): what is asserted is that the server closed it, not how fast.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import select
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pytest

from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from tests.integration.raw_http import (
    TIMEOUT_S,
    closed_by_server,
    half_sent,
    read_answer,
    refused,
    request,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

HALF_HEADERS = b"GET /api/v1/nodes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Still-Typ"


@pytest.fixture
async def strict(
    collector_config: Callable[..., CollectorConfig],
) -> AsyncIterator[CollectorService]:
    """A collector whose clients get half a second for their headers and for their body."""
    service = CollectorService(collector_config(), SystemClock())
    service.http.limits = dataclasses.replace(
        service.http.limits, header_timeout_s=0.5, body_timeout_s=0.5, max_connections=16
    )
    await service.start()
    try:
        yield service
    finally:
        await service.stop(grace=None)


def healthz(port: int) -> tuple[int, bytes]:
    answer = request(port, "GET", "/healthz")
    return answer.status, answer.body


def drip_until_closed(port: int, most: int = 100) -> int:
    """Send a header one byte every 0.1 s; how many bytes went before the server closed."""
    sock = half_sent(port, b"GET /healthz HTTP/1.1\r\nX-Slow: ")
    with sock:
        for sent in range(most):
            readable, _, _ = select.select([sock], [], [], 0.1)
            if readable and not sock.recv(1024):
                return sent
            try:
                sock.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                return sent
    return most


class TestReadTimeouts:
    async def test_half_sent_requests_are_closed_while_healthz_answers(
        self, strict: CollectorService
    ):
        """Five requests cut off mid-header: /healthz answers meanwhile, and the server closes
        each once the header deadline passes, counted as read_timeout. Today they are held for
        as long as the clients like."""
        port = strict.http_port
        held = [await asyncio.to_thread(half_sent, port, HALF_HEADERS) for _ in range(5)]
        try:
            assert await asyncio.to_thread(healthz, port) == (200, b"ok\n")
            for sock in held:
                assert await asyncio.to_thread(closed_by_server, sock)
        finally:
            for sock in held:
                sock.close()
        assert (await asyncio.to_thread(refused, port))["read_timeout"] == 5.0

    async def test_a_client_dripping_its_headers_is_cut_off(self, strict: CollectorService):
        """The header deadline is a total, not a wait per read: a byte every 0.1 s against a
        0.5 s deadline is closed long before 100 bytes (10 s). Today it is never closed."""
        sent = await asyncio.to_thread(drip_until_closed, strict.http_port)
        assert sent < 100

    async def test_a_body_cut_short_is_closed_and_changes_nothing(self, strict: CollectorService):
        """A silence whose body stops after 10 of its 100 bytes: the connection is closed at
        the body deadline, nothing is added, and it counts as read_timeout."""
        port = strict.http_port
        head = (
            "POST /api/v1/silences HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        sock = await asyncio.to_thread(half_sent, port, head.encode() + b'{"node": "')
        with sock:
            assert await asyncio.to_thread(closed_by_server, sock)
        answer = await asyncio.to_thread(request, port, "GET", "/api/v1/silences")
        assert answer.json() == {"silences": []}
        assert (await asyncio.to_thread(refused, port))["read_timeout"] == 1.0


@pytest.fixture
async def capped(
    collector_config: Callable[..., CollectorConfig],
) -> AsyncIterator[CollectorService]:
    """A collector that holds at most three connections, with a long header deadline (so only
    the cap frees a connection here)."""
    service = CollectorService(collector_config(), SystemClock())
    service.http.limits = dataclasses.replace(
        service.http.limits, max_connections=3, header_timeout_s=60.0
    )
    await service.start()
    try:
        yield service
    finally:
        await service.stop(grace=None)


def wait_for_connections(service: CollectorService, expected: tuple[int, int]) -> None:
    """Block (the event loop too, when called on it) until the server holds ``expected``
    connections: (still sending their request, being answered)."""
    deadline = time.monotonic() + TIMEOUT_S
    while service.http.connections() != expected:
        assert time.monotonic() < deadline, service.http.connections()
        time.sleep(0.01)


class TestConnectionCap:
    async def test_at_the_cap_the_oldest_half_sent_request_makes_room(
        self, capped: CollectorService
    ):
        """Three half-sent requests fill the cap: /healthz still answers, because the oldest
        of them is closed for it (counted as evicted); the other two stay open. Today nothing
        is closed."""
        port = capped.http_port
        held = []
        try:
            for _ in range(3):
                held.append(await asyncio.to_thread(half_sent, port, HALF_HEADERS))
                await asyncio.to_thread(wait_for_connections, capped, (len(held), 0))
            assert await asyncio.to_thread(healthz, port) == (200, b"ok\n")
            assert await asyncio.to_thread(closed_by_server, held[0])
            await asyncio.to_thread(wait_for_connections, capped, (2, 0))
        finally:
            for sock in held:
                sock.close()
        await asyncio.to_thread(wait_for_connections, capped, (0, 0))
        assert (await asyncio.to_thread(refused, port))["evicted"] == 1.0

    async def test_at_the_cap_with_every_request_being_answered_a_newcomer_gets_503(
        self, capped: CollectorService
    ):
        """Three requests wait on the event loop (held by this test, as a long tick would):
        a fourth connection is answered 503 with Retry-After at once, not queued or held;
        the three are answered once the loop is free. Today the fourth is served."""
        port = capped.http_port
        capped.drains.wait_s = 30.0
        pool = ThreadPoolExecutor(3)
        try:
            waiting = [pool.submit(request, port, "GET", "/api/v1/drains") for _ in range(3)]
            # The loop is held from here to the first await: the three wait on it.
            wait_for_connections(capped, (0, 3))
            with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
                turned_away = read_answer(sock)
            answers = [await asyncio.wrap_future(w) for w in waiting]
        finally:
            pool.shutdown()
        assert turned_away.status == 503
        assert turned_away.headers["retry-after"] == "1"
        assert "retry shortly" in json.loads(turned_away.body)["error"]
        assert [a.status for a in answers] == [200, 200, 200]
        assert await asyncio.to_thread(healthz, port) == (200, b"ok\n")
        assert (await asyncio.to_thread(refused, port))["too_many_connections"] == 1.0
