"""Node detail: one node (the ``node`` variable), GPU by GPU and port by port.

Every per-GPU and per-port series the collector exports has a panel here, so whatever a rule
fired on can be seen next to what else the node did at that moment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models import common as cm

from dashboards.common import (
    FULL,
    HALF,
    NODE_STATES,
    QUARTER,
    THIRD,
    actions_annotation,
    finish,
    fixed_colours,
    incidents_annotation,
    increase,
    instant,
    new_dashboard,
    q,
    query_variable,
    stat_panel,
    state_panel,
    table_panel,
    thresholds,
    timeseries_panel,
    value_text,
)

if TYPE_CHECKING:
    from grafana_foundation_sdk.models import dashboard as dm

UID: Final = "fleetwatch-node-detail"
N: Final = '{node="$node"}'
RATE: Final = "[$__rate_interval]"
WINDOW: Final = "$__rate_interval"
GPU: Final = "GPU {{gpu}}"
PORT: Final = "{{device}}/{{port}}"
HIDE: Final = ("Time", "Value", "__name__", "job", "instance", "node")
# Per-GPU gauges drawn one line per GPU: (title, description, metric, unit).
GPU_GAUGES: Final = (
    ("Temperature", "GPU core temperature.", "fleetwatch_gpu_temperature_celsius", "celsius"),
    ("Power", "Board power draw.", "fleetwatch_gpu_power_watts", "watt"),
    (
        "Utilization",
        "Share of time a kernel ran on the GPU.",
        "fleetwatch_gpu_utilization_ratio",
        "percentunit",
    ),
    (
        "Memory utilization",
        "Share of time device memory was read or written.",
        "fleetwatch_gpu_memory_utilization_ratio",
        "percentunit",
    ),
    ("SM clock", "Streaming-multiprocessor clock.", "fleetwatch_gpu_sm_clock_hertz", "hertz"),
)
# PCIe link figures, now against what the link can do: (title, description, now, max, unit).
PCIE_LINK: Final = (
    (
        "PCIe link generation",
        "Generation the link trained at, and the highest both ends support.",
        "fleetwatch_gpu_pcie_link_generation",
        "fleetwatch_gpu_pcie_link_generation_max",
        "short",
    ),
    (
        "PCIe link width",
        "Lanes in use, and the lanes the link can use: fewer is a degraded link.",
        "fleetwatch_gpu_pcie_link_width",
        "fleetwatch_gpu_pcie_link_width_max",
        "short",
    ),
    (
        "PCIe link speed",
        "Transfers per second per lane now, and the most the link can do.",
        "fleetwatch_gpu_pcie_link_speed_transfers_per_second",
        "fleetwatch_gpu_pcie_link_speed_max_transfers_per_second",
        "short",
    ),
)
PRESENT: Final = value_text({"0": ("lost", "red"), "1": ("present", "green")})
UP_DOWN: Final = value_text({"0": ("down", "red"), "1": ("up", "green")})
ON: Final = value_text({"0": ("no", "green"), "1": ("yes", "red")})


def _node(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Node"))
    builder = builder.with_panel(
        fixed_colours(
            stat_panel(
                "State",
                "The node's state in fleetwatch's model.",
                [instant(f"fleetwatch_node_state{N} == 1", "{{state}}")],
                text_mode=cm.BigValueTextMode.NAME,
            ),
            NODE_STATES,
        )
    )
    for title, description, expr, mappings in (
        ("Reachable", "The collector hears from the node.", f"fleetwatch_node_up{N}", UP_DOWN),
        (
            "Agent stream",
            "The node's agent has a stream open to this collector.",
            f"fleetwatch_node_connected{N}",
            value_text({"0": ("disconnected", "red"), "1": ("connected", "green")}),
        ),
    ):
        builder = builder.with_panel(
            stat_panel(
                title,
                description,
                [instant(expr)],
                steps=thresholds((None, "red"), (1, "green")),
                mappings=mappings,
            )
        )
    builder = builder.with_panel(
        stat_panel(
            "Last message",
            "Time since the collector last heard from the node.",
            [instant(f"time() - fleetwatch_node_last_seen_timestamp_seconds{N}")],
            unit="s",
            steps=thresholds((None, "green"), (10, "orange"), (60, "red")),
        )
    )
    builder = builder.with_panel(
        table_panel(
            "Agent and driver",
            "Versions of the node's agent and GPU driver.",
            [instant(f"fleetwatch_node_info{N}")],
            hide=HIDE,
            width=QUARTER,
        ).height(4)
    )
    builder = builder.with_panel(
        stat_panel(
            "GPUs present",
            "GPUs answering NVML now, of those the node declared.",
            [
                instant(f"sum(fleetwatch_gpu_present{N})", "present"),
                instant(f"count(fleetwatch_gpu_present{N})", "declared"),
            ],
            text_mode=cm.BigValueTextMode.VALUE_AND_NAME,
            steps=thresholds((None, "blue")),
        )
    )
    builder = builder.with_panel(
        stat_panel(
            "Failures",
            "Job-interrupting failures of the node over the dashboard's range.",
            [instant(f"sum({increase(f'fleetwatch_node_failures_total{N}', '$__range')})")],
            steps=thresholds((None, "green"), (1, "red")),
        )
    )
    builder = builder.with_panel(
        stat_panel(
            "Incidents firing",
            "Incidents firing on the node or its GPUs and ports now.",
            [instant(f"count(fleetwatch_incident_firing{N}) or vector(0)")],
            steps=thresholds((None, "green"), (1, "orange")),
        )
    )
    builder = builder.with_panel(
        table_panel(
            "GPUs",
            "The node's GPUs: index, UUID, PCI address, model.",
            [instant(f"fleetwatch_gpu_info{N}")],
            hide=HIDE,
            width=HALF,
        )
    )
    builder = builder.with_panel(
        state_panel(
            "GPU present",
            "Whether each GPU answers NVML (red: lost).",
            [q(f"fleetwatch_gpu_present{N}", GPU)],
            mappings=PRESENT,
            steps=thresholds((None, "red"), (1, "green")),
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Events by kind",
            "Events journaled for the node per rate interval (Xid, GPU lost, link down ...).",
            [
                q(
                    f"sum by (kind) ({increase(f'fleetwatch_node_events_total{N}', WINDOW)})",
                    "{{kind}}",
                )
            ],
            bars=True,
            stack=True,
        )
    )
    return builder.with_panel(
        timeseries_panel(
            "Failures by category",
            "Job-interrupting failures of the node per rate interval, by category.",
            [
                q(
                    f"sum by (category) ({increase(f'fleetwatch_node_failures_total{N}', WINDOW)})",
                    "{{category}}",
                )
            ],
            bars=True,
            stack=True,
        )
    )


def _gpu_load(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("GPUs: load, power and clocks"))
    for title, description, metric, unit in GPU_GAUGES:
        builder = builder.with_panel(
            timeseries_panel(title, description, [q(f"{metric}{N}", GPU)], unit=unit, width=THIRD)
        )
    return builder.with_panel(
        state_panel(
            "Clocks throttled",
            "GPU clocks held down, by reason (thermal, power, hardware slowdown).",
            [q(f"fleetwatch_gpu_clocks_throttled{N}", "GPU {{gpu}} {{reason}}")],
            mappings=ON,
            width=THIRD,
        )
    )


def _gpu_errors(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("GPUs: Xids, ECC and row remapping"))
    builder = builder.with_panel(
        timeseries_panel(
            "Xid errors",
            "Xid errors per rate interval, by GPU, Xid and catalog class.",
            [
                q(
                    "sum by (gpu, xid, class) "
                    f"({increase(f'fleetwatch_gpu_xid_errors_total{N}', WINDOW)})",
                    "GPU {{gpu}} Xid {{xid}} ({{class}})",
                )
            ],
            bars=True,
            width=FULL,
        )
    )
    for title, description, metric in (
        (
            "ECC errors (lifetime)",
            "Single- and double-bit ECC errors over the GPU's life (aggregate counters).",
            "fleetwatch_gpu_ecc_errors_total",
        ),
        (
            "ECC errors (since driver load)",
            "Single- and double-bit ECC errors since the driver loaded (volatile counters).",
            "fleetwatch_gpu_ecc_volatile_errors_total",
        ),
        (
            "Remapped rows",
            "Memory rows remapped for correctable and uncorrectable errors.",
            "fleetwatch_gpu_remapped_rows",
        ),
    ):
        builder = builder.with_panel(
            timeseries_panel(
                title, description, [q(f"{metric}{N}", "GPU {{gpu}} {{type}}")], width=THIRD
            )
        )
    return builder.with_panel(
        state_panel(
            "Row remapping",
            "A remap waiting for a GPU reset (pending) or a remap that failed (replace the GPU).",
            [
                q(f"fleetwatch_gpu_remap_pending{N}", "GPU {{gpu}} pending"),
                q(f"fleetwatch_gpu_remap_failure{N}", "GPU {{gpu}} failed"),
            ],
            mappings=ON,
            width=FULL,
        )
    )


def _gpu_links(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("GPUs: NVLink and PCIe"))
    builder = builder.with_panel(
        timeseries_panel(
            "NVLinks up",
            "NVLinks of each GPU that are up (of those it has).",
            [q(f"fleetwatch_gpu_nvlinks{N} - fleetwatch_gpu_nvlinks_down{N}", GPU)],
            width=THIRD,
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "NVLinks down",
            "NVLinks of each GPU reported down.",
            [q(f"fleetwatch_gpu_nvlinks_down{N}", GPU)],
            width=THIRD,
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "NVLink errors",
            "NVLink replay, recovery and CRC errors per second, summed over each GPU's links.",
            [q(f"rate(fleetwatch_gpu_nvlink_errors_total{N}{RATE})", "GPU {{gpu}} {{type}}")],
            unit="cps",
            width=THIRD,
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "PCIe replays",
            "PCIe replays per second (NVML's counter).",
            [q(f"rate(fleetwatch_gpu_pcie_replays_total{N}{RATE})", GPU)],
            unit="cps",
            width=THIRD,
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "PCIe AER errors",
            "AER error messages per second of each GPU's PCI function, by severity.",
            [q(f"rate(fleetwatch_gpu_pcie_aer_errors_total{N}{RATE})", "GPU {{gpu}} {{severity}}")],
            unit="cps",
            width=THIRD,
        )
    )
    builder = builder.with_panel(
        state_panel(
            "PCIe link width degraded",
            "The link trained with fewer lanes than it has.",
            [q(f"fleetwatch_gpu_pcie_link_width_degraded{N}", GPU)],
            mappings=ON,
            width=THIRD,
        )
    )
    for title, description, now, best, unit in PCIE_LINK:
        builder = builder.with_panel(
            timeseries_panel(
                title,
                description,
                [q(f"{now}{N}", "GPU {{gpu}} now"), q(f"{best}{N}", "GPU {{gpu}} max")],
                unit=unit,
                width=THIRD,
            )
        )
    return builder


def _ports(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("InfiniBand ports"))
    builder = builder.with_panel(
        state_panel(
            "Port up",
            "Whether each IB port is ACTIVE.",
            [q(f"fleetwatch_ib_port_up{N}", PORT)],
            mappings=UP_DOWN,
            steps=thresholds((None, "red"), (1, "green")),
        )
    )
    builder = builder.with_panel(
        table_panel(
            "Port state",
            "Each port's logical and physical state as the HCA reports them.",
            [instant(f"fleetwatch_ib_port_state{N}")],
            hide=HIDE,
        )
    )
    for title, description, metric, unit in (
        ("Throughput", "Bytes per second", "bytes_total", "Bps"),
        ("Packets", "Packets per second", "packets_total", "pps"),
    ):
        builder = builder.with_panel(
            timeseries_panel(
                title,
                f"{description} each port sent (tx) and received (rx).",
                [
                    q(f"rate(fleetwatch_ib_port_transmit_{metric}{N}{RATE})", f"{PORT} tx"),
                    q(f"rate(fleetwatch_ib_port_receive_{metric}{N}{RATE})", f"{PORT} rx"),
                ],
                unit=unit,
            )
        )
    builder = builder.with_panel(
        timeseries_panel(
            "Transmit wait",
            "Ticks per second each port waited to send (PortXmitWait): congestion.",
            [q(f"rate(fleetwatch_ib_port_transmit_wait_total{N}{RATE})", PORT)],
            unit="cps",
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Link downed",
            "Times each port's link went down, per rate interval (flaps).",
            [q(f"increase(fleetwatch_ib_port_link_downed_total{N}{RATE})", PORT)],
            bars=True,
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Port errors",
            "IB port error counters per second, by port and type.",
            [
                q(
                    f"sum by (device, port, type) (rate(fleetwatch_ib_port_errors_total{N}{RATE}))",
                    f"{PORT} {{{{type}}}}",
                )
            ],
            unit="cps",
        )
    )
    return builder.with_panel(
        timeseries_panel(
            "HCA hardware counters",
            "mlx5 hardware counters per second (out of buffer, retries, CNPs ...).",
            [
                q(
                    "sum by (device, port, counter) "
                    f"(rate(fleetwatch_ib_port_hw_events_total{N}{RATE}))",
                    f"{PORT} {{{{counter}}}}",
                )
            ],
            unit="cps",
        )
    )


def _agent(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Agent"))
    builder = builder.with_panel(
        timeseries_panel(
            "Outbox",
            "Events waiting in the agent's outbox for the collector's ack.",
            [q(f"fleetwatch_agent_outbox_pending{N}", "pending")],
            width=THIRD,
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Losses and resets",
            "Per rate interval: events the agent dropped, kernel-log records lost to overruns, "
            "IB counters that reset.",
            [
                q(f"increase(fleetwatch_agent_events_dropped_total{N}{RATE})", "events dropped"),
                q(f"increase(fleetwatch_agent_kmsg_overruns_total{N}{RATE})", "kmsg overruns"),
                q(
                    f"increase(fleetwatch_agent_ib_resets_total{N}{RATE})",
                    "IB counter resets",
                ),
            ],
            width=THIRD,
        )
    )
    return builder.with_panel(
        timeseries_panel(
            "Source read errors",
            "Failed reads per rate interval, by source (nvml, sysfs, kmsg, udev).",
            [q(f"increase(fleetwatch_agent_source_errors_total{N}{RATE})", "{{source}}")],
            width=THIRD,
        )
    )


def build() -> dm.Dashboard:
    """The node detail dashboard."""
    builder = new_dashboard(
        "fleetwatch: node detail",
        UID,
        "One node GPU by GPU and port by port, with its agent's health.",
        tags=["node"],
    )
    builder = builder.with_variable(
        query_variable("node", "Node", "label_values(fleetwatch_node_up, node)")
    )
    builder = builder.annotation(incidents_annotation("Incidents", N)).annotation(
        actions_annotation("Actions", N)
    )
    for section in (_node, _gpu_load, _gpu_errors, _gpu_links, _ports, _agent):
        builder = section(builder)
    return finish(builder)


__all__ = ["UID", "build"]
