"""Which sender may report for which job id on this node.

A report is tied to its sender's *owner*, learned from the kernel (:mod:`agent.jobs.peer_identity`):

- a process in a Slurm job may report only for that job (the job id is the Slurm job id), and a
  Slurm job always gets its own id, even from a uid that claimed it first;
- a process in a Kubernetes pod reports as *pods of its uid* (each pod of a job has its own UID,
  so the pod cannot name the job; its uid can keep other users and non-pod processes out);
- any other process reports as *its uid*.

The first owner to report a job id holds it on this node while any of its processes that
reported lives; reports from any other owner are refused (``job_owned``). Beyond Slurm jobs,
which Slurm admits, a uid outside pods holds at most ``per_uid`` job ids on the node, a pod
``MAX_JOBS_PER_POD``, and all of them together ``per_node``, so that made-up ids cannot fill
the collector's job table or its /metrics. Each owner also reports at most ``ranks_per_owner``
ranks at once on the node (a rank costs the collector two or three series), and all owners
together ``NODE_SHARES`` times that. Claims whose processes are all gone, and ranks whose last
sender is gone, are freed when a bound is met.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

import structlog

from agent.jobs.peer_identity import PeerGoneError
from agent.jobs.report import JobReportError

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent.jobs.peer_identity import Credentials, Peer, PeerResolver
    from fleetwatch.clock import Clock

log = structlog.get_logger("agent.jobs")

# Job ids held at once on a node, beside Slurm jobs (which Slurm admits): per uid outside pods
# (the agent's ``jobs_per_uid``), per pod, and all together (4 x jobs_per_uid). Each job costs
# about 15 series in the collector's /metrics; see docs/jobs.md for the budget these keep.
MAX_JOBS_PER_UID: Final = 3
# Ranks one owner (a uid, a uid's pods, a Slurm job) reports for at once on the node: a node of 8
# GPUs runs 8 ranks of a job, so this is two such jobs (the agent's ``ranks_per_uid``).
MAX_RANKS_PER_OWNER: Final = 16
MAX_JOBS_PER_POD: Final = 2
NODE_SHARES: Final = 4
MAX_CLAIMS: Final = 256  # Slurm jobs included: claims whose processes are gone leave first
PROCESSES_PER_CLAIM: Final = 64  # the most recent senders kept to tell whether a claim lives
RESCAN_S: Final = 1.0  # a full table looks for claims whose processes are gone at most this often


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a job id belongs to on this node."""

    kind: Literal["slurm", "k8s", "uid"]
    key: str  # the Slurm job id, or the uid as text

    def describe(self) -> str:
        """For messages: ``Slurm job 1234``, ``pods of uid 1000``, ``uid 1000``."""
        if self.kind == "slurm":
            return f"Slurm job {self.key}"
        return f"pods of uid {self.key}" if self.kind == "k8s" else f"uid {self.key}"


def owner_of(peer: Peer) -> Owner:
    """The owner a sender reports as."""
    job = peer.scheduler
    if job is not None and job.kind == "slurm":
        return Owner("slurm", job.id)
    return Owner("k8s" if job is not None else "uid", str(peer.uid))


@dataclass(slots=True)
class _Claim:
    owner: Owner
    uid: int
    pod: str  # the pod that claimed it ("" outside pods)
    # (pid, start ticks) of the processes that reported for it, newest last
    processes: dict[tuple[int, int], None] = field(default_factory=dict)
    # the ranks it reports on this node: rank -> (pid, start ticks) of its latest sender
    ranks: dict[int, tuple[int, int]] = field(default_factory=dict)

    def saw(self, pid: int, start: int) -> None:
        key = (pid, start)
        self.processes.pop(key, None)
        self.processes[key] = None
        if len(self.processes) > PROCESSES_PER_CLAIM:
            del self.processes[next(iter(self.processes))]


class JobClaims:
    """Job ids held on this node, by owner. ``alive(pid, start)`` tells whether a process runs."""

    def __init__(
        self,
        alive: Callable[[int, int], bool],
        *,
        per_uid: int = MAX_JOBS_PER_UID,
        per_node: int | None = None,
        ranks_per_owner: int = MAX_RANKS_PER_OWNER,
    ) -> None:
        """No claims yet."""
        self._alive = alive
        self._per_uid = per_uid
        self._per_node = NODE_SHARES * per_uid if per_node is None else per_node
        self._ranks_per_owner = ranks_per_owner
        self._claims: dict[str, _Claim] = {}
        self._scanned = float("-inf")
        self._ranks_scanned = float("-inf")

    def __len__(self) -> int:
        return len(self._claims)

    def holder(self, job_id: str) -> Owner | None:
        """Who holds ``job_id`` on this node now (None: nobody)."""
        claim = self._claims.get(job_id)
        return claim.owner if claim else None

    def admit(self, job_id: str, peer: Peer, now: float, rank: int = 0) -> None:
        """Let ``peer`` report ``rank`` of ``job_id``, or raise JobReportError saying why not."""
        scheduler = peer.scheduler
        if scheduler is not None and scheduler.kind == "slurm" and job_id != scheduler.id:
            msg = (
                f"sender (pid {peer.pid}, uid {peer.uid}) runs in Slurm job {scheduler.id} but "
                f"reports for job {job_id[:80]!r}; leave the job out or report as {scheduler.id!r}"
            )
            raise JobReportError("job_mismatch", msg)
        owner = owner_of(peer)
        claim = self._claims.get(job_id)
        if claim is not None and claim.owner != owner:
            if owner.kind == "slurm" or not self._lives(claim):
                log.warning(
                    "job_claim_taken",
                    job=job_id,
                    owner=owner.describe(),
                    previous=claim.owner.describe(),
                    pid=peer.pid,
                )
                del self._claims[job_id]
                claim = None
            else:
                msg = (
                    f"job {job_id[:80]!r} on this node belongs to {claim.owner.describe()}; "
                    f"sender pid {peer.pid} is {owner.describe()}"
                )
                raise JobReportError("job_owned", msg)
        if claim is None:
            self._make_room(peer, owner, now)
            self._rank_room(owner, now)
            claim = self._claims[job_id] = _Claim(owner, peer.uid, _pod(peer))
        elif rank not in claim.ranks:
            self._rank_room(owner, now)
        claim.saw(peer.pid, peer.start_ticks)
        claim.ranks[rank] = (peer.pid, peer.start_ticks)

    def ranks_held(self, owner: Owner | None = None) -> int:
        """Ranks reported on this node now, by ``owner`` (None: by everyone)."""
        return sum(len(c.ranks) for c in self._claims.values() if owner in (None, c.owner))

    def _rank_room(self, owner: Owner, now: float) -> None:
        """Raise JobReportError if one more rank of ``owner`` would pass a bound."""
        refusal = self._rank_refusal(owner)
        if refusal is not None and now - self._ranks_scanned >= RESCAN_S:
            self._ranks_scanned = now  # free the ranks whose last sender is gone
            for claim in self._claims.values():
                for gone in [r for r, p in claim.ranks.items() if not self._alive(*p)]:
                    del claim.ranks[gone]
            refusal = self._rank_refusal(owner)
        if refusal is not None:
            raise refusal

    def _rank_refusal(self, owner: Owner) -> JobReportError | None:
        node = NODE_SHARES * self._ranks_per_owner
        if (held := self.ranks_held()) >= node:
            return _full("node_ranks_full", f"this node already takes reports for {held} ranks")
        if (held := self.ranks_held(owner)) >= self._ranks_per_owner:
            what = f"{owner.describe()} already reports for {held} ranks"
            return _full("owner_ranks_full", what)
        return None

    def _lives(self, claim: _Claim) -> bool:
        return any(self._alive(pid, start) for pid, start in reversed(claim.processes))

    def _refusal(self, peer: Peer, owner: Owner) -> JobReportError | None:
        """Why a new claim by ``peer`` would pass a bound (None: it would not)."""
        if len(self._claims) >= MAX_CLAIMS:
            return _full("node_jobs_full", f"this node already takes reports for {MAX_CLAIMS} jobs")
        if owner.kind == "slurm":
            return None  # one id per Slurm job, and Slurm admitted the job
        capped = [c for c in self._claims.values() if c.owner.kind != "slurm"]
        if len(capped) >= self._per_node:
            held = len(capped)
            return _full("node_jobs_full", f"this node already takes reports for {held} jobs")
        pod = _pod(peer)
        if pod:
            mine = sum(c.pod == pod for c in capped)
            if mine >= MAX_JOBS_PER_POD:
                return _full("pod_jobs_full", f"pod {pod} already reports for {mine} jobs")
        elif sum(c.owner == owner for c in capped) >= self._per_uid:
            held = self._per_uid
            return _full("uid_jobs_full", f"uid {peer.uid} already reports for {held} jobs")
        return None

    def _make_room(self, peer: Peer, owner: Owner, now: float) -> None:
        refusal = self._refusal(peer, owner)
        if refusal is not None and now - self._scanned >= RESCAN_S:
            # Free the claims whose processes are all gone; at most once a RESCAN_S, so that a
            # flood does not read /proc for every report.
            self._scanned = now
            for job_id in [j for j, c in self._claims.items() if not self._lives(c)]:
                del self._claims[job_id]
            refusal = self._refusal(peer, owner)
        if refusal is not None:
            raise refusal


def _pod(peer: Peer) -> str:
    job = peer.scheduler
    return job.id if job is not None and job.kind == "k8s" else ""


def _full(reason: str, what: str) -> JobReportError:
    return JobReportError(reason, f"{what} on this node, the most it may")


class SenderCheck:
    """Who sent a report (from the kernel), and whether they may report for the job it names."""

    def __init__(
        self,
        peers: PeerResolver,
        clock: Clock,
        *,
        jobs_per_uid: int = MAX_JOBS_PER_UID,
        ranks_per_uid: int = MAX_RANKS_PER_OWNER,
    ) -> None:
        """Look senders up through ``peers``; a uid outside pods holds ``jobs_per_uid`` ids.

        Each owner (a uid, a uid's pods, a Slurm job) holds ``ranks_per_uid`` ranks.
        """
        self.peers = peers
        self.claims = JobClaims(peers.alive, per_uid=jobs_per_uid, ranks_per_owner=ranks_per_uid)
        self._clock = clock

    def sender(self, creds: Credentials | None) -> Peer:
        """The process behind a connection's credentials, or JobReportError."""
        if creds is None:
            raise JobReportError("no_credentials", "the kernel names no process for the sender")
        try:
            return self.peers.resolve(creds)
        except PeerGoneError as exc:
            msg = f"sender uid {creds.uid}: {exc} (a rank must live until its report is read)"
            raise JobReportError("sender_gone", msg) from exc

    def admit(self, job_id: str, peer: Peer, rank: int = 0) -> None:
        """Let ``peer`` report ``rank`` of ``job_id``, or raise JobReportError saying why not."""
        self.claims.admit(job_id, peer, self._clock.monotonic(), rank)
