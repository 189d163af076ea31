"""Node detail: one node (the ``node`` variable), GPU by GPU and port by port.

Every per-GPU and per-port series the collector exports has a panel here, so whatever a rule
fired on can be seen next to what else the node did at that moment. A new panel goes into its
place in ``PANELS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from grafana_foundation_sdk.models import common as cm

from dashboards.common import (
    BLUE,
    FULL,
    NODE_STATES,
    ORANGE_FROM_ONE,
    QUARTER,
    RANGE,
    RATE,
    RED_BELOW_ONE,
    RED_FROM_ONE,
    SCRAPE,
    THIRD,
    WINDOW,
    actions_annotation,
    incidents_annotation,
    increase,
    new_dashboard,
    query_variable,
    thresholds,
    value_text,
)
from dashboards.panels import Row, Stat, State, Table, Timeseries

if TYPE_CHECKING:
    from grafana_foundation_sdk.models import dashboard as dm

UID: Final = "fleetwatch-node-detail"
N: Final = '{node="$node"}'
GPU: Final = "GPU {{gpu}}"
PORT: Final = "{{device}}/{{port}}"
HIDE: Final = (*SCRAPE, "Value", "node")
PRESENT: Final = value_text({"0": ("lost", "red"), "1": ("present", "green")})
UP_DOWN: Final = value_text({"0": ("down", "red"), "1": ("up", "green")})
ON: Final = value_text({"0": ("no", "green"), "1": ("yes", "red")})


def _per_gpu(
    title: str, description: str, expr: str, unit: str = "short", legend: str = GPU
) -> Timeseries:
    """A third-wide panel of a per-GPU series of the node: a line per GPU."""
    return Timeseries(title, description, [(expr, legend)], unit=unit, width=THIRD)


def _now_and_max(title: str, description: str, now: str, best: str) -> Timeseries:
    """A PCIe link figure of each GPU now, against the most the link can do."""
    queries = [(f"{now}{N}", "GPU {{gpu}} now"), (f"{best}{N}", "GPU {{gpu}} max")]
    return Timeseries(title, description, queries, width=THIRD)


def _tx_rx(title: str, per_second: str, metric: str, unit: str) -> Timeseries:
    """What each IB port sent and received per second of one pair of port counters."""
    queries = [
        (f"rate(fleetwatch_ib_port_transmit_{metric}{N}{RATE})", f"{PORT} tx"),
        (f"rate(fleetwatch_ib_port_receive_{metric}{N}{RATE})", f"{PORT} rx"),
    ]
    description = f"{per_second} each port sent (tx) and received (rx)."
    return Timeseries(title, description, queries, unit=unit)


PANELS: Final = (
    Row("Node"),
    Stat(
        "State",
        "The node's state in fleetwatch's model.",
        [(f"fleetwatch_node_state{N} == 1", "{{state}}")],
        text_mode=cm.BigValueTextMode.NAME,
        colours=NODE_STATES,
    ),
    Stat(
        "Reachable",
        "The collector hears from the node.",
        [f"fleetwatch_node_up{N}"],
        steps=RED_BELOW_ONE,
        mappings=UP_DOWN,
    ),
    Stat(
        "Agent stream",
        "The node's agent has a stream open to this collector.",
        [f"fleetwatch_node_connected{N}"],
        steps=RED_BELOW_ONE,
        mappings=value_text({"0": ("disconnected", "red"), "1": ("connected", "green")}),
    ),
    Stat(
        "Last message",
        "Time since the collector last heard from the node.",
        [f"time() - fleetwatch_node_last_seen_timestamp_seconds{N}"],
        unit="s",
        steps=thresholds((None, "green"), (10, "orange"), (60, "red")),
    ),
    Table(
        "Agent and driver",
        "Versions of the node's agent and GPU driver.",
        [f"fleetwatch_node_info{N}"],
        hide=HIDE,
        width=QUARTER,
        height=4,
    ),
    Stat(
        "GPUs present",
        "GPUs answering NVML now, of those the node declared.",
        [
            (f"sum(fleetwatch_gpu_present{N})", "present"),
            (f"count(fleetwatch_gpu_present{N})", "declared"),
        ],
        text_mode=cm.BigValueTextMode.VALUE_AND_NAME,
        steps=BLUE,
    ),
    Stat(
        "Failures",
        "Job-interrupting failures of the node over the dashboard's range.",
        [f"sum({increase(f'fleetwatch_node_failures_total{N}', RANGE)})"],
        steps=RED_FROM_ONE,
    ),
    Stat(
        "Incidents firing",
        "Incidents firing on the node or its GPUs and ports now.",
        [f"count(fleetwatch_incident_firing{N}) or vector(0)"],
        steps=ORANGE_FROM_ONE,
    ),
    Table(
        "GPUs",
        "The node's GPUs: index, UUID, PCI address, model.",
        [f"fleetwatch_gpu_info{N}"],
        hide=HIDE,
    ),
    State(
        "GPU present",
        "Whether each GPU answers NVML (red: lost).",
        [(f"fleetwatch_gpu_present{N}", GPU)],
        mappings=PRESENT,
        steps=RED_BELOW_ONE,
    ),
    Timeseries(
        "Events by kind",
        "Events journaled for the node per rate interval (Xid, GPU lost, link down ...).",
        [(f"sum by (kind) ({increase(f'fleetwatch_node_events_total{N}', WINDOW)})", "{{kind}}")],
        bars=True,
        stack=True,
    ),
    Timeseries(
        "Failures by category",
        "Job-interrupting failures of the node per rate interval, by category.",
        [
            (
                f"sum by (category) ({increase(f'fleetwatch_node_failures_total{N}', WINDOW)})",
                "{{category}}",
            )
        ],
        bars=True,
        stack=True,
    ),
    Row("GPUs: load, power and clocks"),
    _per_gpu(
        "Temperature", "GPU core temperature.", f"fleetwatch_gpu_temperature_celsius{N}", "celsius"
    ),
    _per_gpu("Power", "Board power draw.", f"fleetwatch_gpu_power_watts{N}", "watt"),
    _per_gpu(
        "Utilization",
        "Share of time a kernel ran on the GPU.",
        f"fleetwatch_gpu_utilization_ratio{N}",
        "percentunit",
    ),
    _per_gpu(
        "Memory utilization",
        "Share of time device memory was read or written.",
        f"fleetwatch_gpu_memory_utilization_ratio{N}",
        "percentunit",
    ),
    _per_gpu(
        "SM clock", "Streaming-multiprocessor clock.", f"fleetwatch_gpu_sm_clock_hertz{N}", "hertz"
    ),
    State(
        "Clocks throttled",
        "GPU clocks held down, by reason (thermal, power, hardware slowdown).",
        [(f"fleetwatch_gpu_clocks_throttled{N}", "GPU {{gpu}} {{reason}}")],
        mappings=ON,
        width=THIRD,
    ),
    Row("GPUs: Xids, ECC and row remapping"),
    Timeseries(
        "Xid errors",
        "Xid errors per rate interval, by GPU, Xid and catalog class.",
        [
            (
                (
                    "sum by (gpu, xid, class) "
                    f"({increase(f'fleetwatch_gpu_xid_errors_total{N}', WINDOW)})"
                ),
                "GPU {{gpu}} Xid {{xid}} ({{class}})",
            )
        ],
        bars=True,
        width=FULL,
    ),
    _per_gpu(
        "ECC errors (lifetime)",
        "Single- and double-bit ECC errors over the GPU's life (aggregate counters).",
        f"fleetwatch_gpu_ecc_errors_total{N}",
        legend="GPU {{gpu}} {{type}}",
    ),
    _per_gpu(
        "ECC errors (since driver load)",
        "Single- and double-bit ECC errors since the driver loaded (volatile counters).",
        f"fleetwatch_gpu_ecc_volatile_errors_total{N}",
        legend="GPU {{gpu}} {{type}}",
    ),
    _per_gpu(
        "Remapped rows",
        "Memory rows remapped for correctable and uncorrectable errors.",
        f"fleetwatch_gpu_remapped_rows{N}",
        legend="GPU {{gpu}} {{type}}",
    ),
    State(
        "Row remapping",
        "A remap waiting for a GPU reset (pending) or a remap that failed (replace the GPU).",
        [
            (f"fleetwatch_gpu_remap_pending{N}", "GPU {{gpu}} pending"),
            (f"fleetwatch_gpu_remap_failure{N}", "GPU {{gpu}} failed"),
        ],
        mappings=ON,
        width=FULL,
    ),
    Row("GPUs: NVLink and PCIe"),
    _per_gpu(
        "NVLinks up",
        "NVLinks of each GPU that are up (of those it has).",
        f"fleetwatch_gpu_nvlinks{N} - fleetwatch_gpu_nvlinks_down{N}",
    ),
    _per_gpu(
        "NVLinks down", "NVLinks of each GPU reported down.", f"fleetwatch_gpu_nvlinks_down{N}"
    ),
    _per_gpu(
        "NVLink errors",
        "NVLink replay, recovery and CRC errors per second, summed over each GPU's links.",
        f"rate(fleetwatch_gpu_nvlink_errors_total{N}{RATE})",
        "cps",
        "GPU {{gpu}} {{type}}",
    ),
    _per_gpu(
        "PCIe replays",
        "PCIe replays per second (NVML's counter).",
        f"rate(fleetwatch_gpu_pcie_replays_total{N}{RATE})",
        "cps",
    ),
    _per_gpu(
        "PCIe AER errors",
        "AER error messages per second of each GPU's PCI function, by severity.",
        f"rate(fleetwatch_gpu_pcie_aer_errors_total{N}{RATE})",
        "cps",
        "GPU {{gpu}} {{severity}}",
    ),
    State(
        "PCIe link width degraded",
        "The link trained with fewer lanes than it has.",
        [(f"fleetwatch_gpu_pcie_link_width_degraded{N}", GPU)],
        mappings=ON,
        width=THIRD,
    ),
    _now_and_max(
        "PCIe link generation",
        "Generation the link trained at, and the highest both ends support.",
        "fleetwatch_gpu_pcie_link_generation",
        "fleetwatch_gpu_pcie_link_generation_max",
    ),
    _now_and_max(
        "PCIe link width",
        "Lanes in use, and the lanes the link can use: fewer is a degraded link.",
        "fleetwatch_gpu_pcie_link_width",
        "fleetwatch_gpu_pcie_link_width_max",
    ),
    _now_and_max(
        "PCIe link speed",
        "Transfers per second per lane now, and the most the link can do.",
        "fleetwatch_gpu_pcie_link_speed_transfers_per_second",
        "fleetwatch_gpu_pcie_link_speed_max_transfers_per_second",
    ),
    Row("InfiniBand ports"),
    State(
        "Port up",
        "Whether each IB port is ACTIVE.",
        [(f"fleetwatch_ib_port_up{N}", PORT)],
        mappings=UP_DOWN,
        steps=RED_BELOW_ONE,
    ),
    Table(
        "Port state",
        "Each port's logical and physical state as the HCA reports them.",
        [f"fleetwatch_ib_port_state{N}"],
        hide=HIDE,
    ),
    _tx_rx("Throughput", "Bytes per second", "bytes_total", "Bps"),
    _tx_rx("Packets", "Packets per second", "packets_total", "pps"),
    Timeseries(
        "Transmit wait",
        "Ticks per second each port waited to send (PortXmitWait): congestion.",
        [(f"rate(fleetwatch_ib_port_transmit_wait_total{N}{RATE})", PORT)],
        unit="cps",
    ),
    Timeseries(
        "Link downed",
        "Times each port's link went down, per rate interval (flaps).",
        [(f"increase(fleetwatch_ib_port_link_downed_total{N}{RATE})", PORT)],
        bars=True,
    ),
    Timeseries(
        "Port errors",
        "IB port error counters per second, by port and type.",
        [
            (
                f"sum by (device, port, type) (rate(fleetwatch_ib_port_errors_total{N}{RATE}))",
                f"{PORT} {{{{type}}}}",
            )
        ],
        unit="cps",
    ),
    Timeseries(
        "HCA hardware counters",
        "mlx5 hardware counters per second (out of buffer, retries, CNPs ...).",
        [
            (
                (
                    "sum by (device, port, counter) "
                    f"(rate(fleetwatch_ib_port_hw_events_total{N}{RATE}))"
                ),
                f"{PORT} {{{{counter}}}}",
            )
        ],
        unit="cps",
    ),
    Row("BMC"),
    Timeseries(
        "Fans",
        "Fans the node's BMC reports, those failed (critical, or at or below their critical "
        "speed), and the slowest one's RPM.",
        [
            (f"fleetwatch_bmc_fans{N}", "fans"),
            (f"fleetwatch_bmc_fans_failed{N}", "failed"),
            (f"fleetwatch_bmc_fan_rpm_min{N} / 1000", "slowest (kRPM)"),
        ],
        width=THIRD,
    ),
    Timeseries(
        "Power supplies",
        "Supplies working, needed and failed; redundancy lost is 1 while no spare is left.",
        [
            (f"fleetwatch_bmc_psus_working{N}", "working"),
            (f"fleetwatch_bmc_psus_needed{N}", "needed"),
            (f"fleetwatch_bmc_psus_failed{N}", "failed"),
            (f"fleetwatch_bmc_psu_redundancy_lost{N}", "redundancy lost"),
        ],
        width=THIRD,
    ),
    Timeseries(
        "Air and sensors",
        "The BMC's warmest inlet and outlet sensors and its warmest sensor of all.",
        [
            (f"fleetwatch_bmc_inlet_temperature_celsius{N}", "inlet"),
            (f"fleetwatch_bmc_outlet_temperature_celsius{N}", "outlet"),
            (f"fleetwatch_bmc_temperature_max_celsius{N}", "warmest"),
        ],
        unit="celsius",
        width=THIRD,
    ),
    Row("Agent"),
    Timeseries(
        "Outbox",
        "Events waiting in the agent's outbox for the collector's ack.",
        [(f"fleetwatch_agent_outbox_pending{N}", "pending")],
        width=THIRD,
    ),
    Timeseries(
        "Losses and resets",
        "Per rate interval: events the agent dropped, kernel-log records lost to "
        "overruns, IB counters that reset.",
        [
            (f"increase(fleetwatch_agent_events_dropped_total{N}{RATE})", "events dropped"),
            (f"increase(fleetwatch_agent_kmsg_overruns_total{N}{RATE})", "kmsg overruns"),
            (f"increase(fleetwatch_agent_ib_resets_total{N}{RATE})", "IB counter resets"),
        ],
        width=THIRD,
    ),
    Timeseries(
        "Source read errors",
        "Failed reads per rate interval, by source (nvml, sysfs, kmsg, udev, bmc).",
        [(f"increase(fleetwatch_agent_source_errors_total{N}{RATE})", "{{source}}")],
        width=THIRD,
    ),
)


def build() -> dm.Dashboard:
    """The node detail dashboard."""
    return new_dashboard(
        "fleetwatch: node detail",
        UID,
        "One node GPU by GPU and port by port, with its agent's health.",
        PANELS,
        tags=["node"],
        variables=[query_variable("node", "Node", "label_values(fleetwatch_node_up, node)")],
        annotations=[incidents_annotation("Incidents", N), actions_annotation("Actions", N)],
    )


__all__ = ["UID", "build"]
