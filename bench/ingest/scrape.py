"""What one full pass over every series costs: the collector's exposition against prometheus_client.

A fleet model is filled from the recording (each node's Hello, its first Report, then a steady
Report), in this process: the figure is the exposition's own CPU, without the load's or gRPC's.
The peer is prometheus_client's ``generate_latest`` over a registry holding the same series (the
same families and samples, collected once beforehand), so both render the same text.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from bench.ingest.wire import NodeWire
from collector.config import CollectorConfig
from collector.export.catalog import SERIES_PER_NODE_BUDGET
from collector.export.exposition import (
    OPENMETRICS,
    RENDER_INTERVAL_S,
    SHARD_SAMPLES,
    TEXT,
    NodeExposition,
)
from collector.export.fleet import FleetCollector
from collector.export.node_text import NODE_FAMILIES
from collector.main import CollectorService
from collector.model.fleet import FleetModel
from collector.stats import CollectorStats
from fleetwatch.clock import SystemClock
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from prometheus_client.metrics_core import Metric

    from bench.ingest.wire import Recording

ACCEPT: Final = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
NODE_FAMILY_NAMES: Final = frozenset(spec.name.removesuffix("_total") for spec in NODE_FAMILIES)


def fill_fleet(fleet: FleetModel, recording: Recording, nodes: int) -> list[NodeWire]:
    """Add ``nodes`` generated nodes to ``fleet``: Hello, first Report and one steady Report."""
    wires = [NodeWire(recording, i) for i in range(nodes)]
    now = time.time()
    for i, wire in enumerate(wires):
        hello = pb.AgentMessage.FromString(wire.hello(recording, int(now * 1000))).hello
        fleet.on_hello(hello, time.monotonic(), now)
        first = pb.Report.FromString(wire.render(recording.first))
        fleet.apply_report(wire.name, first)
        steady = recording.steady[i % len(recording.steady)]
        fleet.apply_report(wire.name, pb.Report.FromString(wire.render(steady)))
    return wires


def move(fleet: FleetModel, recording: Recording, wires: list[NodeWire], step: int) -> None:
    """Every node sends its next steady Report (what one second of a busy fleet changes)."""
    for i, wire in enumerate(wires):
        steady = recording.steady[(i + step) % len(recording.steady)]
        fleet.apply_report(wire.name, pb.Report.FromString(wire.render(steady)))


class Frozen(Collector):
    """Yields families collected once (prometheus_client renders them on each pass)."""

    def __init__(self, metrics: list[Metric]) -> None:
        """Hold ``metrics``."""
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        """The held families."""
        yield from self._metrics


def frozen_registry(metrics: list[Metric]) -> CollectorRegistry:
    """A registry yielding ``metrics``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Frozen(metrics))
    return registry


def cpu(fn: Callable[[], object]) -> float:
    """Process CPU seconds one call of ``fn`` took."""
    began = time.process_time()
    fn()
    return time.process_time() - began


def full_pass(exposition: NodeExposition, fmt: str) -> int:
    """Every shard once, gzipped, as Prometheus asks for them; return the bytes served."""
    total = 0
    for shard in exposition.shards():
        body = exposition.shard(shard, fmt, gzipped=True)
        total += len(body or b"")
    return total


def measure(recording: Recording, nodes: int, rounds: int) -> dict[str, Any]:
    """The exposition's CPU for a full pass over ``nodes`` nodes' series, against prometheus_client.

    Each round: every node sends its next steady Report (so every node changed), then one full
    pass over every shard as Prometheus asks (OpenMetrics, gzip), a second pass with nothing
    changed, and prometheus_client's ``generate_latest`` over the same series (FleetCollector's
    families, collected beforehand) and with the collecting. Medians over the rounds.
    """
    fleet = FleetModel()
    wires = fill_fleet(fleet, recording, nodes)
    clock = [0.0]
    exposition = NodeExposition(
        fleet,
        monotonic=lambda: clock[0],
        nodes_per_shard=SHARD_SAMPLES // SERIES_PER_NODE_BUDGET,
    )
    reference = FleetCollector(fleet, CollectorStats())
    changed, unchanged, text_only, theirs, theirs_collect, theirs_gzip = [], [], [], [], [], []
    series = 0
    for step in range(rounds):
        move(fleet, recording, wires, step + 1)
        clock[0] += RENDER_INTERVAL_S  # the render interval has passed: every node is redone
        changed.append(cpu(lambda: full_pass(exposition, OPENMETRICS)))
        unchanged.append(cpu(lambda: full_pass(exposition, OPENMETRICS)))
        clock[0] += RENDER_INTERVAL_S
        move(fleet, recording, wires, step + 1)
        text_only.append(cpu(lambda: exposition.everything(TEXT)))
        metrics = [m for m in reference.collect() if m.name in NODE_FAMILY_NAMES]
        registry = frozen_registry(metrics)
        theirs.append(cpu(lambda: generate_latest(registry)))  # noqa: B023 - called at once
        # What prometheus_client's own HTTP handler serves a client asking for gzip.
        theirs_gzip.append(cpu(lambda: gzip.compress(generate_latest(registry))))  # noqa: B023
        theirs_collect.append(
            cpu(lambda: generate_latest(frozen_registry(list(reference.collect()))))
        )
        series = sum(len(m.samples) for m in metrics)
    med = statistics.median
    per_1000 = 1000 / nodes
    ours = med(changed)
    return {
        "scrape_cpu_nodes": nodes,
        "scrape_cpu_series": series,
        "scrape_cpu_shards": len(exposition.shards()),
        "scrape_cpu_rounds": rounds,
        "scrape_cpu_s_per_1000_nodes": round(ours * per_1000, 4),
        "scrape_cpu_unchanged_s_per_1000_nodes": round(med(unchanged) * per_1000, 4),
        "scrape_cpu_render_only_s_per_1000_nodes": round(med(text_only) * per_1000, 4),
        "prometheus_client_generate_latest_s_per_1000_nodes": round(med(theirs) * per_1000, 4),
        "prometheus_client_collect_and_generate_s_per_1000_nodes": round(
            med(theirs_collect) * per_1000, 4
        ),
        "scrape_cpu_ratio_vs_prometheus_client": round(ours / med(theirs), 3),
        "scrape_cpu_ratio_vs_prometheus_client_collect": round(ours / med(theirs_collect), 3),
        "prometheus_client_generate_and_gzip_s_per_1000_nodes": round(
            med(theirs_gzip) * per_1000, 4
        ),
        "scrape_cpu_ratio_vs_prometheus_client_gzip": round(ours / med(theirs_gzip), 3),
        "scrape_cpu_ratio_text_only": round(med(text_only) / med(theirs), 3),
        "scrape_cpu_definition": (
            "CPU of one full pass over every shard target (OpenMetrics, gzip level 1) right after "
            "every node sent a Report and the render interval passed (every node rendered "
            "anew), in this process; against prometheus_client.generate_latest over the same "
            "series (FleetCollector's families collected beforehand), medians over the rounds"
        ),
        "scrape_cpu_ratio_definitions": (
            "_vs_prometheus_client: ours with gzip against generate_latest without; _gzip: both "
            "as served to a client asking for gzip (prometheus_client's handler: gzip level 9); "
            "_text_only: neither gzipped (ours: every node rendered anew, all families joined)"
        ),
    }


def measure_http(recording: Recording, nodes: int, rounds: int) -> dict[str, Any]:
    """A shard request through the collector's HTTP server against rendering the shard directly.

    A real ``CollectorService`` in this process (its stdlib HTTP server, a thread per
    connection) with ``nodes`` nodes put in its model; each round every node sends a Report,
    then every shard is asked for over HTTP (OpenMetrics, gzip, a connection each, as
    Prometheus' scrapes come), then again with nothing changed; the same directly. The
    difference is what the server, its thread and the client cost a request.
    """
    return asyncio.run(_measure_http(recording, nodes, rounds))


async def _measure_http(recording: Recording, nodes: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleetwatch-scrape-") as tmp:
        cfg = CollectorConfig(
            listen="127.0.0.1:0",
            http="127.0.0.1:0",
            journal=Path(tmp) / "journal.db",
            metrics_render_interval=0.0,
        )
        service = CollectorService(cfg, SystemClock())
        await service.start()
        try:
            wires = fill_fleet(service.fleet, recording, nodes)
            exposition = service.node_metrics
            shards = exposition.shards()
            headers = {"Accept": ACCEPT, "Accept-Encoding": "gzip"}

            def over_http() -> None:
                for shard in shards:
                    conn = http.client.HTTPConnection("127.0.0.1", service.http_port, timeout=60)
                    conn.request("GET", f"/metrics/shards/{shard}", headers=headers)
                    conn.getresponse().read()
                    conn.close()

            def direct() -> None:
                for shard in shards:
                    exposition.shard(shard, OPENMETRICS, gzipped=True)

            runs: dict[str, list[float]] = {"http": [], "http_same": [], "direct": [], "same": []}
            for step in range(rounds):
                move(service.fleet, recording, wires, step + 1)
                runs["http"].append(await asyncio.to_thread(cpu, over_http))
                runs["http_same"].append(await asyncio.to_thread(cpu, over_http))
                move(service.fleet, recording, wires, step + 2)
                runs["direct"].append(await asyncio.to_thread(cpu, direct))
                runs["same"].append(await asyncio.to_thread(cpu, direct))
        finally:
            await service.stop(grace=None)
    ms = {k: round(statistics.median(v) * 1000 / len(shards), 3) for k, v in runs.items()}
    return {
        "http_nodes": nodes,
        "http_shards": len(shards),
        "http_cpu_ms_per_shard_request": ms["http"],
        "http_cpu_ms_per_shard_request_unchanged": ms["http_same"],
        "direct_cpu_ms_per_shard": ms["direct"],
        "direct_cpu_ms_per_shard_unchanged": ms["same"],
        "http_overhead_cpu_ms_per_request": round(ms["http_same"] - ms["same"], 3),
    }
