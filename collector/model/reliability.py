"""Reliability figures from the lifecycle journal: time between incidents, to repair, GPU time lost.

And the remediations of each node. Pure: functions of journal rows
(:class:`~collector.store.lifecycle.TransitionRow`, and the (node, action, when) of actions that
succeeded) and a time; nothing here reads a clock or the journal. Times are Unix milliseconds,
durations seconds. The words (docs/oncall.md "Reliability and lemon nodes"):

* an **incident episode** begins when a node in service moves to suspect or drained. A node put
  back in service while one of its faults still fires goes back to suspect at once
  (:data:`~collector.model.lifecycle.STILL_FIRING`): that is the same episode going on;
* **time between incidents** is the time from one episode's start to the next's, on one node;
* a **repair** begins when a node leaves service (from in service or suspect to drained, in
  repair, re-qualifying or RMA) and ends when it is back in service; one still under way is
  *open*, with its age;
* **GPU time lost** is the node's GPUs times the time it was out of service (drained, in repair,
  re-qualifying, RMA) within the window; the fleet's share is the sum over the nodes of that,
  over the sum of their GPUs times the window;
* a **remediation** is an action that succeeded whose name ends in ``drain_node``,
  ``reset_gpu``, ``reboot_node`` or ``rma_ticket`` (``escalated_drain_node`` counts).
"""

from __future__ import annotations

import itertools
import math
import re
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from statistics import fmean
from typing import TYPE_CHECKING, Any, Final, Protocol

from collector.model.lifecycle import OUT_OF_SERVICE, STILL_FIRING, State

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "BUCKETS_S",
    "KINDS",
    "LEMON_WINDOW_S",
    "OUT",
    "SERVING",
    "WINDOW_S",
    "Buckets",
    "FleetFigures",
    "MoveRow",
    "NodeFigures",
    "Recent",
    "fleet_figures",
    "is_episode",
    "leaves_service",
    "node_figures",
    "recent_counts",
    "remediation_kind",
    "returns_to_service",
]

WINDOW_S: Final = 30 * 86_400.0  # the figures' window unless one is asked for
LEMON_WINDOW_S: Final = 7 * 86_400.0  # remediations and episodes a lemon is counted over
# Histogram buckets of time to repair and between incidents: 15 minutes to 30 days.
BUCKETS_S: Final = (
    900.0,
    1800.0,
    3600.0,
    7200.0,
    14_400.0,
    28_800.0,
    43_200.0,
    86_400.0,
    172_800.0,
    345_600.0,
    604_800.0,
    1_209_600.0,
    2_592_000.0,
)
SERVING: Final = frozenset({State.IN_SERVICE.value, State.SUSPECT.value})
OUT: Final = frozenset(s.value for s in OUT_OF_SERVICE)
_EPISODE_TO: Final = frozenset({State.SUSPECT.value, State.DRAINED.value})
# A remediation by the end of its name (an escalation's is ``escalated_<name>``): the kind it is.
_REMEDIATION: Final = re.compile(r"(?:^|_)(drain_node|reset_gpu|reboot_node|rma_ticket)$")
KINDS: Final = {
    "drain_node": "drains",
    "reset_gpu": "resets",
    "reboot_node": "reboots",
    "rma_ticket": "rma_tickets",
}


class MoveRow(Protocol):
    """A lifecycle move as the figures read it.

    A journal row (:class:`~collector.store.lifecycle.TransitionRow`) or the lean
    :class:`~collector.store.lifecycle.Move` a window is read as.
    """

    @property
    def node(self) -> str:
        """The node that moved."""
        ...

    @property
    def state(self) -> str:
        """The state it moved to."""
        ...

    @property
    def previous(self) -> str:
        """The state it left."""
        ...

    @property
    def at_ms(self) -> int:
        """When (Unix milliseconds)."""
        ...

    @property
    def actor(self) -> str:
        """Who or what moved it (``person:WHO`` for a person)."""
        ...

    @property
    def reason(self) -> str:
        """Why (:data:`~collector.model.lifecycle.STILL_FIRING` marks an episode going on)."""
        ...


def remediation_kind(action: str) -> str | None:
    """``drains``, ``resets``, ``reboots`` or ``rma_tickets`` for a remediation; else None."""
    match = _REMEDIATION.search(action)
    return KINDS[match.group(1)] if match else None


def is_episode(row: MoveRow) -> bool:
    """Whether the move begins an incident episode (in service to suspect or drained)."""
    return (
        row.previous == State.IN_SERVICE.value
        and row.state in _EPISODE_TO
        and row.reason != STILL_FIRING
    )


def leaves_service(row: MoveRow) -> bool:
    """Whether the move takes the node out of service (a repair begins)."""
    return row.previous in SERVING and row.state in OUT


def returns_to_service(row: MoveRow) -> bool:
    """Whether the move puts a node out of service back in service (a repair ends)."""
    return row.previous in OUT and row.state == State.IN_SERVICE.value


def _mean(values: list[float]) -> float | None:
    return round(fmean(values), 3) if values else None


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """One node's figures over a window that ends now.

    ``between_s``: the times between its episodes that began in the window; ``repairs_s``: its
    repairs that ended in the window (a repair that began before counts whole); ``open_s``: the
    age of the repair under way (None: in service); ``out_s``: time out of service in the window.
    """

    node: str
    gpus: int
    state: str
    window_s: float
    episodes: int = 0
    between_s: tuple[float, ...] = ()
    repairs_s: tuple[float, ...] = ()
    open_s: float | None = None
    out_s: float = 0.0

    @property
    def lost_ratio(self) -> float:
        """The share of the node's GPU time lost in the window (0 to 1)."""
        return min(1.0, self.out_s / self.window_s) if self.window_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """The node's figures as the API gives them."""
        return {
            "node": self.node,
            "gpus": self.gpus,
            "state": self.state,
            "incident_episodes": self.episodes,
            "mean_time_between_incidents_s": _mean(list(self.between_s)),
            "time_between_incidents_s": [round(s, 3) for s in self.between_s],
            "repairs": len(self.repairs_s),
            "mean_time_to_repair_s": _mean(list(self.repairs_s)),
            "time_to_repair_s": [round(s, 3) for s in self.repairs_s],
            "open_repair_s": None if self.open_s is None else round(self.open_s, 3),
            "out_of_service_s": round(self.out_s, 3),
            "gpu_time_lost_ratio": round(self.lost_ratio, 6),
        }


def node_figures(  # noqa: PLR0913 - one node's rows and what frames them
    node: str,
    rows: Iterable[MoveRow],
    *,
    now_ms: int,
    window_s: float,
    gpus: int = 0,
    before: MoveRow | None = None,
    left_ms: int | None = None,
) -> NodeFigures:
    """The figures of ``node`` from its ``rows`` in the window ending at ``now_ms``.

    ``rows`` are its moves at or after the window's start, in journal order; ``before`` its
    newest move before the start (where it stood then; None: in service); ``left_ms`` when it
    last left service before the start (a repair under way then began there; None: at
    ``before``'s time, or unknown). Moves after ``now_ms`` are left out.
    """
    start_ms = now_ms - round(window_s * 1000)
    state = before.state if before is not None else State.IN_SERVICE.value
    left: int | None = None  # when the repair under way began
    if state in OUT:
        left = left_ms if left_ms is not None else (before.at_ms if before else start_ms)
    out_since = start_ms if state in OUT else None
    out_ms = 0
    episodes: list[int] = []
    repairs: list[float] = []
    for row in rows:
        if row.at_ms > now_ms or row.at_ms < start_ms:
            continue
        if is_episode(row):
            episodes.append(row.at_ms)
        if row.state in OUT and state not in OUT:
            left, out_since = row.at_ms, row.at_ms
        elif row.state not in OUT and state in OUT:
            if out_since is not None:
                out_ms += row.at_ms - out_since
            if row.state == State.IN_SERVICE.value and left is not None:
                repairs.append((row.at_ms - left) / 1000)
            left = out_since = None
        state = row.state
    if out_since is not None:
        out_ms += now_ms - out_since
    return NodeFigures(
        node=node,
        gpus=gpus,
        state=state,
        window_s=window_s,
        episodes=len(episodes),
        between_s=tuple((b - a) / 1000 for a, b in itertools.pairwise(episodes)),
        repairs_s=tuple(repairs),
        open_s=(now_ms - left) / 1000 if state in OUT and left is not None else None,
        out_s=out_ms / 1000,
    )


@dataclass(frozen=True, slots=True)
class FleetFigures:
    """The fleet's figures over a window: every node's, summed.

    ``gpu_time_lost_ratio`` is the nodes' GPUs times their time out of service over their GPUs
    times the window (nodes of unknown GPU count weigh nothing).
    """

    window_s: float
    now_ms: int
    nodes: tuple[NodeFigures, ...] = ()
    took_s: float = 0.0

    @property
    def between_s(self) -> list[float]:
        """Every node's times between incidents."""
        return [s for n in self.nodes for s in n.between_s]

    @property
    def repairs_s(self) -> list[float]:
        """Every completed repair's time."""
        return [s for n in self.nodes for s in n.repairs_s]

    @property
    def open_repairs(self) -> list[tuple[str, float]]:
        """(node, age) of each repair under way, oldest first."""
        found = [(n.node, n.open_s) for n in self.nodes if n.open_s is not None]
        return sorted(found, key=lambda pair: -pair[1])

    @property
    def gpu_time_lost_ratio(self) -> float:
        """The fleet's share of GPU time lost in the window (0 to 1)."""
        total = sum(n.gpus for n in self.nodes) * self.window_s
        lost = sum(n.gpus * min(n.out_s, self.window_s) for n in self.nodes)
        return lost / total if total > 0 else 0.0

    @property
    def mean_time_to_repair_s(self) -> float | None:
        """The mean of the completed repairs (None: none)."""
        return _mean(self.repairs_s)

    @property
    def mean_time_between_incidents_s(self) -> float | None:
        """The mean time between incidents over every node (None: no node had two)."""
        return _mean(self.between_s)

    def to_json(self) -> dict[str, Any]:
        """The fleet's figures as the API gives them (without the nodes')."""
        return {
            "nodes": len(self.nodes),
            "gpus": sum(n.gpus for n in self.nodes),
            "incident_episodes": sum(n.episodes for n in self.nodes),
            "mean_time_between_incidents_s": self.mean_time_between_incidents_s,
            "time_between_incidents_s": sorted(round(s, 3) for s in self.between_s),
            "repairs": len(self.repairs_s),
            "mean_time_to_repair_s": self.mean_time_to_repair_s,
            "time_to_repair_s": sorted(round(s, 3) for s in self.repairs_s),
            "open_repairs": [
                {"node": node, "age_s": round(age, 3)} for node, age in self.open_repairs
            ],
            "gpu_time_lost_ratio": round(self.gpu_time_lost_ratio, 6),
        }


def fleet_figures(  # noqa: PLR0913 - the window's rows and what frames them
    rows: Iterable[MoveRow],
    *,
    now_ms: int,
    window_s: float,
    gpus: Mapping[str, int],
    before: Mapping[str, MoveRow] | None = None,
    left: Mapping[str, int] | None = None,
) -> FleetFigures:
    """Every node's figures, from the window's ``rows`` (every node's, in journal order).

    ``gpus`` names the fleet's nodes with their GPU count: each has figures, moved or not; a
    node of the journal it does not name has them too, with no GPUs. ``before`` and ``left``:
    :func:`node_figures`'s, by node.
    """
    before, left = before or {}, left or {}
    by_node: dict[str, list[MoveRow]] = {name: [] for name in gpus}
    for row in rows:
        by_node.setdefault(row.node, []).append(row)
    for name in before:
        by_node.setdefault(name, [])
    return FleetFigures(
        window_s=window_s,
        now_ms=now_ms,
        nodes=tuple(
            node_figures(
                name,
                moves,
                now_ms=now_ms,
                window_s=window_s,
                gpus=gpus.get(name, 0),
                before=before.get(name),
                left_ms=left.get(name),
            )
            for name, moves in sorted(by_node.items())
        ),
    )


@dataclass(slots=True)
class Recent:
    """One node's remediations (by kind) and incident episodes in the lemon window."""

    remediations: Counter[str] = field(default_factory=Counter)
    episodes: int = 0

    def to_json(self) -> dict[str, Any]:
        """The counts as the API gives them."""
        return {
            "remediations": sum(self.remediations.values()),
            **{kind: self.remediations.get(kind, 0) for kind in KINDS.values()},
            "incident_episodes": self.episodes,
        }


def recent_counts(
    actions: Iterable[tuple[str, str, int]],
    rows: Iterable[MoveRow],
    *,
    now_ms: int,
    window_s: float = LEMON_WINDOW_S,
) -> dict[str, Recent]:
    """Each node's remediations and incident episodes in the window ending at ``now_ms``.

    Remediations come from ``actions`` ((node, action, when it succeeded)), episodes from the
    lifecycle ``rows``.
    """
    start_ms = now_ms - round(window_s * 1000)
    found: dict[str, Recent] = {}
    for node, action, at_ms in actions:
        kind = remediation_kind(action)
        if kind is not None and start_ms <= at_ms <= now_ms:
            found.setdefault(node, Recent()).remediations[kind] += 1
    for row in rows:
        if start_ms <= row.at_ms <= now_ms and is_episode(row):
            found.setdefault(row.node, Recent()).episodes += 1
    return found


class Buckets:
    """A cumulative histogram (Prometheus' kind): counts by upper bound, a sum and a count."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = BUCKETS_S) -> None:
        """Empty, with these upper bounds (increasing; +Inf is added)."""
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Count one value (seconds)."""
        if not math.isfinite(value) or value < 0:
            return
        self.counts[bisect_left(self.bounds, value)] += 1  # le: at most the bound
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) per bucket, +Inf last, as Prometheus counts them."""
        counts = list(self.counts)  # a copy: the scrape thread reads while the loop counts
        out: list[tuple[float, int]] = []
        running = 0
        for bound, count in zip((*self.bounds, math.inf), counts, strict=True):
            running += count
            out.append((bound, running))
        return out
