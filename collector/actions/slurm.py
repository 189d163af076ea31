"""Drain and resume Slurm nodes through ``scontrol``, the way NHC does.

Every reason fleetwatch writes starts with a prefix (``"fleetwatch:"``), and the prefix is how
fleetwatch knows a drain is its own (NHC's ``node-mark-offline``/``node-mark-online`` convention):

- ``drain`` leaves alone any node that already carries a reason that is not ours (drained, down
  or failed by a person or by Slurm itself): a human's reason is never overwritten. A node
  already drained with our prefix is not touched again.
- ``resume`` resumes only nodes that are drained or draining with a reason that starts with our
  prefix; anything else is refused and reported, never forced.

Every argument is checked before scontrol runs (`SlurmRefusedError` otherwise): the node is one
node name (never a hostlist expression such as ``n[1-4]`` or ``a,b``, an option, or one of the
names Slurm reserves, ``ALL`` and ``DEFAULT`` in any case: ``scontrol update NodeName=ALL``
changes every node), and the reason, once sanitised, holds only
letters, digits, spaces and ``. _ : / ( ) , -``. Reasons are read back by people and by scripts
(NHC's are shell functions), so no quote, ``$``, ``;``, ``|``, ``&``, backquote, glob or
redirection character ever reaches one. fleetwatch builds its reasons from its own words and
checked names (:mod:`collector.actions.guards`), so a refusal here means a bug upstream.

``scontrol`` runs as an argument list (never through a shell) under a timeout, with
``SLURM_TIME_FORMAT=standard`` so that the reason's ``[user@time]`` stamp has one known form.
What it prints is read by the pure function `parse_node_line`. Reading the state and updating it
are two commands, so a person may drain a node between them; Slurm offers no compare-and-set.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import subprocess
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Final

import structlog

from collector.exceptions import CollectorError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DEFAULT_REASON_PREFIX",
    "MAX_REASON_CHARS",
    "RESERVED_NODE_NAMES",
    "DrainOutcome",
    "DrainResult",
    "ResumeOutcome",
    "ResumeResult",
    "SlurmError",
    "SlurmNodeState",
    "SlurmNodes",
    "SlurmRefusedError",
    "is_single_node_name",
    "parse_node_line",
    "run_scontrol",
    "sanitize_reason",
]

log = structlog.get_logger("collector.actions.slurm")

DEFAULT_REASON_PREFIX: Final = "fleetwatch:"
MAX_REASON_CHARS: Final = 200
_MAX_PREFIX_CHARS: Final = 40
_ERROR_OUTPUT_CHARS: Final = 500
_ELLIPSIS: Final = "..."

# One Slurm node, never a hostlist expression ("node-[01-04]", "a,b") or an option ("-x").
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
# Names Slurm gives a meaning of its own, compared without case: NodeName=ALL is every node,
# NodeName=DEFAULT sets the defaults of the nodes declared after it in slurm.conf.
RESERVED_NODE_NAMES: Final = frozenset({"all", "default"})
_NAME_FIELD = re.compile(r"NodeName=(\S+)")
_STATE_FIELD = re.compile(r"(?:^|\s)State=(\S+)")
_REASON_FIELD: Final = " Reason="
# What a reason we write may hold (after sanitize_reason): no shell or Slurm syntax at all.
_REASON_TEXT = re.compile(r"[A-Za-z0-9 ._:/(),-]+")
_REASON_CHARS: Final = "letters, digits, spaces and . _ : / ( ) , -"
# Slurm appends " [user@time]" to the reason; SLURM_TIME_FORMAT=standard makes time ISO 8601.
_REASON_STAMP = re.compile(r" \[[^\[\]\s@]+@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\]")
# Free-text fields that scontrol prints after Reason (22.05); a comment may contain "Reason=".
_AFTER_REASON: Final = (" Comment=", " Extra=")
_BUSY: Final = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


class SlurmError(CollectorError):
    """``scontrol`` could not be run, timed out, failed, or printed something unreadable.

    Attributes:
        node: the node the command was about ("" for a job's command that names none).
        stderr: what scontrol printed on failure (stdout when stderr was empty), trimmed.
        job: the Slurm job the command was about ("" for a node's).
    """

    def __init__(self, message: str, *, node: str = "", stderr: str = "", job: str = "") -> None:
        """Keep the node or job and scontrol's own words next to the message."""
        super().__init__(message)
        self.node = node
        self.stderr = stderr
        self.job = job


class SlurmRefusedError(SlurmError):
    """An argument failed its check, so scontrol was not run at all."""


class DrainOutcome(StrEnum):
    """What `SlurmNodes.drain` did."""

    DRAINED = "drained"
    """We ran ``scontrol update ... State=DRAIN``."""
    ALREADY_DRAINED = "already_drained"
    """The node was already drained or draining with our prefix; nothing was run."""
    HELD_BY_OTHER = "held_by_other"
    """The node carries someone else's reason; it was left alone."""


class ResumeOutcome(StrEnum):
    """What `SlurmNodes.resume` did, or why it refused."""

    RESUMED = "resumed"
    """We ran ``scontrol update ... State=RESUME``."""
    NOT_DRAINED = "not_drained"
    """The node is neither drained nor draining; there is nothing to resume."""
    NOT_OURS = "not_ours"
    """The drain's reason is not ours (a person's or Slurm's); only its owner may resume it."""


@dataclass(frozen=True, slots=True)
class SlurmNodeState:
    """One node as ``scontrol show node`` describes it.

    Attributes:
        name: the Slurm node name.
        states: the base state and its flags in upper case, e.g. ``{"IDLE", "DRAIN"}``; a ``*``
            suffix (not responding) becomes ``"NOT_RESPONDING"``.
        reason: the reason text without Slurm's ``[user@time]`` stamp, ``None`` when unset.
    """

    name: str
    states: frozenset[str]
    reason: str | None

    @property
    def draining(self) -> bool:
        """The node is marked to drain but still runs (or is finishing) jobs."""
        return "DRAINING" in self.states or (
            "DRAIN" in self.states and not self.states.isdisjoint(_BUSY)
        )

    @property
    def drained(self) -> bool:
        """The node is marked to drain and runs no jobs."""
        return "DRAINED" in self.states or ("DRAIN" in self.states and not self.draining)

    @property
    def responding(self) -> bool:
        """The controller hears from the node's slurmd."""
        return "NOT_RESPONDING" not in self.states


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What `SlurmNodes.drain` found and did; the caller journals it.

    Attributes:
        node: the node.
        outcome: drained now, already drained by us, or held by someone else.
        reason: the sanitised reason we asked for (with the prefix).
        state: the node after the call; ``state.reason`` is the reason Slurm now shows.
    """

    node: str
    outcome: DrainOutcome
    reason: str
    state: SlurmNodeState

    @property
    def changed(self) -> bool:
        """An ``scontrol update`` was run."""
        return self.outcome is DrainOutcome.DRAINED


@dataclass(frozen=True, slots=True)
class ResumeResult:
    """What `SlurmNodes.resume` found and did; the caller journals it.

    Attributes:
        node: the node.
        outcome: resumed, or the reason for refusing.
        state: the node after the call (before it, when refused).
    """

    node: str
    outcome: ResumeOutcome
    state: SlurmNodeState

    @property
    def changed(self) -> bool:
        """An ``scontrol update`` was run."""
        return self.outcome is ResumeOutcome.RESUMED


def sanitize_reason(text: str, prefix: str, limit: int = MAX_REASON_CHARS) -> str:
    """Return ``text`` as a one-line Slurm reason that starts with ``prefix``.

    Control and other unprintable characters (newlines, tabs, NUL, bidi marks) become spaces,
    runs of white space collapse to one, double quotes become single quotes (scontrol strips a
    quote at either end of the value), and the result is cut to ``limit`` characters with an
    ellipsis. A ``text`` that already starts with ``prefix`` does not get it twice.

    Args:
        text: the reason, as a rule or a person wrote it.
        prefix: the mark of our reasons, e.g. ``"fleetwatch:"``.
        limit: the longest reason returned, prefix included.
    """
    printable = "".join(ch if ch.isprintable() else " " for ch in text).replace('"', "'")
    body = " ".join(printable.split())
    if body.startswith(prefix):
        body = body[len(prefix) :].lstrip()
    reason = f"{prefix} {body}" if body else prefix
    if len(reason) > limit:
        reason = reason[: limit - len(_ELLIPSIS)].rstrip() + _ELLIPSIS
    return reason


def parse_node_line(line: str) -> SlurmNodeState:
    """Read one line of ``scontrol show node -o`` (Slurm 22.05 and later).

    Raises:
        ValueError: the line has no ``NodeName=`` or no ``State=`` field.
    """
    name = _NAME_FIELD.match(line)
    state = _STATE_FIELD.search(line)
    if name is None or state is None:
        msg = f"not a node line: {line[:200]!r}"
        raise ValueError(msg)
    return SlurmNodeState(
        name=name.group(1),
        states=_parse_states(state.group(1)),
        reason=_parse_reason(line[state.end() :]),
    )


def _parse_states(field: str) -> frozenset[str]:
    """``IDLE+DRAIN`` -> {IDLE, DRAIN}; ``DOWN*`` -> {DOWN, NOT_RESPONDING}."""
    states: set[str] = set()
    for word in field.upper().split("+"):
        if word.endswith("*"):
            states.add("NOT_RESPONDING")
        if stripped := word.rstrip("*"):
            states.add(stripped)
    return frozenset(states)


def _parse_reason(rest: str) -> str | None:
    """Find the reason in what follows ``State=``; scontrol prints it before Comment and Extra."""
    start = rest.find(_REASON_FIELD)
    if start < 0:
        return None
    if any(0 <= rest.find(field) < start for field in _AFTER_REASON):
        return None  # the first "Reason=" is inside a comment: the node has no reason
    body = rest[start + len(_REASON_FIELD) :]
    stamp = _REASON_STAMP.search(body)
    if stamp is not None:
        end = stamp.start()
    else:  # a reason without a stamp (set in slurm.conf) ends where the next free field starts
        ends = [i for i in (body.find(field) for field in _AFTER_REASON) if i >= 0]
        end = min(ends, default=len(body))
    return body[:end].rstrip() or None


def _trim(output: bytes) -> str:
    text = output.decode(errors="replace").strip()
    return text if len(text) <= _ERROR_OUTPUT_CHARS else text[:_ERROR_OUTPUT_CHARS] + _ELLIPSIS


class SlurmNodes:
    """Reads, drains and resumes Slurm nodes with the ``scontrol`` command.

    Every method is a coroutine that runs ``scontrol`` as a child process; none blocks the loop.
    """

    __slots__ = ("_env", "_prefix", "_scontrol", "_timeout_s")

    def __init__(
        self,
        scontrol: str = "scontrol",
        env: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        reason_prefix: str = DEFAULT_REASON_PREFIX,
    ) -> None:
        """Check the options now, so a bad configuration fails at start-up.

        Args:
            scontrol: the command, looked up on ``PATH`` unless it is a path.
            env: variables laid over the collector's environment for scontrol, e.g.
                ``{"SLURM_CONF": "/etc/slurm/other.conf"}``.
            timeout_s: how long one scontrol call may take before it is killed.
            reason_prefix: the mark of fleetwatch's reasons; nodes whose reason starts with
                it are ours to resume.

        Raises:
            ValueError: an option is empty or out of range; the message names it.
        """
        if not scontrol:
            raise ValueError("scontrol must name a command or a path")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            msg = f"timeout_s must be a positive number of seconds, got {timeout_s}"
            raise ValueError(msg)
        if not (
            0 < len(reason_prefix) <= _MAX_PREFIX_CHARS
            and _REASON_TEXT.fullmatch(reason_prefix)
            and reason_prefix == reason_prefix.strip()
        ):
            msg = (
                f"reason_prefix must be 1 to {_MAX_PREFIX_CHARS} of {_REASON_CHARS} without "
                f"outer spaces, got {reason_prefix!r}"
            )
            raise ValueError(msg)
        self._scontrol = scontrol
        self._env = {**(env or {}), "SLURM_TIME_FORMAT": "standard"}
        self._timeout_s = timeout_s
        self._prefix = reason_prefix

    @property
    def reason_prefix(self) -> str:
        """The mark of fleetwatch's reasons."""
        return self._prefix

    def reason_for(self, text: str) -> str:
        """Return the reason `drain` would write for ``text`` (prefixed and sanitised)."""
        return sanitize_reason(text, self._prefix)

    def is_ours(self, state: SlurmNodeState) -> bool:
        """The node's reason was written by fleetwatch (it starts with our prefix)."""
        return state.reason is not None and state.reason.startswith(self._prefix)

    async def state(self, node: str) -> SlurmNodeState:
        """Return the node's state and reason, from ``scontrol show node -o <node>``.

        Raises:
            SlurmError: scontrol failed (unknown node included) or printed no such node.
        """
        _check_node_name(node)
        output = await self._run(node, "show", "node", "-o", node)
        for line in output.splitlines():
            if line.startswith(f"NodeName={node} "):
                try:
                    return parse_node_line(line)
                except ValueError as exc:
                    msg = f"cannot read the state of node {node!r}: {exc}"
                    raise SlurmError(msg, node=node) from exc
        msg = f"scontrol show node did not describe node {node!r}: {output[:200]!r}"
        raise SlurmError(msg, node=node)

    async def drain(self, node: str, reason: str) -> DrainResult:
        """Drain ``node`` with ``reason`` (prefixed, sanitised), unless it is already out.

        A node already drained or draining with our prefix is left as it is (its first reason
        stays); a node with any other reason is left alone and reported as held by someone else.

        Raises:
            SlurmRefusedError: the node name or the sanitised reason failed its check; nothing
                was run.
            SlurmError: scontrol failed, timed out or is missing; the message names the node.
        """
        _check_node_name(node)
        wanted = self.reason_for(reason)
        if not _REASON_TEXT.fullmatch(wanted):
            msg = f"refusing reason {wanted[:80]!r} for node {node!r}: only {_REASON_CHARS}"
            log.error("slurm_argument_refused", node=node, argument="reason", error=msg)
            raise SlurmRefusedError(msg, node=node)
        before = await self.state(node)
        outcome = self._skip_drain(before)
        if outcome is not None:
            log.info(
                "slurm_drain_skipped",
                node=node,
                outcome=str(outcome),
                slurm_reason=before.reason,
                states=sorted(before.states),
            )
            return DrainResult(node, outcome, wanted, before)
        await self._run(node, "update", f"NodeName={node}", "State=DRAIN", f"Reason={wanted}")
        after = await self.state(node)
        log.warning("slurm_node_drained", node=node, reason=wanted, states=sorted(after.states))
        return DrainResult(node, DrainOutcome.DRAINED, wanted, after)

    def _skip_drain(self, before: SlurmNodeState) -> DrainOutcome | None:
        """Why a drain must not run on a node in ``before``, or ``None`` when it may."""
        out_of_service = before.drained or before.draining
        if self.is_ours(before):
            return DrainOutcome.ALREADY_DRAINED if out_of_service else None
        # Someone else's reason (a person's, or Slurm's on a down node), or a drain without
        # any reason (only slurm.conf can set one): never ours to rewrite.
        if before.reason is not None or out_of_service:
            return DrainOutcome.HELD_BY_OTHER
        return None

    async def resume(self, node: str) -> ResumeResult:
        """Resume ``node`` if it is drained or draining with our prefix; otherwise refuse.

        Raises:
            SlurmRefusedError: the node name failed its check; nothing was run.
            SlurmError: scontrol failed, timed out or is missing; the message names the node.
        """
        _check_node_name(node)
        before = await self.state(node)
        refusal: ResumeOutcome | None = None
        if not (before.drained or before.draining):
            refusal = ResumeOutcome.NOT_DRAINED
        elif not self.is_ours(before):
            refusal = ResumeOutcome.NOT_OURS
        if refusal is not None:
            log.info(
                "slurm_resume_refused",
                node=node,
                outcome=str(refusal),
                slurm_reason=before.reason,
                states=sorted(before.states),
            )
            return ResumeResult(node, refusal, before)
        await self._run(node, "update", f"NodeName={node}", "State=RESUME")
        after = await self.state(node)
        log.warning(
            "slurm_node_resumed", node=node, slurm_reason=before.reason, states=sorted(after.states)
        )
        return ResumeResult(node, ResumeOutcome.RESUMED, after)

    async def _run(self, node: str, *args: str) -> str:
        """Run scontrol with ``args``; return its stdout, or raise `SlurmError` naming ``node``."""
        return await run_scontrol(
            self._scontrol, args, env=self._env, timeout_s=self._timeout_s, node=node
        )


async def run_scontrol(  # noqa: PLR0913 - the command, its arguments, and whom it is about
    scontrol: str,
    args: tuple[str, ...],
    *,
    env: Mapping[str, str],
    timeout_s: float,
    node: str = "",
    job: str = "",
) -> str:
    """Run ``scontrol *args`` (no shell, under ``timeout_s``); return its stdout.

    ``env`` is laid over the collector's environment. ``node`` or ``job`` says whom the command
    is about, in the message and on the error.

    Raises:
        SlurmError: scontrol could not start, timed out or exited non-zero; the message names
            the node or job and carries what scontrol said.
    """
    what = f"scontrol {args[0]}"
    about = f"job {job!r}" if job else f"node {node!r}"
    fields = {"node": node, "job": job} if job else {"node": node}
    try:
        proc = await asyncio.create_subprocess_exec(
            scontrol,
            *args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **env},
        )
    except OSError as exc:
        msg = (
            f"{what} for {about} could not start {scontrol!r}: {exc.strerror}"
            " (is slurm-client installed and scontrol on PATH?)"
        )
        log.error("slurm_command_failed", **fields, args=list(args), error=msg)
        raise SlurmError(msg, node=node, job=job) from exc
    try:
        async with asyncio.timeout(timeout_s):
            stdout, stderr = await proc.communicate()
    except TimeoutError as exc:
        msg = f"{what} for {about} timed out after {timeout_s:g} s"
        log.error("slurm_command_failed", **fields, args=list(args), error=msg)
        raise SlurmError(msg, node=node, job=job) from exc
    finally:
        if proc.returncode is None:  # timed out or cancelled: leave no child behind
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        said = _trim(stderr) or _trim(stdout)
        msg = f"{what} for {about} failed (exit {proc.returncode}): {said or 'no output'}"
        log.error("slurm_command_failed", **fields, args=list(args), error=msg)
        raise SlurmError(msg, node=node, stderr=said, job=job)
    return stdout.decode(errors="replace")


def is_single_node_name(node: str) -> bool:
    """Tell whether ``node`` can only ever name one Slurm node.

    False for a hostlist expression (brackets, commas, ``*``, ``?``, spaces), anything that
    looks like an option, and the names Slurm reserves (``ALL``, ``DEFAULT``, in any case).
    """
    return _NODE_NAME.fullmatch(node) is not None and node.lower() not in RESERVED_NODE_NAMES


def _check_node_name(node: str) -> None:
    """Refuse anything but one node name: scontrol would expand "a,b", "n[1-9]" or "ALL"."""
    if not is_single_node_name(node):
        msg = f"refusing node name {node[:80]!r}: not a single Slurm node name"
        log.error("slurm_argument_refused", node=node[:80], argument="node", error=msg)
        raise SlurmRefusedError(msg, node=node)
