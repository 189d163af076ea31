"""Fleet overview: is the fleet healthy, where are the errors, what is fleetwatch doing about it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models import common as cm

from dashboards.common import (
    FULL,
    HALF,
    NODE_STATES,
    QUARTER,
    actions_annotation,
    finish,
    fixed_colours,
    heatmap_panel,
    incidents_annotation,
    increase,
    instant,
    new_dashboard,
    q,
    stat_panel,
    table_panel,
    thresholds,
    timeseries_panel,
    value_text,
)

if TYPE_CHECKING:
    from grafana_foundation_sdk.models import dashboard as dm

UID: Final = "fleetwatch-fleet-overview"
RATE: Final = "[$__rate_interval]"
WINDOW: Final = "$__rate_interval"
# Per-node rates drawn as heatmaps: (title, description, expression, unit).
NODE_HEATMAPS: Final = (
    (
        "Xid errors by node",
        "Xid errors per rate interval on each node's GPUs, every catalog class.",
        f"sum by (node) ({increase('fleetwatch_gpu_xid_errors_total', WINDOW)})",
        "short",
    ),
    (
        "NVLink errors by node",
        "NVLink replay, recovery and CRC errors per second, summed over each node's GPUs.",
        f"sum by (node) (rate(fleetwatch_gpu_nvlink_errors_total{RATE}))",
        "cps",
    ),
    (
        "NVLinks down by node",
        "NVLinks reported down on each node.",
        "sum by (node) (fleetwatch_gpu_nvlinks_down)",
        "short",
    ),
    (
        "PCIe replays by node",
        "PCIe replays per second (NVML's counter) over each node's GPUs.",
        f"sum by (node) (rate(fleetwatch_gpu_pcie_replays_total{RATE}))",
        "cps",
    ),
    (
        "PCIe AER errors by node",
        "AER error messages per second (correctable, non-fatal, fatal) of each node's GPUs.",
        f"sum by (node) (rate(fleetwatch_gpu_pcie_aer_errors_total{RATE}))",
        "cps",
    ),
    (
        "InfiniBand port errors by node",
        "IB port error counters per second (symbol, receive, discards, integrity ...), all ports.",
        f"sum by (node) (rate(fleetwatch_ib_port_errors_total{RATE}))",
        "cps",
    ),
    (
        "InfiniBand congestion by node",
        "Ticks per second the node's IB ports waited to send (PortXmitWait): fabric congestion.",
        f"sum by (node) (rate(fleetwatch_ib_port_transmit_wait_total{RATE}))",
        "cps",
    ),
    (
        "InfiniBand links downed by node",
        "Times an IB link went down on the node (flaps), per rate interval.",
        f"sum by (node) (increase(fleetwatch_ib_port_link_downed_total{RATE}))",
        "short",
    ),
)


def _now(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    by_state = "sum by (state) (fleetwatch_node_state)"
    builder = builder.with_row(dashboard.Row("Fleet now"))
    builder = builder.with_panel(
        fixed_colours(
            stat_panel(
                "Nodes by state",
                "Nodes in each state fleetwatch knows: healthy, degraded (an incident is open), "
                "draining, drained, unreachable (silent for missed heartbeats).",
                [instant(by_state, "{{state}}")],
                width=HALF,
                text_mode=cm.BigValueTextMode.VALUE_AND_NAME,
            ),
            NODE_STATES,
        )
    )
    builder = builder.with_panel(
        stat_panel(
            "GPUs lost",
            "GPUs that stopped answering NVML (fell off the bus, Xid 79, removed).",
            [instant("count(fleetwatch_gpu_present == 0) or vector(0)")],
            steps=thresholds((None, "green"), (1, "red")),
        )
    )
    builder = builder.with_panel(
        stat_panel(
            "Incidents firing",
            "Incidents fleetwatch's rules have firing now.",
            [instant("count(fleetwatch_incident_firing) or vector(0)")],
            steps=thresholds((None, "green"), (1, "orange")),
        )
    )
    for title, description, expr, steps, mappings in (
        (
            "Nodes drained by fleetwatch",
            "Nodes fleetwatch drained and has not resumed.",
            "fleetwatch_drained_nodes",
            thresholds((None, "green"), (1, "blue")),
            None,
        ),
        (
            "Drains waiting",
            "Drains held back by the drain cap or the circuit breaker.",
            "fleetwatch_drains_waiting",
            thresholds((None, "green"), (1, "orange")),
            None,
        ),
        (
            "Drain breaker",
            "Open: too many drains failed or came too fast, and fleetwatch drains no more.",
            "fleetwatch_drain_breaker_open",
            thresholds((None, "green"), (1, "red")),
            value_text({"0": ("closed", "green"), "1": ("open", "red")}),
        ),
        (
            "Agents streaming",
            "Agent streams open to the collector now.",
            "sum(fleetwatch_collector_streams_active)",
            thresholds((None, "blue")),
            None,
        ),
    ):
        builder = builder.with_panel(
            stat_panel(
                title, description, [instant(expr)], steps=steps, mappings=mappings, width=QUARTER
            )
        )
    builder = builder.with_panel(
        fixed_colours(
            timeseries_panel(
                "Nodes by state over time",
                "How many nodes were in each state.",
                [q(by_state, "{{state}}")],
                stack=True,
            ),
            NODE_STATES,
        )
    )
    return builder.with_panel(
        table_panel(
            "Lost GPUs",
            "Each GPU that stopped answering NVML, with its UUID and PCI address.",
            [
                instant(
                    "fleetwatch_gpu_info and on (node, gpu) (fleetwatch_gpu_present == 0)",
                )
            ],
            hide=("Time", "Value", "__name__", "job", "instance"),
            no_value="no GPU lost",
        )
    )


def _errors(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Hardware errors"))
    builder = builder.with_panel(
        timeseries_panel(
            "Xid errors by catalog class",
            "Xid errors per rate interval across the fleet by their catalog class (memory, "
            "nvlink, bus, application ...). Applications' own Xids (13, 31, 43) are not "
            "hardware faults.",
            [
                q(
                    f"sum by (class) ({increase('fleetwatch_gpu_xid_errors_total', WINDOW)})",
                    "{{class}}",
                )
            ],
            bars=True,
            stack=True,
            width=FULL,
        )
    )
    for title, description, expr, unit in NODE_HEATMAPS:
        builder = builder.with_panel(
            heatmap_panel(title, description, q(expr, "{{node}}"), unit=unit)
        )
    return builder


def _incidents(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Incidents and actions"))
    builder = builder.with_panel(
        table_panel(
            "Active incidents",
            "Incidents firing now: rule, severity, scope and target.",
            [instant("fleetwatch_incident_firing")],
            hide=("Time", "Value", "__name__", "job", "instance"),
            no_value="no incident firing",
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Incidents open by severity",
            "Incidents pending (waiting out their rule's `for`) or firing.",
            [q("sum by (severity, phase) (fleetwatch_incidents_open)", "{{severity}} {{phase}}")],
            stack=True,
        )
    )
    builder = builder.with_panel(
        table_panel(
            "Recent actions",
            "The last time each action ended with each outcome, per node (newest first).",
            [instant("sort_desc(fleetwatch_action_last_timestamp_seconds * 1000)")],
            hide=("Time", "__name__", "job", "instance"),
            rename={"Value": "last"},
            unit="dateTimeAsIso",
            no_value="no action taken",
        )
    )
    return builder.with_panel(
        timeseries_panel(
            "Actions by outcome",
            "Drains, GPU resets, notifications ... and how they ended, per rate interval.",
            [
                q(
                    f"sum by (action, outcome) ({increase('fleetwatch_actions_total', WINDOW)})",
                    "{{action}} {{outcome}}",
                )
            ],
            bars=True,
            stack=True,
        )
    )


def _pipeline(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    builder = builder.with_row(dashboard.Row("Collector and agents"))
    builder = builder.with_panel(
        timeseries_panel(
            "Events journaled",
            "Events the collector journaled per second, and replays it dropped as duplicates.",
            [
                q(f"rate(fleetwatch_collector_events_journaled_total{RATE})", "journaled"),
                q(f"rate(fleetwatch_collector_events_duplicate_total{RATE})", "duplicate"),
            ],
            unit="cps",
            width=HALF,
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Messages rejected",
            "Agent messages the collector refused per rate interval, by reason (the stream is "
            "closed). No data: none was refused.",
            [
                q(
                    "sum by (reason) "
                    f"({increase('fleetwatch_collector_messages_rejected_total', WINDOW)})",
                    "{{reason}}",
                )
            ],
            bars=True,
            width=HALF,
        )
    )
    builder = builder.with_panel(
        timeseries_panel(
            "Agent outbox",
            "Events waiting in each agent's outbox for the collector's ack.",
            [q("fleetwatch_agent_outbox_pending", "{{node}}")],
            width=HALF,
        )
    )
    return builder.with_panel(
        timeseries_panel(
            "Agent losses",
            "Events agents dropped, kernel-log overruns and failed source reads per second.",
            [
                q(f"sum(rate(fleetwatch_agent_events_dropped_total{RATE}))", "events dropped"),
                q(f"sum(rate(fleetwatch_agent_kmsg_overruns_total{RATE}))", "kmsg overruns"),
                q(
                    f"sum by (source) (rate(fleetwatch_agent_source_errors_total{RATE}))",
                    "{{source}} read errors",
                ),
            ],
            unit="cps",
            width=HALF,
        )
    )


def build() -> dm.Dashboard:
    """The fleet overview dashboard."""
    builder = new_dashboard(
        "fleetwatch: fleet overview",
        UID,
        "Node states, lost GPUs, hardware errors by node, incidents and actions.",
        tags=["overview"],
    )
    builder = builder.annotation(incidents_annotation("Incidents")).annotation(
        actions_annotation("Actions")
    )
    for section in (_now, _errors, _incidents, _pipeline):
        builder = section(builder)
    return finish(builder)


__all__ = ["UID", "build"]
