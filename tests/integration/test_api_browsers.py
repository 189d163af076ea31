"""What a web page could make a browser send to the collector's API, refused (issue 18, item 3).

The collector here is the tokenless kind a page could reach: API on loopback, no token, so a
loopback client may change state. A page in a browser on the same host is such a client.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest

from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from tests.integration.raw_http import Answer, request
from tests.integration.raw_http import refused as refused_counts

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

EVIL = "https://evil.example"
# What the page in the issue sent: every node, every rule, for a year and a day.
EVERYTHING = json.dumps({"node": "*", "rule": "*", "duration": "366d", "all": True})
JSON = {"Content-Type": "application/json"}


async def call(service: CollectorService, method: str, path: str, body: Any = None, **headers):
    """One request off the event loop (a change is written through the loop's journal)."""
    return await asyncio.to_thread(request, service.http_port, method, path, body, headers)


def refused(service: CollectorService) -> dict[str, float]:
    return refused_counts(service.http_port)


async def silences(service: CollectorService) -> list[dict[str, Any]]:
    answer = await call(service, "GET", "/api/v1/silences")
    assert answer.status == 200
    found: list[dict[str, Any]] = answer.json()["silences"]
    return found


def error(answer: Answer) -> str:
    assert answer.headers["content-type"] == "application/json"
    return str(answer.json()["error"])


class TestCrossOrigin:
    async def test_a_cross_origin_form_post_is_refused(self, collector: CollectorService):
        """A form a page of another origin posts (urlencoded, or JSON with its Origin) adds no
        silence and releases no drain: 403, counted as cross_origin. Today it is 201."""
        form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": EVIL}
        answer = await call(collector, "POST", "/api/v1/silences", EVERYTHING, **form)
        assert answer.status == 403
        assert "another origin" in error(answer)
        answer = await call(collector, "POST", "/api/v1/silences", EVERYTHING, Origin=EVIL, **JSON)
        assert answer.status == 403
        answer = await call(collector, "POST", "/api/v1/drains/node-1/release", "{}", **form)
        assert answer.status == 403
        answer = await call(collector, "DELETE", "/api/v1/silences/1", Origin="null")
        assert answer.status == 403
        assert await silences(collector) == []
        assert refused(collector)["cross_origin"] == 4.0

    async def test_the_collectors_own_origin_may_change(self, collector: CollectorService):
        """A page the collector itself served (same scheme, host and port) and a client that
        sends no Origin at all (curl, the CLI) may still change."""
        own = f"http://127.0.0.1:{collector.http_port}"
        answer = await call(collector, "POST", "/api/v1/silences", EVERYTHING, Origin=own, **JSON)
        assert answer.status == 201
        answer = await call(collector, "POST", "/api/v1/silences", EVERYTHING, **JSON)
        assert answer.status == 201
        other_port = f"http://127.0.0.1:{collector.http_port + 1}"
        answer = await call(
            collector, "POST", "/api/v1/silences", EVERYTHING, Origin=other_port, **JSON
        )
        assert answer.status == 403
        assert len(await silences(collector)) == 2


class TestJsonOnly:
    async def test_a_text_plain_body_is_refused(self, collector: CollectorService):
        """A `text/plain` or form body (what a page may send without asking the browser
        first), or a POST with no Content-Type, is 415 and changes nothing (today: 201); JSON
        with a charset passes, and a DELETE without a body needs no Content-Type."""
        for ctype in ("text/plain", "text/plain;charset=UTF-8", "multipart/form-data; b=x"):
            answer = await call(
                collector, "POST", "/api/v1/silences", EVERYTHING, **{"Content-Type": ctype}
            )
            assert answer.status == 415, ctype
            assert "Content-Type: application/json" in error(answer)
        answer = await call(collector, "POST", "/api/v1/drains/node-1/release", b"")
        assert answer.status == 415
        assert await silences(collector) == []
        assert refused(collector)["not_json"] == 4.0
        # JSON with a charset is JSON; a DELETE with no body needs no type (the CLI sends none)
        charset = {"Content-Type": "Application/JSON; charset=utf-8"}
        answer = await call(collector, "POST", "/api/v1/silences", EVERYTHING, **charset)
        assert answer.status == 201
        answer = await call(collector, "DELETE", f"/api/v1/silences/{answer.json()['id']}")
        assert answer.status == 200


class TestHost:
    async def test_a_rebinding_host_is_refused(self, collector: CollectorService):
        """A page whose name was rebound to 127.0.0.1 sends its own name as Host (and, being
        same-origin then, its own Origin): the JSON API, /metrics and changes are 403, counted
        as bad_host; /healthz still answers. Today all of them answer. The collector's own
        names still work."""
        port = collector.http_port
        host = {"Host": f"evil.example:{port}"}
        page = {"Origin": f"http://evil.example:{port}", **host, **JSON}
        for path in ("/api/v1/nodes", "/api/v1/silences", "/metrics"):
            answer = await call(collector, "GET", path, **host)
            assert answer.status == 403, path
            assert "http_allowed_hosts" in error(answer)
        answer = await call(collector, "POST", "/api/v1/silences", EVERYTHING, **page)
        assert answer.status == 403
        answer = await call(collector, "GET", "/healthz", **host)
        assert (answer.status, answer.body) == (200, b"ok\n")
        assert await silences(collector) == []
        assert refused(collector)["bad_host"] == 4.0
        # the collector's own names: IP addresses, localhost (any case, a trailing dot), none
        for name in ("127.0.0.1", f"127.0.0.1:{port}", f"LocalHost:{port}", "localhost.", "[::1]"):
            answer = await call(collector, "GET", "/api/v1/nodes", Host=name)
            assert answer.status == 200, name
        answer = await call(
            collector,
            "POST",
            "/api/v1/silences",
            EVERYTHING,
            Host=f"localhost:{port}",
            Origin=f"http://localhost:{port}",
            **JSON,
        )
        assert answer.status == 201


@pytest.fixture
async def behind_proxy(
    collector_config: Callable[..., CollectorConfig],
) -> AsyncIterator[CollectorService]:
    """A collector that a proxy at https://fleet.example.com forwards to."""
    cfg = collector_config(http_allowed_hosts=["Fleet.Example.com"])
    service = CollectorService(cfg, SystemClock())
    await service.start()
    try:
        yield service
    finally:
        await service.stop(grace=None)


class TestAllowedHosts:
    async def test_a_proxys_name_is_allowed_when_listed(self, behind_proxy: CollectorService):
        """http_allowed_hosts admits its names as Host, and as the Origin of a change that a
        proxy forwarded with its Host rewritten; other names stay refused."""
        answer = await call(behind_proxy, "GET", "/api/v1/nodes", Host="fleet.example.com")
        assert answer.status == 200
        answer = await call(
            behind_proxy,
            "POST",
            "/api/v1/silences",
            EVERYTHING,
            Origin="https://fleet.example.com",
            **JSON,
        )
        assert answer.status == 201
        answer = await call(behind_proxy, "GET", "/api/v1/nodes", Host="other.example.com")
        assert answer.status == 403
