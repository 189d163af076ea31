"""The signal vocabulary: every sample name an agent may send, by what it describes.

Both programs and the rules speak it: the agent's pollers say how each name is read from the
hardware (their tables are held to these names by tests/unit/fleetwatch/test_signals.py), the
collector keeps some in fields of their own, and ``rules/signals.py`` checks rule files against
it. Driver-specific IB counters (``ib_hw_*``) vary by HCA and are open by prefix.
"""

from __future__ import annotations

import re
from typing import Final

# Kept by the collector's model in fields of their own (gpu.present, a port's state...).
GPU_PRESENT: Final = "gpu_present"
PCIE_REPLAY_COUNT: Final = "pcie_replay_count"
NVLINK_UP: Final = "nvlink_up"
NVLINK_ERROR_COUNTERS: Final = (
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "nvlink_crc_errors",
)
IB_STATE: Final = "ib_state"
IB_PHYS_STATE: Final = "ib_phys_state"
IB_LINK_DOWNED: Final = "ib_link_downed"

# Per GPU, as NVML reports them.
GPU_VALUES: Final = (
    PCIE_REPLAY_COUNT,
    "pcie_link_gen",
    "pcie_link_width",
    "ecc_sbe_volatile_total",
    "ecc_dbe_volatile_total",
    "ecc_sbe_aggregate_total",
    "ecc_dbe_aggregate_total",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remap_pending",
    "remap_failure",
    "clock_event_reasons",
    "temperature_celsius",
    "temperature_slowdown_celsius",
    "power_watts",
    "utilization_gpu_percent",
    "utilization_memory_percent",
    "sm_clock_mhz",
)
# Flags read out of the clock-event (throttle) reason bitmask, one sample each: CEL, the rules'
# language, has no bitwise operators.
CLOCK_REASONS: Final = (
    "clocks_hw_slowdown",
    "clocks_sw_thermal_slowdown",
    "clocks_hw_thermal_slowdown",
    "clocks_hw_power_brake",
)
# Per GPU, from the kernel's view of its PCIe link (sysfs) and AER counters.
PCIE_SYSFS: Final = (
    "pcie_sysfs_link_width",
    "pcie_sysfs_link_width_max",
    "pcie_sysfs_link_speed_gts",
    "pcie_sysfs_link_speed_gts_max",
    "pcie_link_width_degraded",
    "aer_correctable_total",
    "aer_nonfatal_total",
    "aer_fatal_total",
)
# Per NVLink of a GPU.
NVLINK_VALUES: Final = (NVLINK_UP, *NVLINK_ERROR_COUNTERS)

# Per IB port: the IBA PortCounters (the data counters reported in bytes), ``ib_<counter>``.
IB_COUNTERS: Final = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_wait",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
    "port_xmit_bytes",
    "port_rcv_bytes",
)
# The narrow PortCounters stop at their top; each has an ``ib_<counter>_saturated`` flag.
IB_SATURATING: Final = IB_COUNTERS[: IB_COUNTERS.index("port_xmit_wait") + 1]
# Counters whose rate is worth a sample of its own, ``ib_<counter>_per_second``; the raw value of
# every counter is sent as well, and only when it changes.
RATE_COUNTERS: Final = frozenset(
    {
        "port_xmit_bytes",
        "port_rcv_bytes",
        "port_xmit_wait",
        "symbol_error",
        "link_error_recovery",
        "port_rcv_errors",
        "port_xmit_discards",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
    },
)
# The mlx5 hw_counters with a rate sample, ``ib_hw_<counter>_per_second``.
RATE_HW_COUNTERS: Final = frozenset(
    {
        "out_of_buffer",
        "out_of_sequence",
        "packet_seq_err",
        "local_ack_timeout_err",
        "rnr_nak_retry_err",
        "np_cnp_sent",
        "rp_cnp_handled",
    },
)
# Per IB or RoCE port, from its link and its NIC's PCIe link.
IB_LINK_SIGNALS: Final = (
    "ib_rate_gbps",
    "ib_link_width",
    "ib_rate_expected_gbps",
    "ib_rate_low",
    "roce_v2_gids",
    "roce_gid_missing",
    "nic_pcie_link_width",
    "nic_pcie_link_width_max",
    "nic_pcie_link_speed_gts",
    "nic_pcie_link_speed_gts_max",
    "nic_pcie_link_degraded",
)
OPEN_PREFIXES: Final = ("ib_hw_",)

# Per node: the NVSwitches' PCIe links.
NODE_LINK_SIGNALS: Final = ("nvswitch_pcie_links_degraded",)
# Per node, from a BMC read.
BMC_SIGNALS: Final = (
    "bmc_up",
    "agent_bmc_hung",
    "bmc_fans",
    "bmc_fans_failed",
    "bmc_fan_rpm_min",
    "bmc_psus",
    "bmc_psus_working",
    "bmc_psus_failed",
    "bmc_psus_needed",
    "bmc_psu_redundancy_lost",
    "bmc_power_watts",
    "bmc_inlet_temperature_celsius",
    "bmc_outlet_temperature_celsius",
    "bmc_temperature_max_celsius",
    "bmc_temperatures_critical",
)
# Every reason the agent refuses a training rank's report for: what it says (first row), who
# sent it (second). Each is counted in the node signal ``agent_job_reports_refused_<reason>``.
REFUSAL_REASONS: Final = (
    "too_large",
    "not_json",
    "version",
    "missing_field",
    "bad_type",
    "bad_value",
    "unknown_gpu",
    "no_credentials",
    "sender_gone",
    "job_mismatch",
    "job_owned",
    "uid_jobs_full",
    "pod_jobs_full",
    "node_jobs_full",
    "owner_ranks_full",
    "node_ranks_full",
    "uid_connections_full",
    "connections_full",
)
REFUSED_SIGNAL_PREFIX: Final = "agent_job_reports_refused_"
SOURCES: Final = ("nvml", "sysfs", "kmsg", "udev", "bmc")
# Per node, about the agent itself.
AGENT_SIGNALS: Final = (
    "agent_outbox_pending",
    "agent_events_dropped",
    "agent_telemetry_dropped",
    "agent_samples_refused",
    "agent_spool_bytes",
    "agent_spool_write_errors",
    "agent_spool_damaged",
    "agent_kmsg_overruns",
    "agent_ib_counter_resets",
    "agent_config_last_reload_successful",
    "agent_config_reload_failures",
    "agent_events_coalesced",
    "agent_nvml_hung",
    "agent_nvml_calls_timed_out",
    "agent_rss_bytes",
    "agent_cpu_seconds",
    "agent_poll_interval_seconds",
    "agent_poll_stretches",
    "agent_memory_sheds",
    "agent_collector_index",
    "agent_collector_away",
    "agent_collector_failovers",
    *(f"agent_source_errors_{s}" for s in SOURCES),
    "gpus_unidentified",
    "agent_job_reports",
    "agent_job_reports_lost",
    *(REFUSED_SIGNAL_PREFIX + reason for reason in REFUSAL_REASONS),
)

_UNSAFE: Final = re.compile(r"[^a-z0-9_]")


def signal_name(prefix: str, counter: str, suffix: str = "") -> str:
    """``prefix`` + a counter's name made safe for the wire (lowercase, bounded) + ``suffix``."""
    return f"{prefix}{_UNSAFE.sub('_', counter.lower())}{suffix}"[:64]


# Per GPU, read once (the link's top generation and width) or counted by the agent.
GPU_STATIC: Final = ("pcie_link_gen_max", "pcie_link_width_max", "nvml_read_failures")
GPU: Final = frozenset({GPU_PRESENT, *GPU_VALUES, *CLOCK_REASONS, *GPU_STATIC, *PCIE_SYSFS})
NVLINK: Final = frozenset(NVLINK_VALUES)
IB_PORT: Final = frozenset(
    {
        IB_STATE,
        IB_PHYS_STATE,
        IB_LINK_DOWNED,
        *(signal_name("ib_", name) for name in IB_COUNTERS),
        *(signal_name("ib_", name, "_saturated") for name in IB_SATURATING),
        *(signal_name("ib_", name, "_per_second") for name in RATE_COUNTERS),
        *(signal_name("ib_hw_", name, "_per_second") for name in RATE_HW_COUNTERS),
        *IB_LINK_SIGNALS,
    },
)
NODE: Final = frozenset({*AGENT_SIGNALS, *BMC_SIGNALS, *NODE_LINK_SIGNALS})
