"""Why a job is slow: hardware evidence on its nodes, ranked suspects, fabric or node.

Evidence comes from the fleet model (state now: throttled clocks, a narrow PCIe link, a link
down) and from the rule windows' history (what grew or happened since a moment: Xids, ECC,
NVLink and IB error counters). It falls in two kinds:

* **compute**: the GPU itself runs slower (throttling, low clocks, Xids, ECC, a lost GPU). It
  explains a slowdown only where the node's ranks actually compute slower than the job's median;
  a throttled GPU whose rank keeps pace is not what slows the job.
* **communication**: a path between GPUs degrades (NVLink down or erring, PCIe downgraded, IB
  port down or erring, IB congestion). Compute times cannot show it, so it counts on its own.
  But congestion and IB error counters spread over ``fabric_share`` or more of the job's nodes
  (and ``fabric_min_nodes`` at least) are the fabric's doing: then no node is blamed for them.

Error counters are evidence only past a threshold: a healthy link logs a few symbol errors or
replays now and then, and a handful of them must not put a healthy node on a drop's suspect
list (``evidence_ib_errors`` on one IB port, ``evidence_nvlink_errors`` on one NVLink, over the
evidence window).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from collector.model.target_keys import gpu_key, link_key, port_key

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from collector.jobs.config import JobsConfig
    from collector.jobs.state import JobState
    from collector.model.history import History
    from collector.model.state import GpuState, NodeState, PortState

# clocks_event_reasons bits that slow a busy GPU: HW slowdown, SW/HW thermal, HW power brake.
SLOWDOWN_REASONS: Final = {
    0x8: "hw slowdown",
    0x20: "sw thermal",
    0x40: "hw thermal",
    0x80: "power brake",
}
LOW_CLOCK_SHARE: Final = 0.9
NVML_HUNG_SIGNAL: Final = "agent_nvml_hung"  # the agent's NVML calls block (a wedged driver)
APPLICATION_CLASS: Final = "application"  # the Xid catalog's class of a program's own errors
NVLINK_ERROR_SIGNALS: Final = ("nvlink_replay_errors", "nvlink_crc_errors")
IB_ERROR_SIGNALS: Final = ("ib_symbol_error", "ib_port_rcv_errors")  # what a sick fabric shows
CONGESTION_SIGNAL: Final = "ib_port_xmit_wait_per_second"


@dataclass(frozen=True, slots=True)
class Window:
    """The history to read evidence from, and the span of it that counts."""

    history: History
    since: float  # monotonic
    now: float


@dataclass(slots=True)
class NodeEvidence:
    """What looks wrong on one node of a job."""

    node: str
    compute: list[str] = field(default_factory=list)
    communication: list[str] = field(default_factory=list)
    # Congestion and IB error counters: what a degraded fabric shows on many nodes at once
    # (a port that went down is its own cable's or HCA's, and stays in ``communication``).
    fabric: list[str] = field(default_factory=list)
    # Xids the catalog classes as the application's own (13, 31, 43, ...): told, never taken
    # for a hardware fault (the program, not the GPU, is at fault).
    application: list[str] = field(default_factory=list)
    # Of the findings, the faults that stop a collective rather than slow it: a GPU lost, an Xid,
    # uncorrectable ECC, an NVLink or IB port down (a hang's evidence; throttling is not).
    hard: list[str] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        """Every hardware finding, compute first."""
        return self.compute + self.communication + self.fabric


@dataclass(frozen=True, slots=True)
class Suspect:
    """A node that may be what slows a job, with why."""

    node: str
    score: float
    evidence: tuple[str, ...]
    straggling_ranks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The cause of a job's slowdown as far as the hardware tells."""

    cause: str  # "hardware", "fabric" or "none"
    suspects: tuple[Suspect, ...] = ()
    fabric_nodes: tuple[str, ...] = ()
    nodes: int = 0

    def summary(self) -> str:
        """One line for an incident's evidence."""
        if self.cause == "fabric":
            return (
                f"fabric: congestion or IB errors on {len(self.fabric_nodes)} of {self.nodes} "
                f"nodes ({', '.join(self.fabric_nodes[:5])}); no node to blame"
            )
        if not self.suspects:
            return "no hardware cause found on the job's nodes"
        parts = [f"{s.node} ({'; '.join(s.evidence[:3])})" for s in self.suspects[:3]]
        return "suspects: " + ", ".join(parts)


def _xid_evidence(
    name: str, xids: list[int], xid_class: Callable[[int], str] | None
) -> tuple[list[str], list[str]]:
    """The GPU's Xids as (hardware, application) lines: the catalog's application class apart."""
    own = [x for x in xids if xid_class is not None and xid_class(x) == APPLICATION_CLASS]
    hardware = [x for x in xids if x not in own]
    return (
        [f"{name} Xid {', '.join(str(x) for x in hardware)}"] if hardware else [],
        [f"{name} Xid {', '.join(str(x) for x in own)}"] if own else [],
    )


def _gpu_evidence(  # noqa: PLR0913 - the GPU, the window, and how to read what it shows
    node: NodeState,
    gpu: GpuState,
    window: Window,
    clock: float | None,
    config: JobsConfig,
    *,
    application: list[str],
    hard: list[str],
    xid_class: Callable[[int], str] | None,
) -> tuple[list[str], list[str]]:
    history, since, now = window.history, window.since, window.now
    compute: list[str] = []
    comm: list[str] = []
    name = f"GPU {gpu.index}"
    key = gpu_key(node.name, gpu.index)
    if not gpu.present:
        compute.append(f"{name} lost")
        hard.append(compute[-1])
    reasons = int(gpu.number("clock_event_reasons") or 0)
    throttled = [text for bit, text in SLOWDOWN_REASONS.items() if reasons & bit]
    if throttled:
        temp = gpu.number("temperature_celsius")
        at = f" at {temp:.0f} °C" if temp is not None else ""
        compute.append(f"{name} clocks throttled ({', '.join(throttled)}){at}")
    sm_clock = gpu.number("sm_clock_mhz")
    if sm_clock is not None and clock and sm_clock < LOW_CLOCK_SHARE * clock:
        compute.append(f"{name} SM clock {sm_clock:.0f} MHz (job median {clock:.0f})")
    hardware, own = _xid_evidence(name, sorted(set(history.xids(key, since))), xid_class)
    compute += hardware
    application += own
    hard += hardware
    dbe = history.increase(key, "ecc_dbe_aggregate_total", since, now)
    if dbe > 0:
        compute.append(f"{name} {dbe:.0f} uncorrectable ECC errors")
        hard.append(compute[-1])
    if gpu.nvlinks_down:
        links = "NVLink" if gpu.nvlinks_down == 1 else "NVLinks"
        comm.append(f"{name}: {gpu.nvlinks_down} {links} down")
        hard.append(comm[-1])
    elif (downs := history.events(key, "nvlink_down", since)) > 0:
        comm.append(f"{name} NVLink went down {downs}x")
        hard.append(comm[-1])
    worst_link = max(
        (
            sum(
                history.increase(link_key(node.name, gpu.index, link), signal, since, now)
                for signal in NVLINK_ERROR_SIGNALS
            )
            for link in gpu.link_signals
        ),
        default=0.0,
    )
    if worst_link > 0 and worst_link >= config.evidence_nvlink_errors:
        comm.append(f"{name} NVLink errors +{worst_link:.0f} on one link")
    width, width_max = gpu.number("pcie_link_width"), gpu.number("pcie_link_width_max")
    gen, gen_max = gpu.number("pcie_link_gen"), gpu.number("pcie_link_gen_max")
    if (width and width_max and width < width_max) or (gen and gen_max and gen < gen_max):
        comm.append(
            f"{name} PCIe Gen{gen or 0:.0f} x{width or 0:.0f} "
            f"(can do Gen{gen_max or 0:.0f} x{width_max or 0:.0f})"
        )
    return compute, comm


def _port_evidence(
    node: NodeState, port: PortState, window: Window, config: JobsConfig
) -> tuple[list[str], list[str]]:
    """(link evidence, fabric evidence) of one IB port."""
    name = f"IB {port.device}/{port.port}"
    link: list[str] = []
    fabric: list[str] = []
    key = port_key(node.name, port.device, port.port)
    if port.state and not port.up:
        link.append(f"{name} {port.state}")
    elif (downs := window.history.events(key, "ib_port_down", window.since)) > 0:
        link.append(f"{name} went down {downs}x")
    for signal in IB_ERROR_SIGNALS:
        grown = window.history.increase(key, signal, window.since, window.now)
        if grown > 0 and grown >= config.evidence_ib_errors:
            fabric.append(f"{name} {signal.removeprefix('ib_')} +{grown:.0f}")
    wait = port.number(CONGESTION_SIGNAL)
    if wait is not None and wait >= config.congestion_xmit_wait_per_s:
        fabric.append(f"{name} congested ({wait:,.0f} waits/s)")
    return link, fabric


def node_evidence(  # noqa: PLR0913 - the node, the window, and how to read it
    node: NodeState,
    gpu_uuids: set[str],
    window: Window,
    config: JobsConfig,
    *,
    job_clock: float | None = None,
    xid_class: Callable[[int], str] | None = None,
) -> NodeEvidence:
    """Hardware evidence on ``node`` since ``since`` (its job's GPUs only, if named).

    ``xid_class`` classes Xids as the catalog does: the ``application`` ones are set apart (None:
    every Xid is taken for the hardware's).
    """
    evidence = NodeEvidence(node.name)
    if node.signals.get(NVML_HUNG_SIGNAL) == 1:
        evidence.compute.append("NVML hung (the driver does not answer)")
        evidence.hard.append(evidence.compute[-1])
    for gpu in node.gpus.values():
        if gpu_uuids and gpu.uuid not in gpu_uuids:
            continue
        compute, comm = _gpu_evidence(
            node,
            gpu,
            window,
            job_clock,
            config,
            application=evidence.application,
            hard=evidence.hard,
            xid_class=xid_class,
        )
        evidence.compute += compute
        evidence.communication += comm
    for port in node.ports.values():
        link, fabric = _port_evidence(node, port, window, config)
        evidence.communication += link
        evidence.hard += link  # a port down, or that went down
        evidence.fabric += fabric
    return evidence


def job_clock(job: JobState, nodes: Mapping[str, NodeState]) -> float | None:
    """The median SM clock over the job's GPUs (to tell a low one), None when unknown."""
    clocks = []
    for rank in job.ranks.values():
        node = nodes.get(rank.node)
        gpu = node.gpus.get(rank.gpu_uuid) if node is not None else None
        value = gpu.number("sm_clock_mhz") if gpu is not None else None
        if value:
            clocks.append(value)
    return statistics.median(clocks) if clocks else None


def job_evidence(
    job: JobState,
    nodes: Mapping[str, NodeState],
    window: Window,
    config: JobsConfig,
) -> dict[str, NodeEvidence]:
    """Evidence on every node of the job, by node name."""
    gpus_by_node: dict[str, set[str]] = {}
    for rank in job.ranks.values():
        uuids = gpus_by_node.setdefault(rank.node, set())
        if rank.gpu_uuid:
            uuids.add(rank.gpu_uuid)
    clock = job_clock(job, nodes)
    out = {}
    for name, uuids in gpus_by_node.items():
        node = nodes.get(name)
        if node is not None:
            out[name] = node_evidence(node, uuids, window, config, job_clock=clock)
    return out


def _spread(showing: list[str], nodes: int, config: JobsConfig) -> tuple[str, ...]:
    """``showing`` if that many of ``nodes`` are too many to be one node's fault, else none."""
    if len(showing) >= config.fabric_min_nodes and len(showing) >= config.fabric_share * nodes:
        return tuple(sorted(showing))
    return ()


def fabric_nodes(evidence: Mapping[str, NodeEvidence], config: JobsConfig) -> tuple[str, ...]:
    """The nodes showing fabric signs, when they are too many to be one node's fault."""
    return _spread([n for n, e in evidence.items() if e.fabric], len(evidence), config)


def job_fabric_nodes(
    job: JobState,
    nodes: Mapping[str, NodeState],
    window: Window,
    config: JobsConfig,
) -> tuple[str, ...]:
    """:func:`fabric_nodes` of a job, reading only its nodes' IB ports (it runs every tick)."""
    present = [nodes[name] for name in job.nodes() if name in nodes]
    showing = [
        node.name
        for node in present
        if any(_port_evidence(node, port, window, config)[1] for port in node.ports.values())
    ]
    return _spread(showing, len(present), config)


def diagnose(
    job: JobState,
    evidence: Mapping[str, NodeEvidence],
    config: JobsConfig,
) -> Diagnosis:
    """Rank the job's nodes as suspects of its slowdown (see the module docstring)."""
    fabric = fabric_nodes(evidence, config)
    ratios = job.stragglers.ratios()
    straggling = job.stragglers.stragglers
    slow_bar = 1 + config.straggler_margin / 2
    suspects = []
    for name, ev in evidence.items():
        ranks = [r.rank for r in job.ranks.values() if r.node == name]
        slow = tuple(sorted(r for r in ranks if r in straggling))
        worst = max((ratios.get(r, 1.0) for r in ranks), default=1.0)
        score = 0.0
        lines: list[str] = []
        if slow:
            score += 10 * (worst - 1) + 5
            lines.append(f"ranks {', '.join(map(str, slow))} compute {worst - 1:.0%} slower")
        if ev.compute and (slow or worst >= slow_bar):
            score += len(ev.compute)
            lines += ev.compute
        comm = ev.communication + ([] if fabric else ev.fabric)
        if comm:
            score += len(comm)
            lines += comm
        if score > 0:
            suspects.append(Suspect(name, round(score, 3), tuple(lines), slow))
    suspects.sort(key=lambda s: (-s.score, s.node))
    cause = "hardware" if suspects else ("fabric" if fabric else "none")
    return Diagnosis(cause, tuple(suspects), fabric, len(evidence))
