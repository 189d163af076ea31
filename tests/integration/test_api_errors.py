"""Bad requests, a busy event loop and clients that hang up (issue 18, items 6 and 7).

Each is answered (or not) without a 500 and logged as one structured line, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest
from structlog.testing import capture_logs

from tests.integration.raw_http import TIMEOUT_S, Answer, raw, read_answer, refused, request

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from collector.main import CollectorService

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}
SILENCE = json.dumps({"node": "node-7", "duration": "2h", "force": True})  # not in the fleet


def no_tracebacks(logs: list[MutableMapping[str, Any]], stderr: str) -> None:
    """Nothing was logged with an exception attached, and nothing printed a traceback."""
    assert [e for e in logs if "exc_info" in e or "exception" in e] == []
    assert [e for e in logs if e["event"] == "http_request_failed"] == []
    assert "Traceback" not in stderr


class TestBadRequests:
    async def test_each_is_a_400_with_a_json_error_and_one_log_line(
        self, collector: CollectorService, capfd: pytest.CaptureFixture[str]
    ):
        """A silence id past 64 bits, Content-Length: abc, a body 30,000 arrays (or 10,000
        objects) deep, a body that is no UTF-8 and a body shorter than its length are each 400
        with a JSON error saying what is wrong, counted as bad_request and logged as one
        api_request_refused line. Today the first three are 500 with a traceback in the log."""
        port = collector.http_port
        deep = b"[" * 30_000 + b"]" * 30_000
        deep_object = b'{"r":' * 10_000 + b"1" + b"}" * 10_000
        cases: list[tuple[str, Any]] = [
            ("a silence id", ("DELETE", f"/api/v1/silences/{10**30}", None, {})),
            ("a silence id", ("DELETE", "/api/v1/silences/-1", None, {})),
            ("nested too deeply", ("POST", "/api/v1/silences", deep, JSON)),
            ("nested too deeply", ("POST", "/api/v1/drains/node-1/release", deep_object, JSON)),
            ("body is not JSON", ("POST", "/api/v1/silences", b"\xff\xfe\xfa", JSON)),
        ]
        with capture_logs() as logs:
            for expected, args in cases:
                answer = await asyncio.to_thread(request, port, *args)
                assert answer.status == 400, args[:2]
                assert expected in answer.json()["error"]
            bad_length = (
                b"POST /api/v1/silences HTTP/1.0\r\nContent-Type: application/json\r\n"
                b"Content-Length: abc\r\n\r\n{}"
            )
            answer = await asyncio.to_thread(raw, port, bad_length)
            assert answer.status == 400
            assert "Content-Length 'abc' is not a number of bytes" in answer.json()["error"]
            short = (
                b"POST /api/v1/silences HTTP/1.0\r\nContent-Type: application/json\r\n"
                b"Content-Length: 50\r\n\r\n{}"
            )
            answer = await asyncio.to_thread(raw_then_hang_up, port, short)
            assert answer.status == 400
            assert "ended after 2 of its 50 bytes" in answer.json()["error"]
        refusals = [e for e in logs if e["event"] == "api_request_refused"]
        assert [e["reason"] for e in refusals] == ["bad_request"] * 7
        assert all(e["why"] for e in refusals)
        no_tracebacks(logs, capfd.readouterr().err)
        assert (await asyncio.to_thread(refused, port))["bad_request"] == 7.0
        answer = await asyncio.to_thread(request, port, "GET", "/api/v1/silences")
        assert answer.json() == {"silences": []}

    async def test_what_the_server_refuses_itself_is_a_json_error(
        self, collector: CollectorService
    ):
        """What the standard library's parser refuses (too many headers, a method the API does
        not have) is a JSON error too, counted as bad_request. Today it is an HTML page."""
        port = collector.http_port
        headers = b"".join(b"X-%d: 1\r\n" % i for i in range(120))
        answer = await asyncio.to_thread(raw, port, b"GET / HTTP/1.1\r\n" + headers + b"\r\n")
        assert answer.status == 431
        assert answer.headers["content-type"] == "application/json"
        assert "Too many headers" in answer.json()["error"]
        answer = await asyncio.to_thread(raw, port, b"BREW /pot HTTP/1.1\r\n\r\n")
        assert answer.status == 501
        assert "BREW" in answer.json()["error"]
        assert (await asyncio.to_thread(refused, port))["bad_request"] == 2.0


def raw_then_hang_up(port: int, data: bytes) -> Answer:
    """Send ``data`` and shut our side for writing: the body ends where ``data`` does."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        return read_answer(sock)


def through_the_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Hand ``loop`` a coroutine from this thread, as the API's bridge does, and wait for it to
    run: what threads handed the loop before it has been taken up by then (blocking)."""
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(timeout=TIMEOUT_S)


class TestBusyLoop:
    async def test_a_busy_loop_is_503_with_retry_after_and_changes_nothing(
        self, collector: CollectorService, capfd: pytest.CaptureFixture[str]
    ):
        """While the event loop is held (as by a long tick), a drain list and a silence get
        503 with Retry-After and a JSON error once the bridge's wait is over, not a 500 after
        10 s; the silence is not added later behind the client's back when the loop frees.
        Today the client gives up first (5 s) and the log gets BrokenPipe tracebacks."""
        port = collector.http_port
        waits = collector.drains.wait_s, collector.silences.wait_s
        collector.drains.wait_s = collector.silences.wait_s = 0.3
        pool = ThreadPoolExecutor(2)
        try:
            with capture_logs() as logs:
                drains = pool.submit(request, port, "GET", "/api/v1/drains")
                silence = pool.submit(request, port, "POST", "/api/v1/silences", SILENCE, JSON)
                # The loop is held until both are answered: nothing here awaits.
                answers = drains.result(timeout=30), silence.result(timeout=30)
                # The loop takes up what was handed to it meanwhile (and must drop it); a
                # journal write that started would be committed before this one returns.
                await asyncio.to_thread(through_the_loop, asyncio.get_running_loop())
                await collector.journal.do(lambda _s: None)
        finally:
            pool.shutdown()
        # The loop is free again: the request below waits as long as it normally would.
        collector.drains.wait_s, collector.silences.wait_s = waits
        for answer in answers:
            assert answer.status == 503
            assert answer.headers["retry-after"] == "5"
            assert "nothing was done, retry shortly" in answer.json()["error"]
        busy = [e for e in logs if e["event"] == "api_request_refused"]
        assert [(e["reason"], e["started"]) for e in busy] == [("loop_busy", False)] * 2
        no_tracebacks(logs, capfd.readouterr().err)
        answer = await asyncio.to_thread(request, port, "GET", "/api/v1/silences")
        assert answer.json() == {"silences": []}
        assert (await asyncio.to_thread(refused, port))["loop_busy"] == 2.0
        answer = await asyncio.to_thread(request, port, "GET", "/api/v1/drains")
        assert answer.status == 200


def send_then_reset(service: CollectorService, data: bytes) -> None:
    """Send ``data``, wait until the server has read it and is answering it (blocking, the event
    loop too when called on it), then hang up with a reset."""
    sock = socket.create_connection(("127.0.0.1", service.http_port), timeout=TIMEOUT_S)
    sock.sendall(data)
    deadline = time.monotonic() + TIMEOUT_S
    while service.http.connections() != (0, 1):
        assert time.monotonic() < deadline, service.http.connections()
        time.sleep(0.01)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class TestClientGone:
    async def test_a_client_that_hung_up_is_one_quiet_line(
        self, collector: CollectorService, capfd: pytest.CaptureFixture[str]
    ):
        """A client that resets its connection while its drain list waits on the held loop:
        the answer cannot be written, and that is one info line, http_client_gone, with no
        traceback. Today it is a logged exception and a traceback on stderr."""
        head = b"GET /api/v1/drains HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
        with capture_logs() as logs:
            # The loop is held while the client sends and hangs up.
            send_then_reset(collector, head)
            deadline = time.monotonic() + TIMEOUT_S
            while not [e for e in logs if e["event"] == "http_client_gone"]:
                assert time.monotonic() < deadline, logs
                await asyncio.sleep(0.02)
        gone = [e for e in logs if e["event"] == "http_client_gone"]
        assert len(gone) == 1
        assert gone[0]["log_level"] == "info"
        assert gone[0]["error"] in ("BrokenPipeError", "ConnectionResetError")
        no_tracebacks(logs, capfd.readouterr().err)
