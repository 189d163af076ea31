"""The checks made against what this collector did, before an action runs.

:class:`SafetyChecks` keeps what this collector did (nodes drained and draining, GPUs being
reset, when each action last ran, the drain breaker) and says whether an action may run now,
within the limits of :class:`SafetyConfig`. Over a shared journal a drain or a reset is decided
again against every collector's actions (:mod:`collector.actions.fleet_checks`), through
:meth:`SafetyChecks.fleet_refusal`.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

import structlog

from collector.actions.fleet_checks import drain_refusal, reset_refusal
from collector.jobs.processes import GONE

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.actions.safety import SafetyConfig
    from collector.model.fleet import FleetModel
    from collector.store.incidents import ActionRow, Decision, FleetActions, IncidentRow
    from fleetwatch.clock import Clock
    from rules.model import ActionSpec, Rule

log = structlog.get_logger("collector.actions")


class SafetyChecks:
    """What this collector did, and whether an action may run now because of it."""

    def __init__(
        self,
        *,
        config: SafetyConfig,
        fleet: FleetModel,
        clock: Clock,
        gpu_ranks: Callable[[str, int], list[tuple[str, int, str]]] | None = None,
    ) -> None:
        """Nothing drained yet; ``gpu_ranks(node, index)`` names the (job, rank, state) on a GPU."""
        self.config = config
        self._fleet = fleet
        self._clock = clock
        self._gpu_ranks = gpu_ranks
        self.drained: dict[str, str] = {}  # node -> incident that drained it
        self.draining: set[str] = set()  # nodes whose drain is running now
        self.resetting: set[str] = set()  # GPUs (node/gpu/N) whose reset is running now
        self.breaker_open_until: float | None = None
        self._last_action: dict[tuple[str, str], float] = {}
        self._drain_starts: deque[float] = deque()

    def learn_drained(self, rows: list[ActionRow], owns: Callable[[str], bool]) -> None:
        """Which of the nodes ``owns`` says are this collector's the journal's ``rows`` drained."""
        for row in reversed(rows):  # oldest first
            if not owns(row.node):
                # a peer's node (shared journal): the fleet-wide checks count it; counted here
                # too, against a cap of this collector's own nodes, it held this one's drains
                # back for good once the peers' drains filled it
                continue
            if row.action.endswith("drain_node") and row.state == "succeeded":
                self.drained[row.node] = row.incident_id
            elif row.action in ("resume_node", "release_node") and row.state == "succeeded":
                self.drained.pop(row.node, None)

    def fleet_size(self) -> int:
        """How many nodes the fleet model knows."""
        return len(self._fleet.view())

    def cap(self, fleet_size: int) -> int:
        """How many nodes may be drained at once in a fleet of ``fleet_size``."""
        return min(
            self.config.max_drained_nodes,
            max(1, math.floor(fleet_size * self.config.max_drained_share)),
        )

    def refusal(self, incident: IncidentRow, rule: Rule, spec: ActionSpec) -> tuple[str, str]:
        """(state, why) when the action must not run now; ("planned", "") when it may."""
        why = (
            (incident.suppressed_by and f"suppressed by {incident.suppressed_by}")
            or (incident.silenced_by and f"silenced by {incident.silenced_by}")
            or (
                spec.name == "drain_node"
                and incident.node in self.drained
                and f"{incident.node} is already drained by {self.drained[incident.node]}"
            )
            or (
                spec.name == "drain_node"
                and incident.node in self.draining
                and f"{incident.node} is being drained for another incident"
            )
            or (
                spec.name == "reset_gpu"
                and cooldown_key(incident, spec) in self.resetting
                and f"{cooldown_key(incident, spec)} is being reset for another incident"
            )
        )
        if why:
            return "skipped", why
        if self.config.dry_run or rule.dry_run:
            return "dry_run", "dry run: nothing was done"
        mono = self._clock.monotonic()
        where = cooldown_key(incident, spec)
        last = self._last_action.get((where, spec.name))
        if spec.name != "notify" and last is not None and mono - last < self.config.node_cooldown_s:
            return (
                "skipped",
                f"cooldown: {spec.name} ran on {where} {mono - last:.0f} s ago",
            )
        if spec.name == "drain_node":
            return self._drain_refusal(mono)
        return "planned", ""

    def fleet_refusal(
        self, incident: IncidentRow, spec: ActionSpec, fleet: FleetActions
    ) -> Decision:
        """(state, why, open the breaker until ms) from every collector's actions."""
        now_ms = int(self._clock.now() * 1000)
        if spec.name == "reset_gpu":
            return reset_refusal(cooldown_key(incident, spec), fleet, now_ms, self.config)
        size = max(fleet.nodes, self.fleet_size())
        return drain_refusal(
            incident, fleet, now_ms=now_ms, safety=self.config, cap=self.cap(size), size=size
        )

    def _drain_refusal(self, mono: float) -> tuple[str, str]:
        if self.breaker_open_until is not None:
            if mono < self.breaker_open_until:
                return "deferred", "circuit breaker open: drains came too fast"
            self.breaker_open_until = None
        fleet_size = self.fleet_size()
        cap = self.cap(fleet_size)
        taken = len(self.drained) + len(self.draining)
        if taken >= cap:
            return (
                "deferred",
                f"drain cap reached: {taken} of {fleet_size} nodes drained or draining (cap {cap})",
            )
        starts = self._drain_starts
        while starts and mono - starts[0] > self.config.breaker_window_s:
            starts.popleft()
        if len(starts) >= self.config.breaker_max_drains:
            self.breaker_open_until = mono + self.config.breaker_cooldown_s
            log.error("drain_breaker_open", drains=len(starts))
            return "deferred", "circuit breaker opened: drains came too fast"
        return "planned", ""

    def busy_set(self, spec: ActionSpec) -> set[str] | None:
        """Where an action of this kind marks what it is working on, if anywhere."""
        return {"drain_node": self.draining, "reset_gpu": self.resetting}.get(spec.name)

    def drain_started(self) -> None:
        """A drain starts now: it counts toward the breaker's window."""
        self._drain_starts.append(self._clock.monotonic())

    def ran(self, incident: IncidentRow, spec: ActionSpec) -> None:
        """The action ran now: its cooldown starts."""
        self._last_action[cooldown_key(incident, spec), spec.name] = self._clock.monotonic()

    def _ranks_on(self, incident: IncidentRow) -> list[tuple[str, int, str]]:
        """The training ranks on the incident's GPU (none known: empty)."""
        if self._gpu_ranks is None or "/gpu/" not in incident.target:
            return []
        node, _, rest = incident.target.partition("/gpu/")
        index = rest.split("/", 1)[0]
        return self._gpu_ranks(node, int(index)) if index.isdigit() else []

    def holders(self, incident: IncidentRow) -> str:
        """``job J rank R (hung)``, ... for the ranks on the incident's GPU."""
        ranks = self._ranks_on(incident)
        return ", ".join(f"job {j} rank {r}" + (f" ({s})" if s else "") for j, r, s in ranks[:4])

    def gpu_freed(self, incident: IncidentRow) -> bool:
        """Every rank process known on the incident's GPU has ended (ask for the reset now)."""
        ranks = self._ranks_on(incident)
        return bool(ranks) and all(state in GONE for _, _, state in ranks)


def place(incident: IncidentRow, spec: ActionSpec) -> str:
    """What an action holds while it is decided and runs: a drain its node, a reset its GPU."""
    return incident.node if spec.name == "drain_node" else cooldown_key(incident, spec)


def cooldown_key(incident: IncidentRow, spec: ActionSpec) -> str:
    """Cooldowns are per node, except resets: per GPU (``node/gpu/N``)."""
    if spec.name == "reset_gpu" and "/gpu/" in incident.target:
        node, _, rest = incident.target.partition("/gpu/")
        return f"{node}/gpu/{rest.split('/', 1)[0]}"
    return incident.node
