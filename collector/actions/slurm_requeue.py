"""Requeue a Slurm batch job through ``scontrol``, so that it restarts without one node.

For job J and node N, :meth:`SlurmJobs.requeue` runs, each as an argument list under a timeout:

1. ``scontrol show job -o J``: J must be one batch job (``BatchFlag=1``) that Slurm lets be
   requeued (``Requeue=1``: ``JobRequeue=1`` in slurm.conf, Slurm's default, or ``--requeue``),
   now ``RUNNING`` or ``SUSPENDED``, must run on N (``NodeList``: a job elsewhere is not the
   one to blame on N), and must not ask for N by name (``ReqNodeList``): excluded, it could
   never start again. Anything else is refused, and nothing runs.
2. ``scontrol requeuehold J``: J goes back to pending, held. Slurm changes ``ExcNodeList`` only
   while a job is pending ("Job is no longer pending execution" otherwise), and held it cannot
   start on N before step 3.
3. ``scontrol update JobId=J ExcNodeList=...``: what J excluded already, as Slurm printed it
   (hostlists such as ``node-[01-03]`` included), with ``,N`` appended; skipped when it
   already names N.
4. ``scontrol release J``: J may start again, on any node but N. Slurm starts a requeued batch
   job no sooner than about two minutes after the requeue (``Reason=BeginTime``).

A step that fails after step 2 never leaves J held without a word: J is released (a failed
exclusion too; the rule that requeues drains N first), and the error says what happened and
what to run when the release failed as well.

Every argument is checked before scontrol runs (`SlurmRefusedError` otherwise): J is a plain
Slurm job id (``123``, an array task ``123_4``, a het job component ``123+1``), N one node name
(never a hostlist), and the ``ExcNodeList`` written back holds only hostlist characters. What
scontrol prints is read by the pure function `parse_job_record`. A job name or comment is free
text that may hold ``JobState=...`` (Slurm prints it as given, line breaks included): a record
in which a field we read appears more than once is refused, never guessed at.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Final

import structlog

from collector.actions.slurm import (
    SlurmError,
    SlurmRefusedError,
    is_single_node_name,
    run_scontrol,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "HELD_REASONS",
    "REQUEUEABLE_STATES",
    "RequeueOutcome",
    "RequeueResult",
    "SlurmJobState",
    "SlurmJobs",
    "excluded_with",
    "hostlist_covers",
    "is_slurm_job_id",
    "parse_job_record",
]

log = structlog.get_logger("collector.actions.slurm")

# 123, an array task 123_4, a het job component 123+1; never a range, a list or an option.
_JOB_ID = re.compile(r"(?P<id>[0-9]{1,20})(?:_(?P<task>[0-9]{1,10})|\+(?P<offset>[0-9]{1,10}))?")
_JOB_ID_FORM: Final = "a Slurm job id (digits; 123_4 for an array task, 123+1 for a het component)"
# What a node list we write back may hold: Slurm's hostlist syntax, nothing a shell or Slurm
# reads as more (no spaces, no '=', no quotes).
_HOSTLIST = re.compile(r"[A-Za-z0-9._,\[\]-]{1,4096}")
_FIELDS: Final = (
    "JobId",
    "JobState",
    "Reason",
    "Priority",
    "Requeue",
    "Restarts",
    "BatchFlag",
    "ReqNodeList",
    "ExcNodeList",
    "NodeList",
)
_OPTIONAL: Final = frozenset({"ArrayJobId", "ArrayTaskId", "HetJobId", "HetJobOffset"})
_NULL: Final = "(null)"
_BRACKETS = re.compile(r"(?P<prefix>[^\[\]]*)\[(?P<ranges>[0-9,-]+)\](?P<suffix>[^\[\]]*)")

REQUEUEABLE_STATES: Final = frozenset({"RUNNING", "SUSPENDED"})
# Reasons Slurm gives a held job (by a user, an admin, or requeuehold).
HELD_REASONS: Final = frozenset({"JobHeldUser", "JobHeldAdmin", "job_requeued_in_held_state"})


class RequeueOutcome(StrEnum):
    """What `SlurmJobs.requeue` did, or why it ran nothing."""

    REQUEUED = "requeued"
    """requeuehold, the exclusion (unless not asked for or already there), release."""
    NOT_RUNNING = "not_running"
    """The job is not RUNNING or SUSPENDED (pending, ending or ended): nothing to requeue."""
    NOT_REQUEUEABLE = "not_requeueable"
    """``Requeue=0``: submitted with ``--no-requeue``, or ``JobRequeue=0`` and no ``--requeue``."""
    NOT_BATCH = "not_batch"
    """``BatchFlag=0`` (salloc, srun): Slurm requeues batch jobs only."""
    ASKS_FOR_NODE = "asks_for_node"
    """The job asks for the node by name (``ReqNodeList``): excluded, it would never start."""
    NOT_ON_NODE = "not_on_node"
    """The job does not run on the node (``NodeList``): the rank there is not this job's."""


@dataclass(frozen=True, slots=True)
class SlurmJobState:
    """One job as ``scontrol show job -o`` describes it (the fields a requeue reads).

    Attributes:
        job_id: ``JobId`` (an array task's own id, not ``123_4``).
        state: ``JobState``, e.g. ``RUNNING``.
        reason: the first word of ``Reason`` (``None``, ``JobHeldUser``, ``BeginTime``, ...).
        priority: ``Priority`` (0 while held, and while suspended).
        requeue: ``Requeue=1``: Slurm lets the job be requeued.
        restarts: ``Restarts``, how many times the job was requeued.
        batch: ``BatchFlag=1``: a batch job (sbatch).
        required: ``ReqNodeList`` as printed, ``None`` when unset.
        excluded: ``ExcNodeList`` as printed (a hostlist), ``None`` when unset.
        nodes: ``NodeList``, the nodes it runs on, ``None`` when it runs on none.
    """

    job_id: str
    state: str
    reason: str
    priority: int
    requeue: bool
    restarts: int
    batch: bool
    required: str | None
    excluded: str | None
    nodes: str | None

    @property
    def held(self) -> bool:
        """The job waits for a release (``scontrol release``) before it may start."""
        return self.reason in HELD_REASONS or (self.state == "PENDING" and self.priority == 0)


@dataclass(frozen=True, slots=True)
class RequeueResult:
    """What `SlurmJobs.requeue` found and did; the caller journals it.

    Attributes:
        job: the job id asked for.
        outcome: requeued, or why nothing ran.
        before: the job as read first.
        node: the node kept off (``None``: none asked for).
        excluded: the ``ExcNodeList`` written (``None``: no update ran).
        after: the job once released (``None`` when not requeued, or it could not be read).
    """

    job: str
    outcome: RequeueOutcome
    before: SlurmJobState
    node: str | None = None
    excluded: str | None = None
    after: SlurmJobState | None = None


def is_slurm_job_id(job: str) -> bool:
    """Tell whether ``job`` is one plain Slurm job id: ``123``, ``123_4`` or ``123+1``."""
    return _JOB_ID.fullmatch(job) is not None


def _fields(record: str) -> dict[str, str]:
    """The ``Key=value`` words of a record that a requeue reads.

    ValueError names a field that is not there exactly once (a job name or comment may hold
    field names, line breaks included).
    """
    found: dict[str, list[str]] = {}
    for key in (*_FIELDS, *_OPTIONAL):
        found[key] = re.findall(rf"(?:^|\s){re.escape(key)}=(\S*)", record)
    twice = sorted(key for key, values in found.items() if len(values) > 1)
    if twice:
        msg = (
            f"fields {', '.join(twice)} appear more than once (an array's tasks, or a job name "
            "or comment that holds Slurm's field names)"
        )
        raise ValueError(msg)
    missing = [key for key in _FIELDS if not found[key]]
    if missing:
        msg = f"not a job record: no {', '.join(missing)} in {record[:200]!r}"
        raise ValueError(msg)
    return {key: values[0] for key, values in found.items() if values}


def _optional(value: str) -> str | None:
    return None if value in ("", _NULL) else value


def parse_job_record(record: str) -> SlurmJobState:
    """Read the output of ``scontrol show job -o <id>`` (Slurm 22.05) for one job.

    Raises:
        ValueError: a field is missing or not a number where one belongs, or a field we read
            appears more than once (the id of an array's parent, which prints every task, or a
            job name or comment that spells field names): nothing is guessed.
    """
    fields = _fields(record)
    numbers = {}
    for key in ("Priority", "Requeue", "Restarts", "BatchFlag"):
        if not fields[key].isdigit():
            msg = f"{key}={fields[key][:40]!r} is not a number"
            raise ValueError(msg)
        numbers[key] = int(fields[key])
    return SlurmJobState(
        job_id=fields["JobId"],
        state=fields["JobState"],
        reason=fields["Reason"],
        priority=numbers["Priority"],
        requeue=numbers["Requeue"] == 1,
        restarts=numbers["Restarts"],
        batch=numbers["BatchFlag"] == 1,
        required=_optional(fields["ReqNodeList"]),
        excluded=_optional(fields["ExcNodeList"]),
        nodes=_optional(fields["NodeList"]),
    )


def _top_level(hostlist: str) -> list[str]:
    """Split a hostlist at the commas outside brackets: ``a,b[1,3]`` -> ``a``, ``b[1,3]``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(hostlist):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(hostlist[start:i])
            start = i + 1
    parts.append(hostlist[start:])
    return [p for p in parts if p]


def _in_range(number: str, bounds: str) -> bool:
    """``number`` (digits) is within ``bounds`` (``7`` or ``01-03``), padding as Slurm pads."""
    low, _, high = bounds.partition("-")
    high = high or low
    if not (low.isdigit() and high.isdigit()) or not int(low) <= int(number) <= int(high):
        return False
    if low.startswith("0") or high.startswith("0"):  # zero-padded: the width must match
        return len(number) == len(low)
    return not number.startswith("0") or number == "0"


def hostlist_covers(hostlist: str, node: str) -> bool:
    """Tell whether the Slurm hostlist ``hostlist`` names ``node``.

    Reads plain names and one bracket group per name (``node-[01-03,07]``, ``gpu[1-8]-ib``);
    a name with more than one bracket group is taken as not naming ``node``.
    """
    for part in _top_level(hostlist):
        if part == node:
            return True
        match = _BRACKETS.fullmatch(part)
        if match is None:
            continue
        prefix, suffix = match.group("prefix"), match.group("suffix")
        if not (node.startswith(prefix) and node.endswith(suffix)):
            continue
        number = node[len(prefix) : len(node) - len(suffix)]
        if number.isdigit() and any(_in_range(number, b) for b in match.group("ranges").split(",")):
            return True
    return False


def excluded_with(excluded: str | None, node: str) -> str | None:
    """The ``ExcNodeList`` that adds ``node`` to ``excluded``; ``None`` when it names it already.

    What the job excluded is kept as Slurm printed it (a hostlist stays a hostlist); ``node``
    is appended with a comma.
    """
    if excluded is None:
        return node
    if hostlist_covers(excluded, node):
        return None
    return f"{excluded},{node}"


def _check_job_id(job: str) -> None:
    if not is_slurm_job_id(job):
        msg = f"refusing job id {job[:80]!r}: not {_JOB_ID_FORM}"
        log.error("slurm_argument_refused", job=job[:80], argument="job", error=msg)
        raise SlurmRefusedError(msg, job=job)


def _check_node(job: str, node: str) -> None:
    if not is_single_node_name(node):
        msg = f"refusing node name {node[:80]!r} for job {job}: not a single Slurm node name"
        log.error("slurm_argument_refused", job=job, node=node[:80], argument="node", error=msg)
        raise SlurmRefusedError(msg, node=node, job=job)


def _same_job(job: str, record: str, state: SlurmJobState) -> bool:
    """The record is the one asked for (an array task's or het component's ids included)."""
    match = _JOB_ID.fullmatch(job)
    if match is None:
        return False
    task, offset = match.group("task"), match.group("offset")
    if task is not None:
        want = {"ArrayJobId": match.group("id"), "ArrayTaskId": task}
    elif offset is not None:
        want = {"HetJobId": match.group("id"), "HetJobOffset": offset}
    else:
        return state.job_id == job
    have = _fields(record)
    return all(have.get(key) == value for key, value in want.items())


class SlurmJobs:
    """Reads and requeues Slurm jobs with the ``scontrol`` command.

    Every method is a coroutine that runs ``scontrol`` as a child process; none blocks the loop.
    """

    __slots__ = ("_env", "_scontrol", "_timeout_s")

    def __init__(
        self,
        scontrol: str = "scontrol",
        env: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        """Check the options now, so a bad configuration fails at start-up.

        Args:
            scontrol: the command, looked up on ``PATH`` unless it is a path.
            env: variables laid over the collector's environment for scontrol, e.g.
                ``{"SLURM_CONF": "/etc/slurm/other.conf"}``.
            timeout_s: how long one scontrol call may take before it is killed.

        Raises:
            ValueError: an option is empty or out of range; the message names it.
        """
        if not scontrol:
            raise ValueError("scontrol must name a command or a path")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            msg = f"timeout_s must be a positive number of seconds, got {timeout_s}"
            raise ValueError(msg)
        self._scontrol = scontrol
        self._env = {**(env or {}), "SLURM_TIME_FORMAT": "standard"}
        self._timeout_s = timeout_s

    async def _run(self, job: str, *args: str) -> str:
        return await run_scontrol(
            self._scontrol, args, env=self._env, timeout_s=self._timeout_s, job=job
        )

    async def state(self, job: str) -> SlurmJobState:
        """Return the job as ``scontrol show job -o <job>`` describes it.

        Raises:
            SlurmRefusedError: ``job`` is not a plain Slurm job id; nothing was run.
            SlurmError: scontrol failed (an unknown job included), or printed a record that is
                not that one job's, or one that cannot be read unambiguously.
        """
        _check_job_id(job)
        output = (await self._run(job, "show", "job", "-o", job)).strip()
        try:
            state = parse_job_record(output)
        except ValueError as exc:
            msg = f"cannot read job {job}: {exc}"
            raise SlurmError(msg, job=job) from exc
        if not _same_job(job, output, state):
            msg = f"scontrol show job {job} described another job: {output[:200]!r}"
            raise SlurmError(msg, job=job)
        return state

    def _refusal(self, before: SlurmJobState, node: str | None) -> RequeueOutcome | None:
        if not before.batch:
            return RequeueOutcome.NOT_BATCH
        if before.state not in REQUEUEABLE_STATES:
            return RequeueOutcome.NOT_RUNNING
        if not before.requeue:
            return RequeueOutcome.NOT_REQUEUEABLE
        if node is not None and not (before.nodes and hostlist_covers(before.nodes, node)):
            return RequeueOutcome.NOT_ON_NODE
        if node is not None and before.required and hostlist_covers(before.required, node):
            return RequeueOutcome.ASKS_FOR_NODE
        return None

    async def requeue(self, job: str, node: str | None) -> RequeueResult:
        """Requeue ``job`` held, add ``node`` to what it excludes (None: no node), release it.

        Raises:
            SlurmRefusedError: the job id, the node or the node list to write failed its check;
                nothing was run.
            SlurmError: a step failed; the message says which, and whether the job was released
                (the job is never left held without saying so).
        """
        _check_job_id(job)
        if node is not None:
            _check_node(job, node)
        before = await self.state(job)
        refusal = self._refusal(before, node)
        if refusal is not None:
            log.info(
                "slurm_requeue_refused",
                job=job,
                outcome=str(refusal),
                state=before.state,
                requeue=before.requeue,
                batch=before.batch,
            )
            return RequeueResult(job, refusal, before, node)
        wanted = excluded_with(before.excluded, node) if node is not None else None
        if wanted is not None and not _HOSTLIST.fullmatch(wanted):
            msg = f"refusing ExcNodeList {wanted[:80]!r} for job {job}: not a Slurm hostlist"
            log.error("slurm_argument_refused", job=job, argument="ExcNodeList", error=msg)
            raise SlurmRefusedError(msg, node=node or "", job=job)
        await self._run(job, "requeuehold", job)
        log.warning("slurm_job_requeued_held", job=job, restarts=before.restarts)
        if wanted is not None:
            await self._exclude(job, wanted)
        kept = f" with {node} excluded" if node else ""
        await self._release(job, f"job {job} was requeued{kept}")
        try:
            after: SlurmJobState | None = await self.state(job)
        except SlurmError:
            after = None  # it ran; the journal says so even when the read-back failed
        log.warning(
            "slurm_job_requeued",
            job=job,
            node=node,
            excluded=wanted or before.excluded,
            state=after.state if after else None,
        )
        return RequeueResult(job, RequeueOutcome.REQUEUED, before, node, wanted, after)

    async def _exclude(self, job: str, wanted: str) -> None:
        """``ExcNodeList=wanted``; when it fails, release the job and say so."""
        try:
            await self._run(job, "update", f"JobId={job}", f"ExcNodeList={wanted}")
        except SlurmError as exc:
            await self._release(
                job, f"job {job} was requeued held, but setting ExcNodeList={wanted} failed ({exc})"
            )
            msg = (
                f"job {job} was requeued, but setting ExcNodeList={wanted} failed ({exc}); "
                "released, so it may start on any node Slurm allows"
            )
            raise SlurmError(msg, job=job, stderr=exc.stderr) from exc

    async def _release(self, job: str, done: str) -> None:
        """``scontrol release``; when it fails, the error says the job is held and what to run."""
        try:
            await self._run(job, "release", job)
        except SlurmError as exc:
            msg = f"{done}, but releasing it failed ({exc}): it is held; run scontrol release {job}"
            log.error("slurm_job_left_held", job=job, error=msg)
            raise SlurmError(msg, job=job, stderr=exc.stderr) from exc
