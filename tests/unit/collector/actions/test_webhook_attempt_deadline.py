"""One webhook attempt is bounded as a whole, not per read: a receiver that trickles its answer
a byte at a time cannot hold a delivery (and the action waiting on it) for ever."""

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from collector.actions.webhook import WebhookSender
from fleetwatch.clock import SystemClock

TIMEOUT_S = 1.0  # per attempt; the trickle sends a byte every 0.1 s, well inside it per read


@pytest.fixture
def trickler() -> Iterator[str]:
    """A receiver that reads the request, then answers one byte every 0.1 s, without end."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.recv(65536)
                for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000:
                    if stop.wait(0.1):
                        return
                    conn.send(bytes([byte]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    finally:
        stop.set()
        server.close()
        thread.join(timeout=10)


async def test_a_trickled_answer_ends_the_attempt_at_its_timeout(trickler: str):
    sender = WebhookSender(
        trickler, b"secret", SystemClock(), timeout_s=TIMEOUT_S, max_attempts=2,
        backoff_initial_s=0.1,
    )  # fmt: skip
    result = await asyncio.wait_for(sender.send({"node": "n1"}, "drain_node:x"), 30)
    assert not result.delivered
    assert result.attempts == 2
    assert result.error is not None
    assert f"no whole answer within {TIMEOUT_S:g} s" in result.error
