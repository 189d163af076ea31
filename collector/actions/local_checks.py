"""The checks made against what this collector did, before an action runs.

:class:`SafetyChecks` keeps what this collector did (nodes drained and draining, GPUs being
reset, jobs being and lately requeued, nodes rebooting, when each action last ran, the drain
breaker) and says whether an action may run now, within the limits of :class:`SafetyConfig`.
Over a shared journal a drain, a reset or a reboot is decided again against every collector's
actions (:mod:`collector.actions.fleet_checks`), through :meth:`SafetyChecks.fleet_refusal`; a
requeue is decided here only.

A reboot takes its node out of service as a drain does (Slurm's ``reboot ASAP`` drains it), so
one of a node fleetwatch does not hold drained needs room under the drain cap; and no more than
``max_rebooting_nodes`` reboots are in flight at once (from the reboot until the node says hello
from a new boot, at most ``reboot_timeout_s``), nor two of one node within ``reboot_cooldown_s``.
What these hold back is skipped, never deferred: a reboot that waited for room would land long
after the fault that asked for it.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

import structlog

from collector.actions.fleet_checks import drain_refusal, gpu_of, reboot_refusal, reset_refusal
from collector.jobs.processes import GONE

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.actions.safety import SafetyConfig
    from collector.model.fleet import FleetModel
    from collector.store.incidents import ActionRow, Decision, FleetActions, IncidentRow
    from fleetwatch.clock import Clock
    from rules.model import ActionSpec, Rule

log = structlog.get_logger("collector.actions")


def no_slurm_job(where: str) -> str:
    """Why ``requeue_job`` has nothing to requeue on ``where`` (a node's GPU)."""
    return (
        f"no Slurm job is known on {where}: requeue_job requeues only a job whose ranks the "
        "node's kernel placed in a Slurm job (their cgroup)"
    )


class SafetyChecks:
    """What this collector did, and whether an action may run now because of it."""

    def __init__(  # noqa: PLR0913 - the limits, the fleet, the clock, what the job book tells
        self,
        *,
        config: SafetyConfig,
        fleet: FleetModel,
        clock: Clock,
        gpu_ranks: Callable[[str, int], list[tuple[str, int, str]]] | None = None,
        gpu_job: Callable[[str, int], str | None] | None = None,
        requeue_on: Callable[[], bool] | None = None,
    ) -> None:
        """Nothing drained yet; ``gpu_ranks(node, index)`` names the (job, rank, state) on a GPU.

        ``gpu_job(node, index)`` names the job of the rank a GPU rule sees there (None: none);
        ``requeue_on()`` says whether requeueing is switched on (None: it is off).
        """
        self.config = config
        self._fleet = fleet
        self._clock = clock
        self._gpu_ranks = gpu_ranks
        self._gpu_job = gpu_job
        self._requeue_on = requeue_on
        self.requeuing: set[str] = set()  # places (job/<id>) of the requeues running now
        self.requeued: dict[str, tuple[str, float]] = {}  # job -> (incident, unix time)
        self._requeue_times: deque[float] = deque()  # unix times of requeues that ran
        self.drained: dict[str, str] = {}  # node -> incident that drained it
        self.draining: set[str] = set()  # nodes whose drain is running now
        self.resetting: set[str] = set()  # GPUs (node/gpu/N) whose reset is running now
        self.breaker_open_until: float | None = None
        self._last_action: dict[tuple[str, str], float] = {}
        self._drain_starts: deque[float] = deque()
        self.rebooting: set[str] = set()  # nodes whose reboot is being decided or running now
        # node -> (its boot id then, Unix time): reboots asked for, until the node is back
        self.rebooted: dict[str, tuple[str, float]] = {}

    def learn_drained(self, rows: list[ActionRow], owns: Callable[[str], bool]) -> None:
        """Which of the nodes ``owns`` says are this collector's the journal's ``rows`` drained."""
        for row in reversed(rows):  # oldest first
            if not owns(row.node):
                # a peer's node (shared journal): the fleet-wide checks count it; counted here
                # too, against a cap of this collector's own nodes, it held this one's drains
                # back for good once the peers' drains filled it
                continue
            if row.action.endswith(("drain_node", "reboot_node")) and row.state == "succeeded":
                self.drained[row.node] = row.incident_id  # a reboot drained it too
            elif row.action in ("resume_node", "release_node") and row.state == "succeeded":
                self.drained.pop(row.node, None)

    def learn_requeued(self, rows: list[ActionRow], owns: Callable[[str], bool]) -> None:
        """Which jobs the journal's ``rows`` say were requeued, and when (across restarts)."""
        for row in reversed(rows):  # oldest first
            job = row.params.get("job")
            if (
                owns(row.node)
                and row.action.endswith("requeue_job")
                and row.state in ("succeeded", "failed")
                and isinstance(job, str)
            ):
                self.requeued[job] = (row.incident_id, row.created_ms / 1000)
                self._requeue_times.append(row.created_ms / 1000)

    def learn_rebooted(self, rows: list[ActionRow], owns: Callable[[str], bool]) -> None:
        """The reboots the journal's ``rows`` hold: their cooldown, and those still in flight."""
        now, mono = self._clock.now(), self._clock.monotonic()
        for row in reversed(rows):  # oldest first
            if not (owns(row.node) and row.action.endswith("reboot_node")):
                continue
            at = row.created_ms / 1000
            if row.state not in ("succeeded", "failed", "planned", "running"):
                continue  # never ran: skipped, dry run, shadow, refused
            self._last_action[row.node, "reboot_node"] = mono - max(0.0, now - at)
            boot = row.params.get("boot_id")
            if row.state != "failed":  # asked for, or may have been (a restart cut it short)
                self.rebooted[row.node] = (boot if isinstance(boot, str) else "", at)

    def boot_of(self, node: str) -> str:
        """The boot id ``node``'s agent last said hello with ("" unknown)."""
        state = self._fleet.view().get(node)
        return state.boot_id if state is not None else ""

    def rebooting_nodes(self) -> set[str]:
        """Nodes whose reboot is in flight: asked for, and not yet back from a new boot.

        At most ``reboot_timeout_s`` after it was asked for: a node that never comes back is a
        person's to look at, and must not hold every other reboot back for good.
        """
        now = self._clock.now()
        for node, (boot, at) in list(self.rebooted.items()):
            back = bool(boot) and self.boot_of(node) not in ("", boot)
            if back or now - at >= self.config.reboot_timeout_s:
                del self.rebooted[node]
        return set(self.rebooted) | self.rebooting

    def reboot_asked(self, node: str, boot_id: str) -> None:
        """A reboot of ``node`` (from boot ``boot_id``) was accepted: it is in flight now."""
        self.rebooted[node] = (boot_id, self._clock.now())

    def job_of(self, incident: IncidentRow) -> str | None:
        """The job of the rank on the incident's GPU, as its rule saw it (none known: None)."""
        if self._gpu_job is None or "/gpu/" not in incident.target:
            return None
        node, _, rest = incident.target.partition("/gpu/")
        index = rest.split("/", 1)[0]
        return self._gpu_job(node, int(index)) if index.isdigit() else None

    def place(self, incident: IncidentRow, spec: ActionSpec) -> str:
        """What an action holds while decided and running (:func:`place`; a requeue its job)."""
        if spec.name == "requeue_job":
            return f"job/{self.job_of(incident)}"
        return place(incident, spec)

    def _requeue_skip(self, incident: IncidentRow) -> str:
        """Why the incident's job must not be requeued, whatever the limits ("" when it may)."""
        if self._requeue_on is None or not self._requeue_on():
            return "requeue is off ([collector.actions.slurm] requeue = true turns it on)"
        job = self.job_of(incident)
        if job is None:
            return no_slurm_job(gpu_of(incident.target))
        if f"job/{job}" in self.requeuing:
            return f"job {job} is being requeued for another incident"
        last = self.requeued.get(job)
        ago = self._clock.now() - last[1] if last is not None else math.inf
        if last is not None and ago < self.config.requeue_cooldown_s:
            return (
                f"job {job} was requeued {ago:.0f} s ago for {last[0]} (requeue_cooldown "
                f"{self.config.requeue_cooldown_s:g} s)"
            )
        return ""

    def _requeue_limit(self) -> tuple[str, str]:
        """No more than ``max_requeues`` requeues in ``requeue_window_s``."""
        now, times = self._clock.now(), self._requeue_times
        while times and now - times[0] > self.config.requeue_window_s:
            times.popleft()
        taken = len(times) + len(self.requeuing)
        if taken >= self.config.max_requeues:
            why = (
                f"requeue limit reached: {taken} requeues in the last "
                f"{self.config.requeue_window_s:g} s (max_requeues {self.config.max_requeues})"
            )
            return "skipped", why
        return "planned", ""

    def fleet_size(self) -> int:
        """How many nodes the fleet model knows."""
        return len(self._fleet.view())

    def cap(self, fleet_size: int) -> int:
        """How many nodes may be drained at once in a fleet of ``fleet_size``."""
        return min(
            self.config.max_drained_nodes,
            max(1, math.floor(fleet_size * self.config.max_drained_share)),
        )

    def would(
        self, incident: IncidentRow, rule: Rule, spec: ActionSpec, more_drains: int = 0
    ) -> tuple[str, str]:
        """:meth:`refusal` as a question: what it would answer now, changing nothing.

        ``more_drains``: drains the question assumes will have started by then (a dry run of
        several rules: the cap counts the ones before). The breaker is not opened, nor its
        window trimmed.
        """
        return self.refusal(incident, rule, spec, more_drains=more_drains, asking=True)

    def refusal(
        self,
        incident: IncidentRow,
        rule: Rule,
        spec: ActionSpec,
        *,
        more_drains: int = 0,
        asking: bool = False,
    ) -> tuple[str, str]:
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
            or (spec.name == "requeue_job" and self._requeue_skip(incident))
            or (
                spec.name == "reboot_node"
                and incident.node in self.rebooting
                and f"{incident.node} is being rebooted for another incident"
            )
        )
        if why:
            return "skipped", why
        held = self._held(rule)
        if held is not None:
            return held
        mono = self._clock.monotonic()
        where = cooldown_key(incident, spec)
        last = self._last_action.get((where, spec.name))
        cooldown = (
            self.config.reboot_cooldown_s
            if spec.name == "reboot_node"
            else self.config.node_cooldown_s
        )
        if (
            spec.name not in ("notify", "requeue_job")  # a requeue's limits are its job's
            and last is not None
            and mono - last < cooldown
        ):
            return (
                "skipped",
                f"cooldown: {spec.name} ran on {where} {mono - last:.0f} s ago",
            )
        if spec.name == "drain_node":
            return self._drain_refusal(mono, more=more_drains, asking=asking)
        return self._kind_limit(incident, spec, more_drains)

    def _kind_limit(self, incident: IncidentRow, spec: ActionSpec, more: int) -> tuple[str, str]:
        """The limits of requeues and reboots (the others have none past the cooldown)."""
        if spec.name == "requeue_job":
            return self._requeue_limit()
        if spec.name == "reboot_node":
            return self._reboot_limit(incident.node, more=more)
        return "planned", ""

    def _reboot_limit(self, node: str, *, more: int = 0) -> tuple[str, str]:
        """``max_rebooting_nodes``, and the drain cap for a node fleetwatch does not hold out."""
        rebooting = self.rebooting_nodes() - {node}
        limit = self.config.max_rebooting_nodes
        if len(rebooting) >= limit:
            shown = ", ".join(sorted(rebooting)[:4]) or "none may"
            why = (
                f"reboot limit reached: {len(rebooting)} nodes rebooting ({shown}; "
                f"max_rebooting_nodes {limit})"
            )
            return "skipped", why
        if node in self.drained or node in self.draining:
            return "planned", ""
        fleet_size = self.fleet_size()
        cap = self.cap(fleet_size)
        taken = self.out_of_service() + more
        if taken >= cap:
            why = (
                f"drain cap reached: a reboot takes {node} out of service too; {taken} of "
                f"{fleet_size} nodes drained or draining (cap {cap})"
            )
            return "skipped", why
        return "planned", ""

    def out_of_service(self) -> int:
        """Nodes fleetwatch holds out: drained, being drained, or being rebooted from service."""
        held = set(self.drained) | self.draining
        return len(held) + len(self.rebooting - held)

    def fleet_refusal(
        self, incident: IncidentRow, spec: ActionSpec, fleet: FleetActions
    ) -> Decision:
        """(state, why, open the breaker until ms) from every collector's actions."""
        now_ms = int(self._clock.now() * 1000)
        if spec.name == "reset_gpu":
            return reset_refusal(cooldown_key(incident, spec), fleet, now_ms, self.config)
        size = max(fleet.nodes, self.fleet_size())
        if spec.name == "reboot_node":
            return reboot_refusal(
                incident, fleet, now_ms=now_ms, safety=self.config, cap=self.cap(size), size=size
            )
        if spec.name != "drain_node":
            return "planned", "", 0  # decided here alone (a notification a restart cut short)
        return drain_refusal(
            incident, fleet, now_ms=now_ms, safety=self.config, cap=self.cap(size), size=size
        )

    def _drain_refusal(
        self, mono: float, *, more: int = 0, asking: bool = False
    ) -> tuple[str, str]:
        """The cap and the breaker; ``asking``: change nothing (:meth:`would`)."""
        if self.breaker_open_until is not None:
            if mono < self.breaker_open_until:
                return "deferred", "circuit breaker open: drains came too fast"
            if not asking:
                self.breaker_open_until = None
        fleet_size = self.fleet_size()
        cap = self.cap(fleet_size)
        taken = self.out_of_service() + more
        if taken >= cap:
            return (
                "deferred",
                f"drain cap reached: {taken} of {fleet_size} nodes drained or draining (cap {cap})",
            )
        starts = self._drain_starts
        recent = sum(1 for t in starts if mono - t <= self.config.breaker_window_s)
        if asking:
            if recent + more >= self.config.breaker_max_drains:
                return "deferred", "the circuit breaker would open: drains coming too fast"
            return "planned", ""
        while starts and mono - starts[0] > self.config.breaker_window_s:
            starts.popleft()
        if len(starts) >= self.config.breaker_max_drains:
            self.breaker_open_until = mono + self.config.breaker_cooldown_s
            log.error("drain_breaker_open", drains=len(starts))
            return "deferred", "circuit breaker opened: drains came too fast"
        return "planned", ""

    def busy_set(self, spec: ActionSpec) -> set[str] | None:
        """Where an action of this kind marks what it is working on, if anywhere."""
        return {
            "drain_node": self.draining,
            "reset_gpu": self.resetting,
            "requeue_job": self.requeuing,
            "reboot_node": self.rebooting,
        }.get(spec.name)

    def drain_started(self) -> None:
        """A drain starts now: it counts toward the breaker's window."""
        self._drain_starts.append(self._clock.monotonic())

    def ran(
        self, incident: IncidentRow, spec: ActionSpec, *, where: str = "", refused: bool = False
    ) -> None:
        """The action ran now: its cooldown starts.

        A requeue (``where`` is ``job/<id>``) counts toward its job's cooldown and the requeue
        limit unless it was refused (then nothing ran).
        """
        self._last_action[cooldown_key(incident, spec), spec.name] = self._clock.monotonic()
        if spec.name == "requeue_job" and not refused and where.startswith("job/"):
            now = self._clock.now()
            self.requeued[where.removeprefix("job/")] = (incident.id, now)
            self._requeue_times.append(now)

    def _held(self, rule: Rule) -> tuple[str, str] | None:
        """A shadow rule's action, or one under dry run: journaled as it would run, run not."""
        if rule.shadow:
            return "shadow", "shadow mode: would run, nothing was done"
        if self.config.dry_run or rule.dry_run:
            return "dry_run", "dry run: nothing was done"
        return None

    def released(self, node: str) -> None:
        """A person put ``node`` back in service: its drain cooldown is over.

        The cooldown keeps one fault from draining a node twice in a row; after a release, a
        new fault's drain is a new decision (it was skipped as "cooldown" within 5 minutes).
        """
        self._last_action.pop((node, "drain_node"), None)

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
    """What an action holds while decided and running: a drain's or reboot's node, a reset's GPU."""
    return (
        incident.node
        if spec.name in ("drain_node", "reboot_node")
        else cooldown_key(incident, spec)
    )


def cooldown_key(incident: IncidentRow, spec: ActionSpec) -> str:
    """Cooldowns are per node, except resets: per GPU (``node/gpu/N``)."""
    if spec.name == "reset_gpu" and "/gpu/" in incident.target:
        node, _, rest = incident.target.partition("/gpu/")
        return f"{node}/gpu/{rest.split('/', 1)[0]}"
    return incident.node
