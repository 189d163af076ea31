"""A collector told to listen on IPv6 addresses serves on them: gRPC for agents and HTTP for
the API, /metrics and the scrape targets (an IPv6-only management network is common in large
clusters). ``[::1]:0`` in the config is an IPv6 address in brackets, as docs/deploy.md writes it."""

import asyncio
import json
import urllib.request
from collections.abc import Callable

import pytest

from collector.config import CollectorConfig
from collector.main import CollectorService
from fleetwatch.clock import SystemClock

pytestmark = pytest.mark.integration


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - http on loopback
        return resp.status, resp.read()


def post(url: str, body: object) -> tuple[int, bytes]:
    req = urllib.request.Request(  # noqa: S310 - http on loopback
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - http on loopback
        return resp.status, resp.read()


async def test_the_collector_serves_on_ipv6_addresses(
    collector_config: Callable[..., CollectorConfig],
):
    service = CollectorService(collector_config(listen="[::1]:0", http="[::1]:0"), SystemClock())
    await service.start()
    try:
        base = f"http://[::1]:{service.http_port}"
        status, body = await asyncio.to_thread(get, base + "/healthz")
        assert status == 200, body
        status, body = await asyncio.to_thread(get, base + "/metrics")
        assert status == 200
        assert b"fleetwatch_collector_streams_active" in body
        status, body = await asyncio.to_thread(get, base + "/api/v1/scrape_targets")
        assert status == 200
        targets = json.loads(body)
        assert targets, "no scrape target listed"
        # the targets name the collector as Prometheus must reach it: the bracketed address
        assert all(t["targets"] == [f"[::1]:{service.http_port}"] for t in targets), targets
        # ::1 is loopback: without a token, a change from it is accepted as from 127.0.0.1
        silence = {"node": "node-1", "duration": "1h", "reason": "cable swap", "force": True}
        status, body = await asyncio.to_thread(post, base + "/api/v1/silences", silence)
        assert status == 201, body
    finally:
        await service.stop(grace=None)
