"""Fleet overview: is the fleet healthy, where are the errors, what is fleetwatch doing about it.

A new panel goes into its place in ``PANELS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from grafana_foundation_sdk.models import common as cm

from dashboards.common import (
    BLUE,
    FULL,
    HALF,
    NODE_STATES,
    OPEN_CLOSED,
    ORANGE_FROM_ONE,
    RATE,
    RED_FROM_ONE,
    SCRAPE,
    WINDOW,
    actions_annotation,
    incidents_annotation,
    increase,
    new_dashboard,
    thresholds,
)
from dashboards.panels import Heatmap, Row, Stat, Table, Timeseries

if TYPE_CHECKING:
    from grafana_foundation_sdk.models import dashboard as dm

UID: Final = "fleetwatch-fleet-overview"
BY_STATE: Final = "sum by (state) (fleetwatch_node_state)"


def _by_node(title: str, description: str, expr: str, unit: str = "short") -> Heatmap:
    """A heatmap of a per-node series: a row per node, so a node whose errors climb stands out."""
    return Heatmap(title, description, [(expr, "{{node}}")], unit=unit)


PANELS: Final = (
    Row("Fleet now"),
    Stat(
        "Nodes by state",
        "Nodes in each state fleetwatch knows: healthy, degraded (an incident is open), "
        "draining, drained, unreachable (silent for missed heartbeats).",
        [(BY_STATE, "{{state}}")],
        width=HALF,
        text_mode=cm.BigValueTextMode.VALUE_AND_NAME,
        colours=NODE_STATES,
    ),
    Stat(
        "GPUs lost",
        "GPUs that stopped answering NVML (fell off the bus, Xid 79, removed).",
        ["count(fleetwatch_gpu_present == 0) or vector(0)"],
        steps=RED_FROM_ONE,
    ),
    Stat(
        "Incidents firing",
        "Incidents fleetwatch's rules have firing now.",
        ["count(fleetwatch_incident_firing) or vector(0)"],
        steps=ORANGE_FROM_ONE,
    ),
    Stat(
        "Nodes drained by fleetwatch",
        "Nodes fleetwatch drained and has not resumed.",
        ["fleetwatch_drained_nodes"],
        steps=thresholds((None, "green"), (1, "blue")),
    ),
    Stat(
        "Drains waiting",
        "Drains held back by the drain cap or the circuit breaker.",
        ["fleetwatch_drains_waiting"],
        steps=ORANGE_FROM_ONE,
    ),
    Stat(
        "Drain breaker",
        "Open: too many drains failed or came too fast, and fleetwatch drains no more.",
        ["fleetwatch_drain_breaker_open"],
        steps=RED_FROM_ONE,
        mappings=OPEN_CLOSED,
    ),
    Stat(
        "Agents streaming",
        "Agent streams open to the collector now.",
        ["sum(fleetwatch_collector_streams_active)"],
        steps=BLUE,
    ),
    Timeseries(
        "Nodes by state over time",
        "How many nodes were in each state.",
        [(BY_STATE, "{{state}}")],
        stack=True,
        colours=NODE_STATES,
    ),
    Table(
        "Lost GPUs",
        "Each GPU that stopped answering NVML, with its UUID and PCI address.",
        ["fleetwatch_gpu_info and on (node, gpu) (fleetwatch_gpu_present == 0)"],
        hide=(*SCRAPE, "Value"),
        no_value="no GPU lost",
    ),
    Row("Hardware errors"),
    Timeseries(
        "Xid errors by catalog class",
        "Xid errors per rate interval across the fleet by their catalog class (memory, "
        "nvlink, bus, application ...). Applications' own Xids (13, 31, 43) are not "
        "hardware faults.",
        [(f"sum by (class) ({increase('fleetwatch_gpu_xid_errors_total', WINDOW)})", "{{class}}")],
        bars=True,
        stack=True,
        width=FULL,
    ),
    _by_node(
        "Xid errors by node",
        "Xid errors per rate interval on each node's GPUs, every catalog class.",
        f"sum by (node) ({increase('fleetwatch_gpu_xid_errors_total', WINDOW)})",
    ),
    _by_node(
        "NVLink errors by node",
        "NVLink replay, recovery and CRC errors per second, summed over each node's GPUs.",
        f"sum by (node) (rate(fleetwatch_gpu_nvlink_errors_total{RATE}))",
        "cps",
    ),
    _by_node(
        "NVLinks down by node",
        "NVLinks reported down on each node.",
        "sum by (node) (fleetwatch_gpu_nvlinks_down)",
    ),
    _by_node(
        "PCIe replays by node",
        "PCIe replays per second (NVML's counter) over each node's GPUs.",
        f"sum by (node) (rate(fleetwatch_gpu_pcie_replays_total{RATE}))",
        "cps",
    ),
    _by_node(
        "PCIe AER errors by node",
        "AER error messages per second (correctable, non-fatal, fatal) of each node's GPUs.",
        f"sum by (node) (rate(fleetwatch_gpu_pcie_aer_errors_total{RATE}))",
        "cps",
    ),
    _by_node(
        "InfiniBand port errors by node",
        "IB port error counters per second (symbol, receive, discards, integrity ...), all ports.",
        f"sum by (node) (rate(fleetwatch_ib_port_errors_total{RATE}))",
        "cps",
    ),
    _by_node(
        "InfiniBand congestion by node",
        "Ticks per second the node's IB ports waited to send (PortXmitWait): fabric congestion.",
        f"sum by (node) (rate(fleetwatch_ib_port_transmit_wait_total{RATE}))",
        "cps",
    ),
    _by_node(
        "InfiniBand links downed by node",
        "Times an IB link went down on the node (flaps), per rate interval.",
        f"sum by (node) (increase(fleetwatch_ib_port_link_downed_total{RATE}))",
    ),
    Row("Incidents and actions"),
    Table(
        "Active incidents",
        "Incidents firing now: rule, severity, scope and target.",
        ["fleetwatch_incident_firing"],
        hide=(*SCRAPE, "Value"),
        no_value="no incident firing",
    ),
    Timeseries(
        "Incidents open by severity",
        "Incidents pending (waiting out their rule's `for`) or firing.",
        [("sum by (severity, phase) (fleetwatch_incidents_open)", "{{severity}} {{phase}}")],
        stack=True,
    ),
    Table(
        "Recent actions",
        "The last time each action ended with each outcome, per node (newest first).",
        ["sort_desc(fleetwatch_action_last_timestamp_seconds * 1000)"],
        hide=SCRAPE,
        rename={"Value": "last"},
        unit="dateTimeAsIso",
        no_value="no action taken",
    ),
    Timeseries(
        "Actions by outcome",
        "Drains, GPU resets, notifications ... and how they ended, per rate interval.",
        [
            (
                f"sum by (action, outcome) ({increase('fleetwatch_actions_total', WINDOW)})",
                "{{action}} {{outcome}}",
            )
        ],
        bars=True,
        stack=True,
    ),
    Row("Collector and agents"),
    Timeseries(
        "Events journaled",
        "Events the collector journaled per second, and replays it dropped as duplicates.",
        [
            (f"rate(fleetwatch_collector_events_journaled_total{RATE})", "journaled"),
            (f"rate(fleetwatch_collector_events_duplicate_total{RATE})", "duplicate"),
        ],
        unit="cps",
    ),
    Timeseries(
        "Messages rejected",
        "Agent messages the collector refused per rate interval, by reason (the stream is "
        "closed). No data: none was refused.",
        [
            (
                (
                    "sum by (reason) "
                    f"({increase('fleetwatch_collector_messages_rejected_total', WINDOW)})"
                ),
                "{{reason}}",
            )
        ],
        bars=True,
    ),
    Timeseries(
        "Agent outbox",
        "Events waiting in each agent's outbox for the collector's ack.",
        [("fleetwatch_agent_outbox_pending", "{{node}}")],
    ),
    Timeseries(
        "Agent losses",
        "Events agents dropped, kernel-log overruns and failed source reads per second.",
        [
            (f"sum(rate(fleetwatch_agent_events_dropped_total{RATE}))", "events dropped"),
            (f"sum(rate(fleetwatch_agent_kmsg_overruns_total{RATE}))", "kmsg overruns"),
            (
                f"sum by (source) (rate(fleetwatch_agent_source_errors_total{RATE}))",
                "{{source}} read errors",
            ),
        ],
        unit="cps",
    ),
)


def build() -> dm.Dashboard:
    """The fleet overview dashboard."""
    return new_dashboard(
        "fleetwatch: fleet overview",
        UID,
        "Node states, lost GPUs, hardware errors by node, incidents and actions.",
        PANELS,
        tags=["overview"],
        annotations=[incidents_annotation("Incidents"), actions_annotation("Actions")],
    )


__all__ = ["UID", "build"]
