"""One Xid authority: the collector's catalog classes an Xid, whatever the agent's copy says.

A real collector with a catalog of its own and a simulated agent with the built-in one (an
agent whose catalog is older, say), over gRPC on loopback: the class the agent sends is not
what the journal, the API, /metrics or the rules show; the collector's is.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.sim.cluster import SimCluster
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

BUILTIN = Path(__file__).resolve().parents[2] / "rules" / "builtin" / "xid_catalog.yaml"
NODE = "node-1"
# Xid 48 in the agent's (built-in) catalog, and in the collector's.
THEIRS = "  48:  {name: Double-bit ECC error, class: memory, action: WORKFLOW, fatal: true}\n"
OURS = "  48:  {name: Double-bit ECC error, class: application, action: IGNORE, fatal: false}\n"


@pytest.fixture
async def collector(
    collector_config: Callable[..., CollectorConfig], tmp_path: Path
) -> AsyncIterator[CollectorService]:
    text = BUILTIN.read_text()
    assert THEIRS in text
    catalog = tmp_path / "xid_catalog.yaml"
    catalog.write_text(text.replace(THEIRS, OURS))
    service = CollectorService(collector_config(xid_catalog=catalog), SystemClock())
    await service.start()
    try:
        yield service
    finally:
        await service.stop(grace=None)


@pytest.fixture
async def cluster(collector: CollectorService, tmp_path: Path) -> AsyncIterator[SimCluster]:
    sim = SimCluster(
        [NODE],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{collector.grpc_port}",
        poll_interval=0.05,
        heartbeat_interval=0.2,
        backoff_initial=0.05,
        backoff_max=0.5,
    )
    sim.start()
    await wait_until(
        lambda: any(n.connected for n in collector.fleet.snapshot().values()),
        what="the agent connected",
    )
    try:
        yield sim
    finally:
        await sim.stop()


def http_get(collector: CollectorService, path: str) -> bytes:
    url = f"http://127.0.0.1:{collector.http_port}{path}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return bytes(resp.read())


class TestOneXidAuthority:
    async def test_the_collector_s_catalog_decides_an_xid_s_class_everywhere(
        self, collector: CollectorService, cluster: SimCluster
    ):
        """The agent sends Xid 48 as "memory" (its catalog); the collector's says "application":
        the journal, the events API, the Xid counter's label and the rules all say
        "application", and the application rule fires for the GPU."""
        cluster.nodes[NODE].xid(2, 48)
        await wait_until(
            lambda: bool(collector.reader.events(kind="xid", node=NODE)), what="the Xid journaled"
        )
        (row,) = collector.reader.events(kind="xid", node=NODE)
        assert (row.xid, row.xid_class) == (48, "application")

        body = json.loads(http_get(collector, f"/api/v1/events?kind=xid&node={NODE}"))
        assert [(e["xid"], e["xid_class"]) for e in body["events"]] == [(48, "application")]

        text = http_get(collector, "/metrics").decode()
        xids = {
            s.labels["class"]
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "fleetwatch_gpu_xid_errors_total" and s.labels.get("xid") == "48"
        }
        assert xids == {"application"}

        def fired() -> set[tuple[str, str]]:
            return {(i.rule, i.node) for i in collector.evaluator.engine.open_incidents()}

        await wait_until(
            lambda: ("xid_application_error", NODE) in fired(), what="the application rule"
        )
