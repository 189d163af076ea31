"""Prometheus exposition rendered from the fleet model at scrape time.

A custom collector (not long-lived Gauge objects): each scrape yields fresh metric families from a
snapshot, so a node that leaves the model leaves /metrics with it. Per-link detail stays in the
JSON API; Prometheus gets per-node, per-GPU and per-port series (docs/metrics.md has the budget).
Every family comes from :mod:`collector.export.catalog`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client.registry import Collector

from collector.export.catalog import API_REFUSAL_REASONS, NODE_STATES, catalog, families
from collector.model.node_states import NodeFlags, node_state
from collector.model.state import OTHER_XIDS
from fleetwatch.signals import RATE_HW_COUNTERS, REFUSAL_REASONS, REFUSED_SIGNAL_PREFIX

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from prometheus_client.metrics_core import Metric

    from collector.model.fleet import FleetModel
    from collector.model.state import GpuState, NodeState, PortState
    from collector.stats import CollectorStats
    from fleetwatch.model import SampleValue

# Bits of NVML's clock event reasons, by the reason label they count under.
THROTTLE_REASONS: Final = (
    ("thermal", 0x20 | 0x40),  # SW and HW thermal slowdown
    ("power", 0x4 | 0x80),  # SW power cap, HW power brake
    ("hw_slowdown", 0x8),
)

# Per-GPU gauges: (metric, signal, scale to base units).
GPU_GAUGES: Final = (
    ("fleetwatch_gpu_temperature_celsius", "temperature_celsius", 1.0),
    ("fleetwatch_gpu_temperature_slowdown_celsius", "temperature_slowdown_celsius", 1.0),
    ("fleetwatch_gpu_nvml_read_failures", "nvml_read_failures", 1.0),
    ("fleetwatch_gpu_power_watts", "power_watts", 1.0),
    ("fleetwatch_gpu_utilization_ratio", "utilization_gpu_percent", 0.01),
    ("fleetwatch_gpu_memory_utilization_ratio", "utilization_memory_percent", 0.01),
    ("fleetwatch_gpu_sm_clock_hertz", "sm_clock_mhz", 1e6),
    ("fleetwatch_gpu_pcie_link_generation", "pcie_link_gen", 1.0),
    ("fleetwatch_gpu_pcie_link_generation_max", "pcie_link_gen_max", 1.0),
    ("fleetwatch_gpu_pcie_link_width", "pcie_link_width", 1.0),
    ("fleetwatch_gpu_pcie_link_width_max", "pcie_link_width_max", 1.0),
    ("fleetwatch_gpu_pcie_link_width_degraded", "pcie_link_width_degraded", 1.0),
    ("fleetwatch_gpu_pcie_link_speed_transfers_per_second", "pcie_sysfs_link_speed_gts", 1e9),
    (
        "fleetwatch_gpu_pcie_link_speed_max_transfers_per_second",
        "pcie_sysfs_link_speed_gts_max",
        1e9,
    ),
    ("fleetwatch_gpu_remap_pending", "remap_pending", 1.0),
    ("fleetwatch_gpu_remap_failure", "remap_failure", 1.0),
)
# Per-GPU families with one label beyond the GPU's: (metric, ((label value, signal), ...)).
GPU_LABELLED: Final = (
    (
        "fleetwatch_gpu_remapped_rows",
        (
            ("correctable", "remapped_rows_correctable"),
            ("uncorrectable", "remapped_rows_uncorrectable"),
        ),
    ),
    (
        "fleetwatch_gpu_ecc_errors_total",
        (("sbe", "ecc_sbe_aggregate_total"), ("dbe", "ecc_dbe_aggregate_total")),
    ),
    (
        "fleetwatch_gpu_ecc_volatile_errors_total",
        (("sbe", "ecc_sbe_volatile_total"), ("dbe", "ecc_dbe_volatile_total")),
    ),
    (
        "fleetwatch_gpu_pcie_aer_errors_total",
        (
            ("correctable", "aer_correctable_total"),
            ("nonfatal", "aer_nonfatal_total"),
            ("fatal", "aer_fatal_total"),
        ),
    ),
)
NVLINK_ERRORS: Final = (
    ("replay", "nvlink_replay_errors"),
    ("recovery", "nvlink_recovery_errors"),
    ("crc", "nvlink_crc_errors"),
)
# Per-port counters, as the HCA reports them, and the link's health flags: (metric, signal).
PORT_COUNTERS: Final = (
    ("fleetwatch_ib_port_transmit_bytes_total", "ib_port_xmit_bytes"),
    ("fleetwatch_ib_port_receive_bytes_total", "ib_port_rcv_bytes"),
    ("fleetwatch_ib_port_transmit_packets_total", "ib_port_xmit_packets"),
    ("fleetwatch_ib_port_receive_packets_total", "ib_port_rcv_packets"),
    ("fleetwatch_ib_port_transmit_wait_total", "ib_port_xmit_wait"),
    ("fleetwatch_ib_port_link_downed_total", "ib_link_downed"),
    ("fleetwatch_ib_port_rate_low", "ib_rate_low"),
    ("fleetwatch_ib_port_roce_v2_gids", "roce_v2_gids"),
    ("fleetwatch_ib_port_nic_pcie_link_degraded", "nic_pcie_link_degraded"),
)
# fleetwatch_ib_port_errors_total{type}: (type, signal of the IBA counter).
PORT_ERRORS: Final = (
    ("symbol", "ib_symbol_error"),
    ("link_error_recovery", "ib_link_error_recovery"),
    ("receive", "ib_port_rcv_errors"),
    ("receive_remote_physical", "ib_port_rcv_remote_physical_errors"),
    ("receive_switch_relay", "ib_port_rcv_switch_relay_errors"),
    ("receive_constraint", "ib_port_rcv_constraint_errors"),
    ("transmit_discards", "ib_port_xmit_discards"),
    ("transmit_constraint", "ib_port_xmit_constraint_errors"),
    ("local_link_integrity", "ib_local_link_integrity_errors"),
    ("excessive_buffer_overrun", "ib_excessive_buffer_overrun_errors"),
    ("vl15_dropped", "ib_vl15_dropped"),
)
# fleetwatch_ib_port_hw_events_total{counter}: the mlx5 hw_counters the agent also sends rates of.
PORT_HW_COUNTERS: Final = tuple(sorted(RATE_HW_COUNTERS))
# Node signals of the agent's own health: (metric, signal).
AGENT_SIGNALS: Final = (
    ("fleetwatch_agent_outbox_pending", "agent_outbox_pending"),
    ("fleetwatch_agent_events_dropped_total", "agent_events_dropped"),
    ("fleetwatch_agent_telemetry_dropped_total", "agent_telemetry_dropped"),
    ("fleetwatch_agent_samples_refused_total", "agent_samples_refused"),
    ("fleetwatch_agent_spool_bytes", "agent_spool_bytes"),
    ("fleetwatch_agent_spool_write_errors_total", "agent_spool_write_errors"),
    ("fleetwatch_agent_spool_damaged_total", "agent_spool_damaged"),
    ("fleetwatch_agent_kmsg_overruns_total", "agent_kmsg_overruns"),
    ("fleetwatch_agent_ib_resets_total", "agent_ib_counter_resets"),
    ("fleetwatch_agent_config_last_reload_successful", "agent_config_last_reload_successful"),
    ("fleetwatch_agent_config_reload_failures_total", "agent_config_reload_failures"),
    ("fleetwatch_agent_events_coalesced_total", "agent_events_coalesced"),
    ("fleetwatch_agent_nvml_hung", "agent_nvml_hung"),
    ("fleetwatch_agent_nvml_calls_timed_out_total", "agent_nvml_calls_timed_out"),
    ("fleetwatch_agent_rss_bytes", "agent_rss_bytes"),
    ("fleetwatch_agent_cpu_seconds_total", "agent_cpu_seconds"),
    ("fleetwatch_agent_poll_interval_seconds", "agent_poll_interval_seconds"),
    ("fleetwatch_agent_poll_stretches_total", "agent_poll_stretches"),
    ("fleetwatch_agent_memory_sheds_total", "agent_memory_sheds"),
    ("fleetwatch_agent_collector_index", "agent_collector_index"),
    ("fleetwatch_agent_collector_away", "agent_collector_away"),
    ("fleetwatch_agent_collector_failovers_total", "agent_collector_failovers"),
    ("fleetwatch_agent_job_reports_total", "agent_job_reports"),
    ("fleetwatch_agent_job_reports_lost_total", "agent_job_reports_lost"),
    # the node's BMC
    ("fleetwatch_bmc_up", "bmc_up"),
    ("fleetwatch_agent_bmc_hung", "agent_bmc_hung"),
    ("fleetwatch_bmc_fans", "bmc_fans"),
    ("fleetwatch_bmc_fans_failed", "bmc_fans_failed"),
    ("fleetwatch_bmc_fan_rpm_min", "bmc_fan_rpm_min"),
    ("fleetwatch_bmc_psus", "bmc_psus"),
    ("fleetwatch_bmc_psus_working", "bmc_psus_working"),
    ("fleetwatch_bmc_psus_failed", "bmc_psus_failed"),
    ("fleetwatch_bmc_psus_needed", "bmc_psus_needed"),
    ("fleetwatch_bmc_psu_redundancy_lost", "bmc_psu_redundancy_lost"),
    ("fleetwatch_bmc_power_watts", "bmc_power_watts"),
    ("fleetwatch_bmc_inlet_temperature_celsius", "bmc_inlet_temperature_celsius"),
    ("fleetwatch_bmc_outlet_temperature_celsius", "bmc_outlet_temperature_celsius"),
    ("fleetwatch_bmc_temperature_max_celsius", "bmc_temperature_max_celsius"),
    ("fleetwatch_bmc_temperatures_critical", "bmc_temperatures_critical"),
    # links below their rate
    ("fleetwatch_nvswitch_pcie_links_degraded", "nvswitch_pcie_links_degraded"),
    ("fleetwatch_node_gpus_unidentified", "gpus_unidentified"),
)
AGENT_SOURCES: Final = ("nvml", "sysfs", "kmsg", "udev", "bmc")

FLEET_FAMILIES: Final = tuple(
    s.name for s in catalog() if s.group in ("Nodes", "GPUs", "InfiniBand ports")
)
_NOT_HERE: Final = frozenset({"fleetwatch_node_failures_total"})  # rendered by RulesCollector


def not_here(name: str) -> bool:
    """Whether a per-node family is rendered elsewhere (by the rules' exporter), not here."""
    return name in _NOT_HERE


def _number(signals: Mapping[str, SampleValue], name: str) -> float | None:
    value = signals.get(name)
    return None if value is None or isinstance(value, str) else float(value)


class _Families:
    """The metric families of one scrape, filled node by node."""

    def __init__(self, flags: NodeFlags, xid_class: Callable[[int], str]) -> None:
        self.f = families(n for n in FLEET_FAMILIES if n not in _NOT_HERE)
        self.flags = flags
        self.xid_class = xid_class

    def add_node(self, node: NodeState) -> None:
        f, n = self.f, node.name
        f["fleetwatch_node_up"].add_metric([n], float(node.reachable))
        f["fleetwatch_node_connected"].add_metric([n], float(node.connected))
        f["fleetwatch_node_last_seen_timestamp_seconds"].add_metric([n], node.last_seen_unix)
        state = node_state(node, self.flags)
        for name in NODE_STATES:
            f["fleetwatch_node_state"].add_metric([n, name], float(name == state))
        f["fleetwatch_node_info"].add_metric([n, node.agent_version, node.driver_version], 1)
        for kind, count in sorted(node.events.items()):
            f["fleetwatch_node_events_total"].add_metric([n, kind], count)
        self.add_agent(n, node.signals)  # the scrape's own snapshot: no copy needed
        for gpu in sorted(node.gpus.values(), key=lambda g: g.index):
            self.add_gpu([n, str(gpu.index)], gpu)
        for port in node.ports.values():
            self.add_port([n, port.device, str(port.port)], port)

    def add_agent(self, n: str, signals: Mapping[str, SampleValue]) -> None:
        """The node agent's own health, as its signals tell it."""
        f = self.f
        for metric, signal in AGENT_SIGNALS:
            if (value := _number(signals, signal)) is not None:
                f[metric].add_metric([n], value)
        for source in AGENT_SOURCES:
            if (value := _number(signals, f"agent_source_errors_{source}")) is not None:
                f["fleetwatch_agent_source_errors_total"].add_metric([n, source], value)
        for reason in REFUSAL_REASONS:
            if (value := _number(signals, REFUSED_SIGNAL_PREFIX + reason)) is not None:
                f["fleetwatch_agent_job_reports_refused_total"].add_metric([n, reason], value)

    def add_gpu(self, labels: list[str], gpu: GpuState) -> None:
        f = self.f
        f["fleetwatch_gpu_info"].add_metric([*labels, gpu.uuid, gpu.pci_bus_id, gpu.model], 1)
        f["fleetwatch_gpu_present"].add_metric(labels, float(gpu.present))
        f["fleetwatch_gpu_nvlinks"].add_metric(labels, gpu.nvlink_count)
        f["fleetwatch_gpu_nvlinks_down"].add_metric(labels, gpu.nvlinks_down)
        if gpu.pcie_replay_count is not None:
            f["fleetwatch_gpu_pcie_replays_total"].add_metric(labels, gpu.pcie_replay_count)
        for xid, count in sorted(gpu.xid_counts.items()):
            shown = ("other", "other") if xid == OTHER_XIDS else (str(xid), self.xid_class(xid))
            f["fleetwatch_gpu_xid_errors_total"].add_metric([*labels, *shown], count)
        self._add_gpu_health(labels, gpu)

    def _add_gpu_health(self, labels: list[str], gpu: GpuState) -> None:
        f = self.f
        for metric, signal, scale in GPU_GAUGES:
            if (value := gpu.number(signal)) is not None:
                f[metric].add_metric(labels, value * scale)
        for metric, rows in GPU_LABELLED:
            for label, signal in rows:
                if (value := gpu.number(signal)) is not None:
                    f[metric].add_metric([*labels, label], value)
        reasons = gpu.number("clock_event_reasons")
        if reasons is not None:
            bits = int(reasons)
            for reason, mask in THROTTLE_REASONS:
                f["fleetwatch_gpu_clocks_throttled"].add_metric(
                    [*labels, reason], float(bool(bits & mask))
                )
        for kind, signal in NVLINK_ERRORS:
            if (total := gpu.link_total(signal)) is not None:
                f["fleetwatch_gpu_nvlink_errors_total"].add_metric([*labels, kind], total)

    def add_port(self, labels: list[str], port: PortState) -> None:
        f = self.f
        f["fleetwatch_ib_port_up"].add_metric(labels, float(port.up))
        f["fleetwatch_ib_port_state"].add_metric([*labels, port.state, port.phys_state], 1)
        for metric, signal in PORT_COUNTERS:
            if (value := port.number(signal)) is not None:
                f[metric].add_metric(labels, value)
        for kind, signal in PORT_ERRORS:
            if (value := port.number(signal)) is not None:
                f["fleetwatch_ib_port_errors_total"].add_metric([*labels, kind], value)
        for counter in PORT_HW_COUNTERS:
            if (value := port.number(f"ib_hw_{counter}")) is not None:
                f["fleetwatch_ib_port_hw_events_total"].add_metric([*labels, counter], value)


def _unknown_class(_xid: int) -> str:
    return "unknown"


class FleetCollector(Collector):
    """Yields the fleet's metric families from one snapshot per scrape."""

    def __init__(
        self,
        fleet: FleetModel,
        stats: CollectorStats,
        *,
        flags: Callable[[], NodeFlags] = NodeFlags,
        xid_class: Callable[[int], str] = _unknown_class,
        nodes: bool = True,
    ) -> None:
        """Read from ``fleet`` and ``stats``; register with a registry you own.

        ``flags`` says which nodes are drained, draining or have a firing incident (for
        ``fleetwatch_node_state``); ``xid_class`` names an Xid's catalog class. ``nodes``:
        False yields only the collector's own series (the collector renders the nodes' with
        :mod:`collector.export.exposition`; this class's are the reference it is tested and
        measured against).
        """
        self._fleet = fleet
        self._stats = stats
        self._flags = flags
        self._xid_class = xid_class
        self._nodes = nodes

    def describe(self) -> list[Metric]:
        """Skip the registration-time collect (families are dynamic)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Render every family."""
        if self._nodes:
            fam = _Families(self._flags(), self._xid_class)
            for node in self._fleet.snapshot().values():
                fam.add_node(node)
            yield from fam.f.values()
        yield from self._self_metrics()

    def _self_metrics(self) -> Iterator[Metric]:
        stats = self._stats
        f = families(s.name for s in catalog() if s.group == "The collector itself")
        f["fleetwatch_collector_streams_active"].add_metric([], stats.streams_active)
        for reason, count in sorted(stats.rejected_snapshot().items()):
            f["fleetwatch_collector_messages_rejected_total"].add_metric([reason], count)
        refused = dict.fromkeys(API_REFUSAL_REASONS, 0) | stats.api_refused_snapshot()
        for reason, count in sorted(refused.items()):
            f["fleetwatch_api_requests_refused_total"].add_metric([reason], count)
        for name, value in (
            ("events_journaled", stats.events_journaled),
            ("events_duplicate", stats.events_duplicate),
            ("reports", stats.reports),
            ("reports_deferred", stats.reports_deferred),
            ("samples", stats.samples),
            ("job_steps", stats.job_steps),
            ("seq_gaps", stats.seq_gaps),
        ):
            f[f"fleetwatch_collector_{name}_total"].add_metric([], value)
        journal = stats.journal
        f["fleetwatch_collector_journal_full"].add_metric([], int(journal.full))
        failures = dict.fromkeys(("disk_full", "other"), 0) | journal.failures_snapshot()
        for reason, count in sorted(failures.items()):
            f["fleetwatch_collector_journal_write_failures_total"].add_metric([reason], count)
        yield from f.values()
