"""Prometheus exposition rendered from the fleet model at scrape time.

A custom collector (not long-lived Gauge objects): each scrape yields fresh metric families from a
snapshot, so a node that leaves the model leaves /metrics with it. Per-link detail stays in the
JSON API; Prometheus gets per-node, per-GPU and per-port series (a few dozen per node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.metrics_core import Metric

    from collector.fleet import FleetModel
    from collector.stats import CollectorStats

NODE = ["node"]
GPU = ["node", "gpu"]
PORT = ["node", "device", "port"]


class FleetCollector(Collector):
    """Yields the fleet's metric families from one snapshot per scrape."""

    def __init__(self, fleet: FleetModel, stats: CollectorStats) -> None:
        """Read from ``fleet`` and ``stats``; register with a registry you own."""
        self._fleet = fleet
        self._stats = stats

    def describe(self) -> list[Metric]:
        """Skip the registration-time collect (families are dynamic)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Render every family."""
        nodes = self._fleet.snapshot()
        up = GaugeMetricFamily("fleetwatch_node_up", "1 if the node is reachable.", labels=NODE)
        connected = GaugeMetricFamily(
            "fleetwatch_node_connected",
            "1 if the node's agent has a stream open to this collector.",
            labels=NODE,
        )
        last_seen = GaugeMetricFamily(
            "fleetwatch_node_last_seen_timestamp_seconds",
            "Unix time of the last message from the node.",
            labels=NODE,
        )
        events = CounterMetricFamily(
            "fleetwatch_node_events",
            "Events journaled for the node since this collector started, by kind.",
            labels=[*NODE, "kind"],
        )
        info = GaugeMetricFamily(
            "fleetwatch_gpu_info",
            "Identity of each GPU (value always 1).",
            labels=[*GPU, "uuid", "pci_bus_id", "model"],
        )
        present = GaugeMetricFamily(
            "fleetwatch_gpu_present",
            "1 while the GPU answers NVML; 0 once it is lost.",
            labels=GPU,
        )
        nvlinks = GaugeMetricFamily("fleetwatch_gpu_nvlinks", "NVLinks the GPU has.", labels=GPU)
        nvlinks_down = GaugeMetricFamily(
            "fleetwatch_gpu_nvlinks_down",
            "NVLinks of the GPU reported down.",
            labels=GPU,
        )
        replays = CounterMetricFamily(
            "fleetwatch_gpu_pcie_replays",
            "PCIe replay counter of the GPU, as NVML reports it.",
            labels=GPU,
        )
        xids = CounterMetricFamily(
            "fleetwatch_gpu_xid_errors",
            "Xid errors journaled for the GPU since this collector started, by Xid.",
            labels=[*GPU, "xid"],
        )
        port_up = GaugeMetricFamily(
            "fleetwatch_ib_port_up",
            "1 if the InfiniBand port is ACTIVE.",
            labels=PORT,
        )
        downed = CounterMetricFamily(
            "fleetwatch_ib_port_link_downed",
            "The port's link_downed counter (8-bit, saturates at 255).",
            labels=PORT,
        )
        for node in nodes.values():
            n = node.name
            up.add_metric([n], float(node.reachable))
            connected.add_metric([n], float(node.connected))
            last_seen.add_metric([n], node.last_seen_unix)
            for kind, count in sorted(node.events.items()):
                events.add_metric([n, kind], count)
            for gpu in sorted(node.gpus.values(), key=lambda g: g.index):
                labels = [n, str(gpu.index)]
                info.add_metric([*labels, gpu.uuid, gpu.pci_bus_id, gpu.model], 1)
                present.add_metric(labels, float(gpu.present))
                nvlinks.add_metric(labels, gpu.nvlink_count)
                nvlinks_down.add_metric(labels, gpu.nvlinks_down)
                if gpu.pcie_replay_count is not None:
                    replays.add_metric(labels, gpu.pcie_replay_count)
                for xid, count in sorted(gpu.xid_counts.items()):
                    xids.add_metric([*labels, str(xid)], count)
            for port in node.ports.values():
                labels = [n, port.device, str(port.port)]
                port_up.add_metric(labels, float(port.up))
                if port.link_downed is not None:
                    downed.add_metric(labels, port.link_downed)
        yield from (up, connected, last_seen, events, info, present, nvlinks, nvlinks_down)
        yield from (replays, xids, port_up, downed)
        yield from self._self_metrics()

    def _self_metrics(self) -> Iterator[Metric]:
        stats = self._stats
        yield GaugeMetricFamily(
            "fleetwatch_collector_streams_active",
            "Agent streams open now.",
            value=stats.streams_active,
        )
        rejected = CounterMetricFamily(
            "fleetwatch_collector_messages_rejected",
            "Agent messages refused, by reason (the stream is closed with a status).",
            labels=["reason"],
        )
        for reason, count in sorted(stats.rejected_snapshot().items()):
            rejected.add_metric([reason], count)
        yield rejected
        yield CounterMetricFamily(
            "fleetwatch_collector_events_journaled",
            "Events newly written to the journal.",
            value=stats.events_journaled,
        )
        yield CounterMetricFamily(
            "fleetwatch_collector_events_duplicate",
            "Events received again after a replay and dropped as duplicates.",
            value=stats.events_duplicate,
        )
        yield CounterMetricFamily(
            "fleetwatch_collector_reports",
            "Reports received from agents (an empty one is a heartbeat).",
            value=stats.reports,
        )
        yield CounterMetricFamily(
            "fleetwatch_collector_samples",
            "Samples received in reports (agents send only values that changed).",
            value=stats.samples,
        )
        yield CounterMetricFamily(
            "fleetwatch_collector_seq_gaps",
            "Streams whose first event skipped sequence numbers the journal never saw.",
            value=stats.seq_gaps,
        )
