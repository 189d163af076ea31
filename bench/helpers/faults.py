"""The faults the benchmarks inject, one per node, and how the webhooks that answer them are timed.

A fault's latency is the arrival of the first webhook naming its node minus the moment it was
injected; :func:`add_stages` splits it into stages from the collector's journal.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.sim.scenario import FaultKind
from bench.helpers.figures import figure

if TYPE_CHECKING:
    from cli.dev.webhook_receiver import Delivery, WebhookReceiver

GPUS_PER_NODE = 8

# name -> (simulator fault, its parameters besides the GPU, what the built-in rules do)
FAULTS: dict[str, tuple[FaultKind, dict[str, int], str]] = {
    "xid79_gpu_lost": (
        FaultKind.GPU_LOST,
        {},
        "gpu_lost and xid_needs_reboot_or_rma: drain_node, notify",
    ),
    "xid61_pmu_breakpoint": (
        FaultKind.XID,
        {"xid": 61},
        "xid_needs_reboot_or_rma: drain_node, notify",
    ),
    "xid119_gsp_timeout": (
        FaultKind.XID,
        {"xid": 119},
        "xid_needs_gpu_reset: reset_gpu (through the agent), notify beside it",
    ),
    "xid120_gsp_error": (
        FaultKind.XID,
        {"xid": 120},
        "xid_needs_gpu_reset: reset_gpu (through the agent), notify beside it",
    ),
    "xid13_application": (FaultKind.XID, {"xid": 13}, "xid_application_error: notify"),
    "remap_failure": (
        FaultKind.REMAP_FAILURE,
        {},
        "row_remap_failure: drain_node, notify (and Xid 64: reset_gpu, notify)",
    ),
}


@dataclass(slots=True)
class PlannedFault:
    """One fault to inject, and what became of it."""

    id: int
    round: int
    node: str
    kind: str
    gpu: int
    injected_at: float | None = None  # the fleet process's time.time() just before applying it
    sent_at: float | None = None  # when this process asked for it
    arrival: Delivery | None = None  # the first webhook naming the node
    stages: dict[str, float] = field(default_factory=dict)  # ms, see STAGES

    def record(self) -> dict[str, Any]:
        """This fault as one JSON object, for --faults-out."""
        latency = latency_ms(self)
        return {
            "id": self.id,
            "round": self.round,
            "node": self.node,
            "kind": self.kind,
            "gpu": self.gpu,
            "injected_at": self.injected_at,
            "latency_ms": None if math.isinf(latency) else round(latency, 1),
            "webhook": None
            if self.arrival is None
            else f"{self.arrival.body.get('kind')} ({rule_of(self.arrival)})",
            "stages_ms": self.stages,
        }


def plan(names: list[str], faults: int, rounds: int, seed: int) -> list[PlannedFault]:
    rng = random.Random(seed)
    nodes = rng.sample(names, faults * rounds)
    kinds = list(FAULTS)
    out = []
    for r in range(rounds):
        order = [kinds[i % len(kinds)] for i in range(faults)]
        rng.shuffle(order)
        for i, kind in enumerate(order):
            fid = r * faults + i
            out.append(PlannedFault(fid, r + 1, nodes[fid], kind, rng.randrange(GPUS_PER_NODE)))
    return out


def latency_ms(f: PlannedFault) -> float:
    """Injection to first webhook; infinity when none came."""
    if f.arrival is None or f.injected_at is None:
        return math.inf
    return (f.arrival.received_at - f.injected_at) * 1000


def rule_of(d: Delivery) -> str:
    """The rule behind a webhook: named in a notification, first in a drain's reason."""
    payload = d.body.get("payload", {})
    if "rule" in payload:
        return str(payload["rule"])
    reason = str(payload.get("reason", ""))  # "fleetwatch: <rule>: <evidence>"
    return reason.removeprefix("fleetwatch:").strip().split(":", 1)[0] or "?"


def first_arrivals(receiver: WebhookReceiver, start: int = 0) -> dict[str, Delivery]:
    """The first webhook naming each node, among the receiver's deliveries from ``start`` on."""
    first: dict[str, Delivery] = {}
    for d in receiver.deliveries()[start:]:
        node = str(d.body.get("payload", {}).get("node", ""))
        if node and (node not in first or d.received_at < first[node].received_at):
            first[node] = d
    return first


STAGES = (
    "agent_poll_wait",  # injected -> the agent read it (the event's time)
    "agent_to_collector",  # -> the collector received the event
    "collector_to_incident_fired",  # -> the node's first incident fired (rules)
    "incident_fired_to_webhook_sent",  # -> the first webhook's first attempt (journal, actions)
    "webhook_http",  # -> the receiver had the request
)


def add_stages(
    faults: list[PlannedFault], events: list[dict[str, Any]], incidents: list[dict[str, Any]]
) -> None:
    """Split each fault's latency into stages, from the journal: where the time goes."""
    first_event: dict[str, dict[str, Any]] = {}
    for e in events:
        if e["node"] not in first_event and e.get("seq") is not None:
            first_event[e["node"]] = e
    fired: dict[str, int] = {}
    for inc in incidents:
        if inc.get("fired_ms") is not None:
            node = inc["node"]
            fired[node] = min(fired.get(node, inc["fired_ms"]), inc["fired_ms"])
    for f in faults:
        event = first_event.get(f.node)
        if f.arrival is None or f.injected_at is None or event is None or f.node not in fired:
            continue
        sent_ms = float(f.arrival.body.get("sent_at", 0.0)) * 1000
        marks = (
            f.injected_at * 1000,
            event["time_ms"],
            event["received_ms"],
            fired[f.node],
            sent_ms,
            f.arrival.received_at * 1000,
        )
        f.stages = {name: round(float(marks[i + 1] - marks[i]), 1) for i, name in enumerate(STAGES)}


def stage_figures(faults: list[PlannedFault], share: float) -> dict[str, float | None]:
    counted = [f.stages for f in faults if f.stages]
    return {name: figure([s[name] for s in counted], share) for name in STAGES}


def summarise(faults: list[PlannedFault], timeout_s: float) -> dict[str, Any]:
    values = [latency_ms(f) for f in faults]
    missing = sum(math.isinf(v) for v in values)
    out: dict[str, Any] = {
        "faults": len(faults),
        "p50_ms": figure(values, 0.5),
        "p99_ms": figure(values, 0.99),
        "max_ms": figure(values, None),
        "faults_without_webhook": missing,
    }
    nulls = [k for k in ("p50_ms", "p99_ms", "max_ms") if out[k] is None]
    if nulls:
        out["why"] = (
            f"{missing} of {len(faults)} faults got no webhook within {timeout_s:g} s; "
            f"{', '.join(nulls)} would be at least {timeout_s * 1000:.0f} ms"
        )
    return out
