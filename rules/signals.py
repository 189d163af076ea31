"""The signals agents report, by scope, so rule files can be checked against them.

Built from the agent's own tables, so a new signal there is known here without a second list.
Driver-specific IB counters (``ib_hw_*``) vary by HCA and are accepted by prefix.
"""

from __future__ import annotations

from typing import Final

from agent.job_report import REFUSAL_REASONS, REFUSED_SIGNAL_PREFIX
from agent.poll_bmc import BMC_SIGNALS
from agent.poll_ib import RATE_COUNTERS, RATE_HW_COUNTERS, signal_name
from agent.poll_ib_link import IB_LINK_SIGNALS, NODE_LINK_SIGNALS
from agent.probes.counters import IB_COUNTER_SPECS
from agent.probes.gpu_signals import CLOCK_REASON_SIGNALS, GPU_SIGNALS, NVLINK_SIGNALS
from rules.model import Scope

_PCIE_SYSFS: Final = (
    "pcie_sysfs_link_width",
    "pcie_sysfs_link_width_max",
    "pcie_sysfs_link_speed_gts",
    "pcie_sysfs_link_speed_gts_max",
    "pcie_link_width_degraded",
    "aer_correctable_total",
    "aer_nonfatal_total",
    "aer_fatal_total",
)

GPU: Final = frozenset(
    {
        "gpu_present",
        "pcie_link_gen_max",
        "pcie_link_width_max",
        *GPU_SIGNALS,
        *CLOCK_REASON_SIGNALS,
        "nvml_read_failures",
        *_PCIE_SYSFS,
    },
)
NVLINK: Final = frozenset(NVLINK_SIGNALS)
IB_PORT: Final = frozenset(
    {
        "ib_state",
        "ib_phys_state",
        "ib_link_downed",
        *(signal_name("ib_", name) for name in IB_COUNTER_SPECS),
        *(
            signal_name("ib_", name, "_saturated")
            for name, s in IB_COUNTER_SPECS.items()
            if s.saturates
        ),
        *(signal_name("ib_", name, "_per_second") for name in RATE_COUNTERS),
        *(signal_name("ib_hw_", name, "_per_second") for name in RATE_HW_COUNTERS),
        *IB_LINK_SIGNALS,
    },
)
NODE: Final = frozenset(
    {
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
        *(f"agent_source_errors_{s}" for s in ("nvml", "sysfs", "kmsg", "udev", "bmc")),
        *BMC_SIGNALS,
        *NODE_LINK_SIGNALS,
        "gpus_unidentified",
        "agent_job_reports",
        "agent_job_reports_lost",
        *(REFUSED_SIGNAL_PREFIX + reason for reason in REFUSAL_REASONS),
    },
)

# The signals a rule of each scope may name in ``signals.x``, ``rate()`` or ``increase()``:
# its own target's and its node's.
BY_SCOPE: Final[dict[Scope, frozenset[str]]] = {
    Scope.NODE: NODE,
    Scope.GPU: GPU | NODE,
    Scope.NVLINK: NVLINK | GPU | NODE,
    Scope.IB_PORT: IB_PORT | NODE,
    Scope.FLEET: IB_PORT | GPU | NODE,
}
OPEN_PREFIXES: Final = ("ib_hw_",)


def known(scope: Scope, signal: str) -> bool:
    """Whether a rule of ``scope`` may name ``signal``."""
    return signal in BY_SCOPE[scope] or (
        scope in (Scope.IB_PORT, Scope.FLEET) and signal.startswith(OPEN_PREFIXES)
    )
