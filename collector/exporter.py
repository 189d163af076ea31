"""Prometheus exposition rendered from the fleet model at scrape time.

A custom collector (not long-lived Gauge objects): each scrape yields fresh metric families from a
snapshot, so a node that leaves the model leaves /metrics with it. Per-link detail stays in the
JSON API; Prometheus gets per-node, per-GPU and per-port series (a few hundred per node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.metrics_core import Metric

    from collector.fleet import FleetModel, GpuState, NodeState, PortState
    from collector.stats import CollectorStats

NODE: Final = ["node"]
GPU: Final = ["node", "gpu"]
PORT: Final = ["node", "device", "port"]

THERMAL_REASONS: Final = 0x20 | 0x40  # SW and HW thermal slowdown
POWER_REASONS: Final = 0x4 | 0x80  # SW power cap, HW power brake

# Per-GPU gauges: (metric, help, signal, scale to base units).
GPU_GAUGES: Final = (
    ("fleetwatch_gpu_temperature_celsius", "GPU core temperature.", "temperature_celsius", 1.0),
    ("fleetwatch_gpu_power_watts", "Board power draw.", "power_watts", 1.0),
    (
        "fleetwatch_gpu_utilization_ratio",
        "Share of time a kernel ran.",
        "utilization_gpu_percent",
        0.01,
    ),
    ("fleetwatch_gpu_sm_clock_hertz", "SM clock.", "sm_clock_mhz", 1e6),
    ("fleetwatch_gpu_pcie_link_generation", "PCIe link generation now.", "pcie_link_gen", 1.0),
    (
        "fleetwatch_gpu_pcie_link_generation_max",
        "Highest PCIe generation.",
        "pcie_link_gen_max",
        1.0,
    ),
    ("fleetwatch_gpu_pcie_link_width", "PCIe lanes in use now.", "pcie_link_width", 1.0),
    (
        "fleetwatch_gpu_pcie_link_width_max",
        "PCIe lanes the link can use.",
        "pcie_link_width_max",
        1.0,
    ),
    (
        "fleetwatch_gpu_remap_pending",
        "1 when a row remap waits for a GPU reset.",
        "remap_pending",
        1.0,
    ),
    ("fleetwatch_gpu_remap_failure", "1 when row remapping failed.", "remap_failure", 1.0),
)
# Per-port counters, as the HCA reports them: (metric, help, signal).
PORT_COUNTERS: Final = (
    ("fleetwatch_ib_port_transmit_bytes", "Bytes sent.", "ib_port_xmit_bytes"),
    ("fleetwatch_ib_port_receive_bytes", "Bytes received.", "ib_port_rcv_bytes"),
    (
        "fleetwatch_ib_port_transmit_wait",
        "Ticks the port waited to send: congestion (32-bit, saturates).",
        "ib_port_xmit_wait",
    ),
    ("fleetwatch_ib_port_symbol_errors", "Symbol errors (16-bit, saturates).", "ib_symbol_error"),
    ("fleetwatch_ib_port_receive_errors", "Bad packets received (16-bit).", "ib_port_rcv_errors"),
    (
        "fleetwatch_ib_port_link_downed",
        "Times the link went down (8-bit, saturates at 255).",
        "ib_link_downed",
    ),
)


class _Families:
    """The metric families of one scrape, filled node by node."""

    def __init__(self) -> None:
        self.up = GaugeMetricFamily(
            "fleetwatch_node_up", "1 if the node is reachable.", labels=NODE
        )
        self.connected = GaugeMetricFamily(
            "fleetwatch_node_connected",
            "1 if the node's agent has a stream open to this collector.",
            labels=NODE,
        )
        self.last_seen = GaugeMetricFamily(
            "fleetwatch_node_last_seen_timestamp_seconds",
            "Unix time of the last message from the node.",
            labels=NODE,
        )
        self.events = CounterMetricFamily(
            "fleetwatch_node_events",
            "Events journaled for the node since this collector started, by kind.",
            labels=[*NODE, "kind"],
        )
        self.info = GaugeMetricFamily(
            "fleetwatch_gpu_info",
            "Identity of each GPU (value always 1).",
            labels=[*GPU, "uuid", "pci_bus_id", "model"],
        )
        self.present = GaugeMetricFamily(
            "fleetwatch_gpu_present",
            "1 while the GPU answers NVML; 0 once it is lost.",
            labels=GPU,
        )
        self.nvlinks = GaugeMetricFamily(
            "fleetwatch_gpu_nvlinks", "NVLinks the GPU has.", labels=GPU
        )
        self.nvlinks_down = GaugeMetricFamily(
            "fleetwatch_gpu_nvlinks_down",
            "NVLinks of the GPU reported down.",
            labels=GPU,
        )
        self.replays = CounterMetricFamily(
            "fleetwatch_gpu_pcie_replays",
            "PCIe replay counter of the GPU, as NVML reports it.",
            labels=GPU,
        )
        self.xids = CounterMetricFamily(
            "fleetwatch_gpu_xid_errors",
            "Xid errors journaled for the GPU since this collector started, by Xid.",
            labels=[*GPU, "xid"],
        )
        self.gauges = {
            name: GaugeMetricFamily(name, doc, labels=GPU) for name, doc, _, _ in GPU_GAUGES
        }
        self.throttled = GaugeMetricFamily(
            "fleetwatch_gpu_clocks_throttled",
            "1 while the GPU's clocks are held down, by reason.",
            labels=[*GPU, "reason"],
        )
        self.ecc = CounterMetricFamily(
            "fleetwatch_gpu_ecc_errors",
            "ECC errors over the GPU's life (aggregate), by type (sbe, dbe).",
            labels=[*GPU, "type"],
        )
        self.nvlink_errors = CounterMetricFamily(
            "fleetwatch_gpu_nvlink_errors",
            "NVLink data-link errors summed over the GPU's links, by type.",
            labels=[*GPU, "type"],
        )
        self.aer = CounterMetricFamily(
            "fleetwatch_gpu_pcie_aer_errors",
            "PCIe AER error messages of the GPU's PCI function, by severity.",
            labels=[*GPU, "severity"],
        )
        self.port_up = GaugeMetricFamily(
            "fleetwatch_ib_port_up",
            "1 if the InfiniBand port is ACTIVE.",
            labels=PORT,
        )
        self.port_counters = {
            name: CounterMetricFamily(name, doc, labels=PORT) for name, doc, _ in PORT_COUNTERS
        }

    def add_node(self, node: NodeState) -> None:
        n = node.name
        self.up.add_metric([n], float(node.reachable))
        self.connected.add_metric([n], float(node.connected))
        self.last_seen.add_metric([n], node.last_seen_unix)
        for kind, count in sorted(node.events.items()):
            self.events.add_metric([n, kind], count)
        for gpu in sorted(node.gpus.values(), key=lambda g: g.index):
            self.add_gpu([n, str(gpu.index)], gpu)
        for port in node.ports.values():
            self.add_port([n, port.device, str(port.port)], port)

    def add_gpu(self, labels: list[str], gpu: GpuState) -> None:
        self.info.add_metric([*labels, gpu.uuid, gpu.pci_bus_id, gpu.model], 1)
        self.present.add_metric(labels, float(gpu.present))
        self.nvlinks.add_metric(labels, gpu.nvlink_count)
        self.nvlinks_down.add_metric(labels, gpu.nvlinks_down)
        if gpu.pcie_replay_count is not None:
            self.replays.add_metric(labels, gpu.pcie_replay_count)
        for xid, count in sorted(gpu.xid_counts.items()):
            self.xids.add_metric([*labels, str(xid)], count)
        self._add_gpu_health(labels, gpu)

    def _add_gpu_health(self, labels: list[str], gpu: GpuState) -> None:
        for name, _, signal, scale in GPU_GAUGES:
            value = gpu.number(signal)
            if value is not None:
                self.gauges[name].add_metric(labels, value * scale)
        reasons = gpu.number("clock_event_reasons")
        if reasons is not None:
            bits = int(reasons)
            self.throttled.add_metric([*labels, "thermal"], float(bool(bits & THERMAL_REASONS)))
            self.throttled.add_metric([*labels, "power"], float(bool(bits & POWER_REASONS)))
        for kind in ("sbe", "dbe"):
            value = gpu.number(f"ecc_{kind}_aggregate_total")
            if value is not None:
                self.ecc.add_metric([*labels, kind], value)
        for kind in ("replay", "recovery", "crc"):
            total = gpu.link_total(f"nvlink_{kind}_errors")
            if total is not None:
                self.nvlink_errors.add_metric([*labels, kind], total)
        for severity in ("correctable", "nonfatal", "fatal"):
            value = gpu.number(f"aer_{severity}_total")
            if value is not None:
                self.aer.add_metric([*labels, severity], value)

    def add_port(self, labels: list[str], port: PortState) -> None:
        self.port_up.add_metric(labels, float(port.up))
        for name, _, signal in PORT_COUNTERS:
            value = port.number(signal)
            if value is not None:
                self.port_counters[name].add_metric(labels, value)

    def all(self) -> Iterator[Metric]:
        yield from (self.up, self.connected, self.last_seen, self.events)
        yield from (self.info, self.present, self.nvlinks, self.nvlinks_down, self.replays)
        yield from (self.xids, *self.gauges.values(), self.throttled, self.ecc)
        yield from (self.nvlink_errors, self.aer, self.port_up, *self.port_counters.values())


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
        families = _Families()
        for node in self._fleet.snapshot().values():
            families.add_node(node)
        yield from families.all()
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
        for name, doc, value in (
            ("events_journaled", "Events newly written to the journal.", stats.events_journaled),
            (
                "events_duplicate",
                "Events received again after a replay and dropped as duplicates.",
                stats.events_duplicate,
            ),
            ("reports", "Reports received (an empty one is a heartbeat).", stats.reports),
            ("samples", "Samples received (agents send only changed values).", stats.samples),
            ("job_steps", "Training-step reports received from agents.", stats.job_steps),
            (
                "seq_gaps",
                "Streams whose first event skipped numbers the journal never saw.",
                stats.seq_gaps,
            ),
        ):
            yield CounterMetricFamily(f"fleetwatch_collector_{name}", doc, value=value)
