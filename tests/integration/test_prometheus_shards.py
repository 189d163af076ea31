"""A real Prometheus finds the collector's shards through HTTP service discovery and scrapes them.

The collector splits its nodes' series into shard targets of a bounded size
(``metrics_shard_samples``) and lists them, with its fleet-level target, at
``/api/v1/scrape_targets``; Prometheus 2.x, configured as deploy/prometheus/prometheus.yml shows
(``http_sd_configs``, a ``sample_limit``, the ``shard`` label dropped from the samples), scrapes
every one. Real agents on simulated nodes stream over gRPC meanwhile.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from agent.sim.cluster import SimCluster
from collector.export.catalog import SERIES_PER_NODE_BUDGET
from collector.export.node_text import NODE_FAMILIES
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import free_port, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from collector.config import CollectorConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NODES = [f"node-{i}" for i in range(1, 6)]
SHARD_SAMPLES = 2 * SERIES_PER_NODE_BUDGET  # two nodes a shard
SAMPLE_LIMIT = SHARD_SAMPLES + 100
NODE_NAMES = frozenset(spec.name for spec in NODE_FAMILIES)
Series = tuple[str, frozenset[tuple[str, str]]]


def get_json(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - http on loopback
        return json.loads(resp.read())


def node_series(http_port: int) -> set[Series]:
    """The nodes' series as the collector's whole /metrics gives them."""
    url = f"http://127.0.0.1:{http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items()))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in NODE_NAMES
    }


class Prometheus:
    """Prometheus 2.x on loopback, discovering the collector's targets through http_sd."""

    def __init__(self, tmp_path: Path, http_port: int) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: scripts/ensure-test-deps.sh installs it"
        self.port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: fleetwatch\n"
            "    scrape_timeout: 1s\n"
            f"    sample_limit: {SAMPLE_LIMIT}\n"
            "    http_sd_configs:\n"
            f"      - url: http://127.0.0.1:{http_port}/api/v1/scrape_targets\n"
            "        refresh_interval: 1s\n"
            "    metric_relabel_configs:\n"
            "      - {action: labeldrop, regex: shard}\n"
        )
        self.log = (tmp_path / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )

    def ask(self, path: str, **params: str) -> Any:
        try:
            return get_json(self.port, path, **params)["data"]
        except OSError:
            return None  # not up yet

    def query(self, promql: str) -> list[dict[str, Any]]:
        return list((self.ask("/api/v1/query", query=promql) or {}).get("result", []))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture
async def fleet(
    collector_config: Callable[..., CollectorConfig], tmp_path: Path
) -> AsyncIterator[tuple[CollectorService, SimCluster]]:
    service = CollectorService(
        collector_config(metrics_shard_samples=SHARD_SAMPLES, metrics_render_interval=0.5),
        SystemClock(),
    )
    await service.start()
    cluster = SimCluster(
        NODES,
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.1,
        heartbeat_interval=0.2,
    )
    cluster.start()
    try:
        await wait_until(
            lambda: (
                all(
                    n.connected and n.gpus and all(g.signals for g in n.gpus.values())
                    for n in service.fleet.snapshot().values()
                )
                and len(service.fleet.node_names()) == len(NODES)
            ),
            what="every node's first report",
        )
        yield service, cluster
    finally:
        await cluster.stop()
        await service.stop(grace=None)


def active_targets(prometheus: Prometheus) -> list[dict[str, Any]]:
    data = prometheus.ask("/api/v1/targets", state="active")
    return list(data["activeTargets"]) if data else []


async def test_prometheus_scrapes_every_node_once_through_the_shards(
    fleet: tuple[CollectorService, SimCluster], tmp_path: Path
):
    """Prometheus finds the fleet target and one target per two nodes; every node's series
    arrive with the labels /metrics gives them (plus job and instance, no shard label), none
    twice, no shard over the sample limit; a node that leaves the fleet leaves its shard."""
    service, cluster = fleet
    prometheus = Prometheus(tmp_path, service.http_port)
    instance = f"127.0.0.1:{service.http_port}"
    try:

        def all_up() -> bool:
            targets = active_targets(prometheus)
            return len(targets) == 4 and all(t["health"] == "up" for t in targets)

        await wait_until(all_up, 30, "the fleet target and 3 shard targets, up")
        paths = sorted(t["labels"].get("shard", "-") for t in active_targets(prometheus))
        assert paths == ["-", "0", "1", "2"]
        expected = await asyncio.to_thread(node_series, service.http_port)
        assert {dict(labels)["node"] for _, labels in expected} == set(NODES)

        def stored() -> set[Series]:
            match = '{__name__=~"fleetwatch_(node|gpu|ib|agent|bmc)_.*",node!=""}'
            rows = prometheus.ask("/api/v1/series", **{"match[]": match}) or []
            return {
                (row.pop("__name__"), frozenset(row.items()))
                for row in rows
                if row["__name__"] in NODE_NAMES
            }

        want = {
            (n, labels | {("job", "fleetwatch"), ("instance", instance)}) for n, labels in expected
        }
        await wait_until(lambda: want <= stored(), 20, "every node series in Prometheus")
        assert not any(("shard", s) in labels for _, labels in stored() for s in "012")
        scraped = prometheus.query('scrape_samples_scraped{job="fleetwatch",shard!=""}')
        counts = {r["metric"]["shard"]: float(r["value"][1]) for r in scraped}
        assert sum(counts.values()) == len(expected)  # each node series in exactly one shard
        assert max(counts.values()) < SAMPLE_LIMIT
        fleet_target = prometheus.query('scrape_samples_scraped{job="fleetwatch",shard=""}')
        assert fleet_target
        assert prometheus.query('fleetwatch_collector_streams_active{shard=""}')

        # node-5 (alone in shard 2) and node-1 (beside node-2 in shard 0) leave the fleet: their
        # agents stop and the collector forgets them (what it does when a node moved to a peer).
        for name in ("node-5", "node-1"):
            await cluster.crash(name)

            def gone(node: str = name) -> bool:
                return not service.fleet.snapshot()[node].connected

            await wait_until(gone, what=f"{name}'s stream closed")
            service.fleet.forget(name)
        await wait_until(
            lambda: len(active_targets(prometheus)) == 3,
            20,
            "shard 2 gone from discovery",
        )
        await wait_until(
            lambda: not prometheus.query('fleetwatch_node_up{node=~"node-1|node-5"}'),
            20,
            "the series of the nodes that left marked stale",
        )
        assert prometheus.query('fleetwatch_node_up{node="node-2"}')
        assert {t["labels"].get("shard", "-") for t in active_targets(prometheus)} == {
            "-",
            "0",
            "1",
        }
    finally:
        prometheus.stop()


def scrape_forever(port: int, paths: list[str], stop: threading.Event, done: list[int]) -> None:
    """Scrape ``paths`` one after another, as Prometheus asks (OpenMetrics, gzip), until told."""
    headers = {
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        "Accept-Encoding": "gzip",
    }
    while not stop.is_set():
        for path in paths:
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
            with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - loopback
                body = gzip.decompress(resp.read())
            assert body.endswith(b"# EOF\n")
            done.append(1)


async def test_the_collector_keeps_acking_events_under_a_burst_of_scrapes(
    fleet: tuple[CollectorService, SimCluster],
):
    """Eight scrapers ask for every target over and over (OpenMetrics, gzipped) while Xid
    events happen on every node: each event is journaled and acked (the agents' outboxes
    empty) while the scrapes still run, and each scraper got its answers."""
    service, cluster = fleet
    targets = await asyncio.to_thread(get_json, service.http_port, "/api/v1/scrape_targets")
    paths = [t["labels"]["__metrics_path__"] for t in targets] + ["/metrics"]
    stop = threading.Event()
    done: list[int] = []
    scrapers = [
        threading.Thread(target=scrape_forever, args=(service.http_port, paths, stop, done))
        for _ in range(8)
    ]
    for thread in scrapers:
        thread.start()
    try:
        await wait_until(lambda: len(done) >= 16, 30, "scrapes under way")
        before = len(done)
        for round_ in range(3):
            for name in NODES:
                cluster.nodes[name].xid(round_, 13)  # an application Xid: notify only

            def journaled(rounds: int = round_ + 1) -> bool:
                return len(service.reader.events(kind="xid", limit=1000)) == len(NODES) * rounds

            await wait_until(journaled, 30, f"round {round_}'s Xid events journaled")
        await wait_until(lambda: cluster.unacked() == 0, 30, "every event acked")
        assert len(done) > before  # the scrapes went on meanwhile
        assert all(thread.is_alive() for thread in scrapers)
    finally:
        stop.set()
        for thread in scrapers:
            await asyncio.to_thread(thread.join, 60)


def listed_nodes(http_port: int) -> list[str]:
    """The nodes in every shard target a collector lists (a node twice would be listed twice)."""
    targets = get_json(http_port, "/api/v1/scrape_targets")
    out: list[str] = []
    for target in targets:
        path = target["labels"]["__metrics_path__"]
        if "shard" not in target["labels"]:
            continue
        url = f"http://127.0.0.1:{http_port}{path}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        out += [
            s.labels["node"]
            for family in text_string_to_metric_families(text)
            if family.name == "fleetwatch_node_up"
            for s in family.samples
        ]
    return out


async def test_a_node_that_moves_to_another_collector_is_listed_once(
    collector_config: Callable[..., CollectorConfig], pg_dsn: str, tmp_path: Path
):
    """Two collectors share a PostgreSQL journal; node-1's agent goes from c1 to c2. c1's shards
    drop node-1 once c2 holds its stream (at c1's next heartbeat), long before c1's liveness
    check would forget it (missed_heartbeats 60: 30 s): across both collectors' shards every
    node is listed exactly once throughout."""
    services = []
    for name in ("c1", "c2"):
        service = CollectorService(
            collector_config(journal_dsn=pg_dsn, name=name, missed_heartbeats=60),
            SystemClock(),
        )
        await service.start()
        services.append(service)
    c1, c2 = services
    clusters = []
    try:
        for nodes, service in ((["node-1", "node-2"], c1), (["node-3"], c2)):
            cluster = SimCluster(
                nodes,
                tmp_path / service.peers.name,
                SystemClock(),
                f"127.0.0.1:{service.grpc_port}",
                poll_interval=0.1,
                heartbeat_interval=0.2,
            )
            cluster.start()
            clusters.append(cluster)

        def everywhere() -> list[str]:
            return sorted(listed_nodes(c1.http_port) + listed_nodes(c2.http_port))

        async def listed() -> list[str]:
            return await asyncio.to_thread(everywhere)

        await wait_until(lambda: len(c1.fleet.node_names()) + len(c2.fleet.node_names()) == 3)
        assert await listed() == ["node-1", "node-2", "node-3"]
        # node-1 moves: its agent stops talking to c1, and the node comes up on c2.
        await clusters[0].crash("node-1")
        moved = SimCluster(
            ["node-1"],
            tmp_path / "moved",
            SystemClock(),
            f"127.0.0.1:{c2.grpc_port}",
            poll_interval=0.1,
            heartbeat_interval=0.2,
        )
        moved.start()
        clusters.append(moved)
        await wait_until(lambda: "node-1" in c2.fleet.node_names(), what="node-1 at c2")
        await wait_until(
            lambda: "node-1" not in listed_nodes(c1.http_port), 10, "node-1 gone from c1's shards"
        )
        assert "node-1" in c1.fleet.node_names()  # c1's liveness has not forgotten it yet
        assert await listed() == ["node-1", "node-2", "node-3"]
        assert listed_nodes(c2.http_port).count("node-1") == 1
    finally:
        for cluster in clusters:
            await cluster.stop()
        for service in services:
            await service.stop(grace=None)


def fetch(port: int, path: str, accept: str) -> bytes:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Accept": accept, "Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - http on loopback
        assert resp.headers["Content-Encoding"] == "gzip"
        return gzip.decompress(resp.read())


async def test_every_target_is_well_formed_in_both_formats(
    fleet: tuple[CollectorService, SimCluster],
):
    """From a collector with real agents: /metrics, /metrics/fleet and each shard pass
    `promtool check metrics` in the text format, and parse with prometheus_client's strict
    OpenMetrics parser when OpenMetrics is asked for; the shards and the fleet target together
    hold every series of /metrics, each once."""
    service, _ = fleet
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/ensure-test-deps.sh installs it"
    port = service.http_port
    targets = await asyncio.to_thread(get_json, port, "/api/v1/scrape_targets")
    paths = ["/metrics"] + [t["labels"]["__metrics_path__"] for t in targets]
    parts: list[Series] = []
    for path in paths:
        text = await asyncio.to_thread(fetch, port, path, "text/plain;version=0.0.4")
        done = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, check=False
        )
        assert done.returncode == 0, (path, done.stdout + done.stderr)
        openmetrics = await asyncio.to_thread(fetch, port, path, "application/openmetrics-text")
        assert openmetrics.endswith(b"# EOF\n")
        families = list(om_families(openmetrics.decode()))  # type: ignore[no-untyped-call]
        names = [f.name for f in families]
        assert len(names) == len(set(names)), path  # each family once
        if path != "/metrics":
            parts += [
                (s.name, frozenset(s.labels.items()))
                for family in text_string_to_metric_families(text.decode())
                for s in family.samples
                if s.name in NODE_NAMES
            ]
    assert len(parts) == len(set(parts))
    assert {dict(labels)["node"] for _, labels in parts} == set(NODES)
