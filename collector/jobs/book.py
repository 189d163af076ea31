"""The collector's jobs: step reports in; figures and diagnoses out (to rules, API, metrics).

Stream sessions hand every JobReport to :meth:`JobBook.ingest`; the rules evaluator asks for the
``job`` variables of each job and the ``rank`` variables of each GPU; the HTTP thread reads
:meth:`JobBook.summaries`. A job newly judged hung is handed to the evidence gatherer
(:mod:`collector.jobs.evidence`), whose stacks then name its culprits. Everything runs on the
event loop except ``summaries``, ``ranks`` and ``evidence``, which copy under the lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import structlog

from collector.jobs.checkpoint_policy import (
    PRIOR_FAILURES_PER_NODE_DAY,
    PRIOR_WEIGHT_S,
    advise,
    failure_rate,
)
from collector.jobs.culprits import Culprits
from collector.jobs.diagnosis import (
    Diagnosis,
    Window,
    diagnose,
    job_evidence,
    job_fabric_nodes,
    node_evidence,
)
from collector.jobs.evidence import RECORDER_LABEL, EvidenceGatherer
from collector.jobs.liveness import Liveness, judge
from collector.jobs.peak_flops import flops_per_token, mfu, peak_flops
from collector.jobs.state import JobState

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from collector.jobs.checkpoint_policy import CheckpointAdvice
    from collector.jobs.config import JobsConfig
    from collector.jobs.stacks import Localisation
    from collector.jobs.state import FinishedStep
    from collector.model.fleet import FleetModel
    from collector.model.history import History
    from collector.model.state import NodeState
    from fleetwatch.clock import Clock
    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

log = structlog.get_logger("collector.jobs")

FABRIC_WINDOW_S: Final = 300.0  # IB errors this recent count as fabric signs
EVIDENCE_LEAD_S: Final = 60.0  # a fault shows in the hardware a little before the steps slow
RECENT_STEPS: Final = 20  # throughput and step time are figured over this many finished steps
PRIOR_PER_S: Final = PRIOR_FAILURES_PER_NODE_DAY / 86400.0
NO_RANK: Final[dict[str, Any]] = {}
# Why a step report is refused: the job table is full; the sender's uid holds its share of it;
# another owner (Slurm job or uid) reports the job; another node holds the rank; the rank is not
# below the job's declared world size; the node already holds ``ranks_per_node`` ranks.
REFUSALS: Final = (
    "max_jobs",
    "uid_jobs",
    "owner_mismatch",
    "rank_held",
    "beyond_world",
    "node_ranks",
)
LOG_EVERY: Final = 1000
SLURM_OWNER: Final = "Slurm job "


def owner_of(step: pb.JobStep) -> str:
    """Who sent a step, as its agent learned from the kernel ("" from an agent too old to say)."""
    if step.scheduler_job.startswith("slurm:"):
        return SLURM_OWNER + step.scheduler_job.removeprefix("slurm:")
    if not step.HasField("sender_uid"):
        return ""
    if step.scheduler_job:
        return f"pods of uid {step.sender_uid}"
    return f"uid {step.sender_uid}"


@dataclass(slots=True)
class _NodeFailures:
    first_seen: float
    failures: int = 0


class JobBook:
    """Every job heard of recently, by id."""

    def __init__(
        self,
        *,
        config: JobsConfig,
        fleet: FleetModel,
        clock: Clock,
        xid_class: Callable[[int], str] | None = None,
    ) -> None:
        """Empty; the rules evaluator lends ``history`` (hardware evidence reads its windows).

        ``xid_class`` classes an Xid as the catalog in use does: a culprit's application Xids
        (13, 31, 43, ...) are told but are not hardware evidence (None: every Xid is).
        """
        self.config = config
        self._xid_class = xid_class
        self._fleet = fleet
        self._clock = clock
        self.history: History | None = None
        self._lock = threading.Lock()
        self.jobs: dict[str, JobState] = {}
        self._failures: dict[str, _NodeFailures] = {}
        self._diagnoses: dict[str, tuple[int, Diagnosis]] = {}
        # each job's culprits as last judged: rank -> its node or GPU shows hardware faults
        self._culprit_ranks: dict[str, dict[int, bool]] = {}
        self._culprit_texts: dict[str, dict[int, str]] = {}  # and what names each of them
        # GPUs (node, index) whose rank was named a culprit or no longer is, since last taken
        self._culprits_changed: set[tuple[str, int]] = set()
        self._placement: dict[tuple[str, str], set[tuple[str, int]]] = {}  # (node, GPU) -> ranks
        self._node_ranks: Counter[str] = Counter()  # ranks held, by the node that reports them
        self._flagged: dict[str, set[int]] = {}  # straggling ranks by job, as last told
        self._published: list[dict[str, Any]] = []
        self._published_ranks: dict[str, list[dict[str, Any]]] = {}
        self._published_evidence: dict[str, dict[str, Any]] = {}
        # Asks the agents of a hung job's nodes for its ranks' stacks (its ``ask`` is set by the
        # composition root: the command broker comes after the book).
        self.evidence = EvidenceGatherer(clock, ranks_per_node=config.ranks_per_node)
        self.reports = 0
        self.refused: Counter[str] = Counter()  # by reason (REFUSALS)
        self._uid_jobs: Counter[int] = Counter()
        self.agent_lost: dict[str, int] = {}  # reports each node's agent dropped
        # Told when a job finished steps, with the GPUs whose rank started or stopped
        # straggling (the rules evaluator looks at the job and those GPUs again).
        self.on_change: Callable[[str, list[tuple[str, str]]], None] = lambda _job, _gpus: None

    # ---- in -----------------------------------------------------------------------------------

    def ingest(self, node: str, report: pb.JobReport) -> None:
        """Take a (validated) batch of step reports from ``node``'s agent."""
        now, unix = self._clock.monotonic(), self._clock.now()
        changed: dict[str, JobState] = {}
        with self._lock:
            self.agent_lost[node] = report.dropped
            self._failures.setdefault(node, _NodeFailures(now))
            for step in report.steps:
                job = self._job_for(node, step, now, unix)
                if job is None:
                    continue
                self.reports += 1
                self._placement.setdefault((node, step.gpu_uuid), set()).add(
                    (step.job_id, step.rank),
                )
                if self._take(job, node, step, now):
                    changed[job.job_id] = job
            self._describe(node, report.processes, now)
            told = [(job.job_id, self._straggling_changed(job)) for job in changed.values()]
        for job_id, gpus in told:
            self.on_change(job_id, gpus)

    def _describe(self, node: str, processes: Iterable[pb.RankProcess], now: float) -> None:
        """Hand each job what ``node``'s agent says of its rank processes (unknown jobs: none)."""
        by_job: dict[str, list[pb.RankProcess]] = {}
        for process in processes:
            by_job.setdefault(process.job_id, []).append(process)
        for job_id, theirs in by_job.items():
            job = self.jobs.get(job_id)
            if job is not None:
                job.describe(node, theirs, now)

    def _take(self, job: JobState, node: str, step: pb.JobStep, now: float) -> bool:
        """Hand the report to its job (True: it finished steps), counting each node's ranks."""
        shrinks = step.world_size and step.world_size < job.world_size
        placed = {rank: held.node for rank, held in job.ranks.items()} if shrinks else {}
        held = job.ranks.get(step.rank)
        was = held.node if held is not None else None
        finished = job.take(node, step, now)
        for rank, at in placed.items():  # ranks the smaller world left behind
            if rank not in job.ranks:
                self._unplace(at)
        if step.rank in job.ranks and was != node:
            if was is not None:
                self._unplace(was)
            self._node_ranks[node] += 1
        return bool(finished)

    def _unplace(self, node: str) -> None:
        self._node_ranks[node] -= 1
        if self._node_ranks[node] <= 0:
            del self._node_ranks[node]

    @property
    def reports_refused(self) -> int:
        """Step reports refused for any reason."""
        return sum(self.refused.values())

    def refusals(self) -> Counter[str]:
        """Refused step reports by reason, copied under the lock (any thread)."""
        with self._lock:
            return self.refused.copy()

    def _job_for(self, node: str, step: pb.JobStep, now: float, unix: float) -> JobState | None:
        """The job this step may go into, or None when it is refused (counted and logged)."""
        owner = owner_of(step)
        job = self.jobs.get(step.job_id)
        if job is not None and owner and job.owner and owner != job.owner:
            if not owner.startswith(SLURM_OWNER) or job.owner.startswith(SLURM_OWNER):
                self._refuse("owner_mismatch", node, step, owner=owner, holder=job.owner)
                return None
            # The scheduler's word beats a uid that reported the job id first: start afresh.
            log.warning("job_owner_replaced", job=step.job_id, owner=owner, previous=job.owner)
            self._forget(step.job_id)
            job = None
        if job is None:
            uid = step.sender_uid if step.HasField("sender_uid") else None
            if len(self.jobs) >= self.config.max_jobs:
                self._refuse("max_jobs", node, step, owner=owner)
                return None
            if uid is not None and self._uid_jobs[uid] >= self.config.jobs_per_uid:
                self._refuse("uid_jobs", node, step, owner=owner)
                return None
            job = self.jobs[step.job_id] = JobState(step.job_id, self.config, now, unix)
            log.info("job_seen", job=step.job_id, node=node, rank=step.rank, owner=owner)
        if owner and not job.owner:  # the first report from an agent that can tell
            job.owner = owner
            if step.HasField("sender_uid"):
                job.uid = step.sender_uid
                self._uid_jobs[step.sender_uid] += 1
        refusal = self._rank_refusal(job, node, step, now)
        if refusal is not None:
            reason, why = refusal
            self._refuse(reason, node, step, owner=owner, **why)
            return None
        return job

    def _rank_refusal(
        self, job: JobState, node: str, step: pb.JobStep, now: float
    ) -> tuple[str, dict[str, str]] | None:
        """Why ``node`` may not report this rank of ``job`` (None: it may)."""
        holder = job.holder_elsewhere(node, step, now, self.config.idle_after_s)
        if holder:
            return "rank_held", {"holder": holder}
        if job.beyond_world(step):
            return "beyond_world", {"world": str(job.world_size)}
        held = job.ranks.get(step.rank)
        if (held is None or held.node != node) and (
            self._node_ranks[node] >= self.config.ranks_per_node
        ):
            return "node_ranks", {"held": str(self._node_ranks[node])}
        return None

    def _refuse(self, reason: str, node: str, step: pb.JobStep, **why: str) -> None:
        self.refused[reason] += 1
        count = self.refused[reason]
        if count == 1 or count % LOG_EVERY == 0:
            log.warning(
                "job_report_refused",
                reason=reason,
                node=node,
                job=step.job_id,
                rank=step.rank,
                count=count,
                **why,
            )

    def _forget(self, job_id: str) -> None:
        job = self.jobs.pop(job_id)
        for held in job.ranks.values():
            self._unplace(held.node)
        if job.uid is not None:
            self._uid_jobs[job.uid] -= 1
            if self._uid_jobs[job.uid] <= 0:
                del self._uid_jobs[job.uid]
        self._diagnoses.pop(job_id, None)
        self._culprit_ranks.pop(job_id, None)
        self._culprit_texts.pop(job_id, None)
        self._flagged.pop(job_id, None)
        self.evidence.forget(job_id)

    def _straggling_changed(self, job: JobState) -> list[tuple[str, str]]:
        """(node, GPU) of the ranks that started or stopped straggling since last asked."""
        now = set(job.stragglers.stragglers)
        before = self._flagged.get(job.job_id, set())
        self._flagged[job.job_id] = now
        return [(job.ranks[r].node, job.ranks[r].gpu_uuid) for r in now ^ before if r in job.ranks]

    def note_failure(self, node: str) -> None:
        """A node failed (lost GPU, fatal Xid, unreachable): it counts in checkpoint advice."""
        with self._lock:
            record = self._failures.setdefault(node, _NodeFailures(self._clock.monotonic()))
            record.failures += 1

    def expire(self) -> None:
        """Forget jobs silent for ``forget_after_s``."""
        now = self._clock.monotonic()
        with self._lock:
            for job_id in [
                j
                for j, job in self.jobs.items()
                if now - job.last_seen > self.config.forget_after_s
            ]:
                self._forget(job_id)
                log.info("job_forgotten", job=job_id)
            self._placement = {
                key: kept
                for key, ranks in self._placement.items()
                if (kept := {(j, r) for j, r in ranks if j in self.jobs})
            }

    # ---- figures ------------------------------------------------------------------------------

    def active(self, job: JobState) -> bool:
        """The job reported within ``idle_after_s``."""
        return self._clock.monotonic() - job.last_seen <= self.config.idle_after_s

    @staticmethod
    def _recent(job: JobState) -> list[FinishedStep]:
        return list(job.steps)[-RECENT_STEPS:]

    def throughput(self, job: JobState) -> tuple[float, float]:
        """(tokens per second, median step time) over the recent finished steps."""
        recent = self._recent(job)
        seconds = sum(s.step_time_s for s in recent)
        if not recent or seconds <= 0:
            return 0.0, 0.0
        times = sorted(s.step_time_s for s in recent)
        return sum(s.tokens for s in recent) / seconds, times[len(times) // 2]

    def mfu(self, job: JobState, tokens_per_s: float) -> float:
        """Model FLOPs utilisation (0 when the model size or the GPU's peak is unknown)."""
        per_token = flops_per_token(job.params or None, job.flops_per_token or None)
        peak = self._peak(job)
        if per_token is None or peak is None:
            return 0.0
        return mfu(tokens_per_s, per_token, _present(job), peak)

    def _peak(self, job: JobState) -> float | None:
        nodes = self._fleet.view()
        for rank in job.ranks.values():
            node = nodes.get(rank.node)
            if node is None:
                continue
            gpu = node.gpus.get(rank.gpu_uuid) or next(iter(node.gpus.values()), None)
            if gpu is not None:
                return peak_flops(gpu.model)
        return None

    def _wall(self, job: JobState) -> float:
        """Wall time the job has run: since its first report, plus the first step's own time."""
        first = job.steps[0].step_time_s if job.steps else 0.0
        return self._clock.monotonic() - job.first_seen + first

    def ettr(self, job: JobState) -> float:
        """Effective training time ratio: time of steps that moved the job on / wall time."""
        wall = self._wall(job)
        return min(1.0, job.productive_s / wall) if wall > 0 else 0.0

    def goodput(self, job: JobState) -> float:
        """Tokens of steps that moved the job forward, per second of wall time."""
        wall = self._wall(job)
        return job.productive_tokens / wall if wall > 0 else 0.0

    def checkpoint(self, job: JobState) -> tuple[float, CheckpointAdvice | None]:
        """(age of the newest checkpoint in seconds, the recommended interval)."""
        unix = self._clock.now()
        last_end = job.checkpoints[-1][1] if job.checkpoints else job.first_seen_unix
        costs = sorted(end - start for start, end in job.checkpoints)
        cost = costs[len(costs) // 2] if costs else 0.0
        now = self._clock.monotonic()
        rates = []
        for name in job.nodes():
            record = self._failures.get(name)
            observed = now - record.first_seen if record else 0.0
            failures = record.failures if record else 0
            rates.append(
                failure_rate(
                    failures, observed, prior_per_s=PRIOR_PER_S, prior_weight_s=PRIOR_WEIGHT_S
                ),
            )
        return max(0.0, unix - last_end), advise(cost, rates) if cost > 0 else None

    def diagnosis(self, job: JobState) -> Diagnosis | None:
        """The cause of the job's current throughput drop (None when there is none)."""
        drop = job.drops.active
        history = self.history
        if drop is None or history is None:
            return None
        cached = self._diagnoses.get(job.job_id)
        if cached is not None and cached[0] == job.max_step:
            return cached[1]
        since = self._step_time(job, drop.onset_step) - EVIDENCE_LEAD_S
        window = Window(history, since, self._clock.monotonic())
        evidence = job_evidence(job, self._fleet.view(), window, self.config)
        result = diagnose(job, evidence, self.config)
        self._diagnoses[job.job_id] = (job.max_step, result)
        return result

    @staticmethod
    def _step_time(job: JobState, step: int) -> float:
        """Monotonic time the job began ``step`` (a step before the finished window: the first)."""
        for finished in job.steps:
            if finished.step >= step:
                return finished.at - finished.step_time_s
        return job.first_seen

    # ---- rank view (GPU rules) ----------------------------------------------------------------

    def rank_on(self, node: str, gpu_uuid: str) -> dict[str, Any]:
        """The ``rank`` variables of the job rank on this GPU (empty when none runs there)."""
        best: dict[str, Any] = NO_RANK
        for job_id, rank in self._placement.get((node, gpu_uuid), ()):
            job = self.jobs.get(job_id)
            if job is None or not self.active(job):
                continue
            where = job.ranks.get(rank)
            if where is None or where.node != node or where.gpu_uuid != gpu_uuid:
                continue  # the rank moved
            data = self._rank_map(job, rank)
            order = (data["hang_culprit"], data["slowdown"])
            if not best or order > (best["hang_culprit"], best["slowdown"]):
                best = data
        return best

    def _note_culprits_changed(
        self,
        job: JobState,
        before: dict[int, bool],
        after: dict[int, bool],
        nodes: Mapping[str, NodeState],
    ) -> None:
        """Keep the GPUs of the ranks named or unnamed (or whose hardware verdict changed)."""
        for rank in before.keys() | after.keys():
            if rank in before and rank in after and before[rank] == after[rank]:
                continue
            held = job.ranks.get(rank)
            node = nodes.get(held.node) if held is not None else None
            gpu = node.gpus.get(held.gpu_uuid) if node is not None and held is not None else None
            if held is not None and gpu is not None:
                self._culprits_changed.add((held.node, gpu.index))

    def take_culprit_changes(self) -> set[tuple[str, int]]:
        """The GPUs (node, index) whose rank's culprit verdict changed since the last call.

        The evaluator marks them changed, so ``gpu_hang_culprit`` is judged at its next tick
        rather than when the fleet's sweep comes round to them (``full_sweep_s``).
        """
        changed, self._culprits_changed = self._culprits_changed, set()
        return changed

    def _rank_map(self, job: JobState, rank: int) -> dict[str, Any]:
        status = job.stragglers.stragglers.get(rank)
        ratio = job.stragglers.ratio(rank) or 1.0
        lost = job.gpus * (1 - 1 / ratio) if status is not None else 0.0
        return {
            "job": job.job_id,
            "rank": rank,
            "straggler": status is not None,
            "slowdown": round(ratio - 1, 4),
            "straggler_steps": status.steps if status else 0,
            "job_gpus": job.gpus,
            "lost_gpu_hours_per_hour": round(lost, 3),
            # named as holding its hung or failed job, and whether its node or GPU shows
            # hardware faults (Xid, GPU lost, NVLink, IB, PCIe: collector/jobs/diagnosis.py)
            "hang_culprit": rank in self._culprit_ranks.get(job.job_id, {}),
            "hang_hardware": self._culprit_ranks.get(job.job_id, {}).get(rank, False),
        }

    def on_gpu(self, node: str, index: int) -> list[tuple[str, int, str]]:
        """(job, rank, its process's state or "") of the ranks on ``node``'s GPU ``index``."""
        with self._lock:
            held = self._fleet.view().get(node)
            gpu = next((g for g in held.gpus.values() if g.index == index), None) if held else None
            if gpu is None:
                return []
            out = []
            for job_id, rank in self._placement.get((node, gpu.uuid), ()):
                job = self.jobs.get(job_id)
                where = job.ranks.get(rank) if job is not None else None
                if job is None or where is None or (where.node, where.gpu_uuid) != (node, gpu.uuid):
                    continue  # the rank moved, or the job is forgotten
                process = job.processes.get(rank)
                out.append((job_id, rank, process.state if process is not None else ""))
            return sorted(out)

    def culprit_summary(self, job_id: str, rank: int) -> str:
        """The hang culprit incident's evidence: what names the rank ("" when it is none)."""
        job = self.jobs.get(job_id)
        culprit = self._culprit_texts.get(job_id, {}).get(rank)
        if job is None or culprit is None:
            return ""
        return f"culprit of job {job_id}: {culprit}"

    def straggler_summary(self, job_id: str, rank: int) -> str:
        """The straggler incident's evidence: who, how slow, what it costs, what the node shows."""
        job = self.jobs.get(job_id)
        if job is None or rank not in job.ranks:
            return ""
        data = self._rank_map(job, rank)
        where = job.ranks[rank]
        text = (
            f"rank {rank} of job {job_id} on {where.node} computes {data['slowdown']:.0%} slower "
            f"than the job's median over {self.config.straggler_window_steps} steps; the job "
            f"({job.gpus} GPUs) loses {data['lost_gpu_hours_per_hour']:.1f} GPU-hours per hour"
        )
        history = self.history
        node = self._fleet.view().get(where.node)
        if history is None or node is None:
            return text
        now = self._clock.monotonic()
        uuids = {where.gpu_uuid} if where.gpu_uuid else set()
        evidence = node_evidence(node, uuids, Window(history, now - 3600.0, now), self.config)
        found = "; ".join(evidence.lines) or "none found"
        return f"{text}; hardware: {found}"

    # ---- job view (job rules, API, metrics) ---------------------------------------------------

    def job_map(self, job: JobState) -> dict[str, Any]:
        """The ``job`` variables of one job."""
        active = self.active(job)
        nodes = self._fleet.view()
        silent = frozenset(n for n in job.nodes() if (s := nodes.get(n)) and not s.reachable)
        liveness = judge(
            job, self._clock.monotonic(), self.config, active=active, silent_nodes=silent
        )
        stacks = self._stacks(job, liveness)
        culprits = self._culprits(job, liveness, stacks)
        named = {int(c["rank"]): c["hardware"] == "yes" for c in culprits}
        before = self._culprit_ranks.get(job.job_id, {})
        if named != before:
            self._note_culprits_changed(job, before, named, nodes)
        self._culprit_ranks[job.job_id] = named
        self._culprit_texts[job.job_id] = {int(c["rank"]): c["text"] for c in culprits}
        tokens_per_s, step_time = self.throughput(job)
        age, advice = self.checkpoint(job)
        drop = job.drops.active if active else None
        diagnosis = self.diagnosis(job) if drop is not None else None
        stragglers = job.stragglers.stragglers if active else {}
        worst = max((s.ratio for s in stragglers.values()), default=1.0)
        interval = advice.interval_s if advice else 0.0
        fabric = self._fabric(job) if active else ()
        missing = job.missing() if active else set()
        present = _present(job)
        return {
            "id": job.job_id,
            "active": active,
            "state": liveness.state,
            "silent_s": round(liveness.silent_s, 1),
            "hang_deadline_s": round(liveness.deadline_s, 1),
            "ranks_gone": len(liveness.gone),
            "culprits": [c["text"] for c in culprits],
            "culprit_nodes": sorted({c["node"] for c in culprits}),
            "world_size": job.world_size,
            "ranks": len(job.ranks),
            "ranks_missing": len(missing),
            "missing_nodes": sorted({job.ranks[r].node for r in missing}),
            "nodes": len(job.nodes()),
            "gpus": job.gpus,
            "step": max(job.max_step, 0),
            "step_time_s": step_time,
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_gpu": tokens_per_s / present if present else 0.0,
            "mfu": self.mfu(job, tokens_per_s),
            "ettr": self.ettr(job),
            "goodput_tokens_per_s": self.goodput(job),
            "restarts": job.restarts,
            "stragglers": len(stragglers),
            "straggler_nodes": sorted({job.ranks[r].node for r in stragglers if r in job.ranks}),
            "lost_gpu_hours_per_hour": job.gpus * (1 - 1 / worst) if stragglers else 0.0,
            "drop": drop is not None,
            "drop_share": drop.share if drop else 0.0,
            "drop_cause": diagnosis.cause if diagnosis else "",
            "suspects": [s.node for s in diagnosis.suspects] if diagnosis else [],
            "fabric": bool(fabric),
            "fabric_nodes": list(fabric),
            "checkpoint_age_s": age,
            "checkpoint_cost_s": advice.cost_s if advice else 0.0,
            "checkpoint_interval_s": interval,
            "checkpoint_overdue": bool(
                active and interval and age > self.config.checkpoint_overdue_factor * interval
            ),
            "summary": self._summary(
                job,
                liveness=liveness,
                culprits=culprits,
                stacks=stacks,
                missing=missing,
                tokens_per_s=tokens_per_s,
                drop=drop,
                diagnosis=diagnosis,
                age=age,
                interval=interval,
            ),
        }

    def _fabric(self, job: JobState) -> tuple[str, ...]:
        """Nodes of the job that show congestion or IB errors now, if too many to blame one."""
        history = self.history
        if history is None:
            return ()
        now = self._clock.monotonic()
        window = Window(history, now - FABRIC_WINDOW_S, now)
        return job_fabric_nodes(job, self._fleet.view(), window, self.config)

    def _stacks(self, job: JobState, liveness: Liveness) -> Localisation | None:
        """The ranks' stacks grouped, when the job is hung and they were gathered in this hang."""
        found = self.evidence.found.get(job.job_id)
        if found is None or liveness.state != "hung" or liveness.since is None:
            return None
        return found.localisation if found.asked_at >= liveness.since else None

    def _culprits(
        self, job: JobState, liveness: Liveness, stacks: Localisation | None
    ) -> list[dict[str, str]]:
        """The ranks that stand out in a hang or a failure (:mod:`collector.jobs.culprits`)."""
        if liveness.state not in {"hung", "failed"}:
            return []
        return Culprits(
            self._fleet.view(), self.history, self.config, self._clock.monotonic(), self._xid_class
        ).name(job, liveness, stacks)

    @staticmethod
    def _summary(  # noqa: PLR0913 - the figures the line is made of
        job: JobState,
        *,
        liveness: Liveness,
        culprits: list[dict[str, str]],
        stacks: Localisation | None,
        missing: set[int],
        tokens_per_s: float,
        drop: Any,  # noqa: ANN401 - a Drop or None
        diagnosis: Diagnosis | None,
        age: float,
        interval: float,
    ) -> str:
        parts = [f"job {job.job_id} at step {max(job.max_step, 0)}: {tokens_per_s:,.0f} tokens/s"]
        parts += _liveness_parts(liveness, culprits, stacks)
        if missing:
            where = sorted({job.ranks[r].node for r in missing})
            shown = where[:5]
            more = ", ..." if len(where) > len(shown) else ""
            on = ", ".join(shown) + more
            parts.append(f"{len(missing)} of {job.expected_ranks} ranks missing (on {on})")
        if drop is not None:
            parts.append(
                f"throughput down {drop.share:.0%} since step {drop.onset_step} "
                f"({drop.baseline:,.0f} -> {drop.current:,.0f} tokens/s)"
            )
            if diagnosis is not None:
                parts.append(diagnosis.summary())
        if interval:
            parts.append(
                f"last checkpoint {age / 60:.0f} min ago, recommended every {interval / 60:.0f} min"
            )
        return "; ".join(parts)

    def _note_gone(self, job: JobState) -> None:
        """Mark the ranks whose GPU the fleet lost, or whose node is unreachable, as gone."""
        nodes = self._fleet.view()
        gone = set()
        for rank in job.ranks.values():
            node = nodes.get(rank.node)
            if node is None:
                continue
            gpu = node.gpus.get(rank.gpu_uuid) if rank.gpu_uuid else None
            if not node.reachable or (gpu is not None and not gpu.present):
                gone.add(rank.rank)
        job.gone = frozenset(gone)
        for rank_id in gone:
            job.stragglers.forget(rank_id)

    def publish(self) -> list[dict[str, Any]]:
        """Figure every job (on the event loop) and keep the result for other threads."""
        with self._lock:
            for job in self.jobs.values():
                self._note_gone(job)
            maps = [self.job_map(job) for job in self.jobs.values()]
            for job, published in zip(self.jobs.values(), maps, strict=True):
                self.evidence.judged(job, published["state"])
            self._published = maps
            self._published_ranks = {
                job.job_id: self._rank_table(job) for job in self.jobs.values()
            }
            self._published_evidence = dict(self.evidence.shown)
        return maps

    async def dump(self, job_id: str) -> dict[str, Any] | None:
        """Gather the job's evidence now (on the event loop); None when there is no such job.

        The answer is the evidence's JSON, or ``{}`` when no agent can be asked.
        """
        job = self.jobs.get(job_id)
        if job is None:
            return None
        found = await self.evidence.gather(job)
        return self.evidence.shown.get(job_id, {}) if found is not None else {}

    def _rank_table(self, job: JobState) -> list[dict[str, Any]]:
        nodes = self._fleet.view()
        ratios = job.stragglers.ratios()
        missing = job.missing()
        out = []
        for rank in sorted(job.ranks.values(), key=lambda r: r.rank):
            node = nodes.get(rank.node)
            gpu = node.gpus.get(rank.gpu_uuid) if node is not None else None
            out.append(
                {
                    "rank": rank.rank,
                    "node": rank.node,
                    "gpu": gpu.index if gpu is not None else None,
                    "gpu_uuid": rank.gpu_uuid or None,
                    "step": rank.step,
                    "process": job.processes[rank.rank].state
                    if rank.rank in job.processes
                    else None,
                    "step_time_s": rank.step_time_s,
                    "compute_time_s": rank.compute_time_s,
                    "compute_ratio": ratios.get(rank.rank),
                    "straggler": rank.rank in job.stragglers.stragglers,
                    "missing": rank.rank in missing,
                },
            )
        return out

    def ranks(self, job_id: str) -> list[dict[str, Any]]:
        """Each rank of a job as last published (any thread)."""
        with self._lock:
            return list(self._published_ranks.get(job_id, []))

    def evidence_of(self, job_id: str) -> dict[str, Any] | None:
        """The job's latest evidence as last published (any thread; None: none gathered)."""
        with self._lock:
            return self._published_evidence.get(job_id)

    def summaries(self) -> list[dict[str, Any]]:
        """The jobs' figures as last published, for the API and metrics (any thread)."""
        with self._lock:
            return list(self._published)


def _liveness_parts(
    liveness: Liveness, culprits: list[dict[str, str]], stacks: Localisation | None
) -> list[str]:
    """The summary's words on the job's state, its culprits and its stacks."""
    parts = []
    if liveness.state == "hung":
        parts.append(
            f"hung: no step finished for {liveness.silent_s:.0f} s (its deadline "
            f"{liveness.deadline_s:.0f} s), every rank process still there"
        )
    elif liveness.state == "failed":
        gone = ", ".join(str(r) for r in liveness.gone[:8])
        parts.append(f"failed: rank {gone} exited and the others wait")
    elif liveness.state == "finished":
        parts.append("finished: every rank process exited")
    if culprits:
        parts.append("culprits: " + "; ".join(c["text"] for c in culprits[:4]))
    elif liveness.state == "hung":
        parts.append("no rank's process stands out (stopped, D state or gone)")
    if stacks is not None:  # labelled: the recorders' and the stacks', or the stacks' alone
        labelled = stacks.verdict.startswith(RECORDER_LABEL)
        parts.append(stacks.verdict if labelled else f"stacks: {stacks.verdict}")
    return parts


def _present(job: JobState) -> int:
    """GPUs of the job whose ranks are there (its GPUs less the missing ranks')."""
    return max(job.gpus - len(job.missing()), 0)
