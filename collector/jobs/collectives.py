"""Where a hung job's ranks stand in their collectives, from their Flight Recorders.

Each rank that serves PyTorch's Flight Recorder tells, for each process group it is in, the
sequence number of the last collective it entered (``last_enqueued``) and completed, and its last
few collectives by name. In a wedged collective the ranks that got there all entered the same
one; the group's *reference* is the sequence number most of its ranks entered (on a tie, the
highest). Then, per group:

- a rank behind the reference never entered the collective the others wait in: "never entered
  all_reduce #6 of default_pg that 3 ranks wait in (its last: all_reduce #5)";
- a rank at the reference that entered another operation than most did is out of step (a
  *desync*): "entered broadcast #6 of default_pg while 3 ranks entered all_reduce #6";
- a rank whose last completed collective is behind the others' (with the same entered) holds
  the others below Python: "its last completed collective of default_pg is #5, the others' #6".

A rank ahead of the reference waits for the others and is no suspect; so a rank that claims to
be far ahead blames nobody but can only draw attention to itself. What each rank says is its own
word (the agent reads it from the rank), so these suspects are joined with the stacks' and the
processes' (:mod:`collector.jobs.evidence`), never trusted alone to act on a node: a drain needs
the node's hardware evidence. Pure and deterministic: the same standings give the same verdict.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from collector.jobs.stacks import ranks_text

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

MAX_SUSPECTS: Final = 16
TOLD_GROUPS: Final = 3  # groups a verdict spells out


@dataclass(frozen=True, slots=True)
class Standing:
    """One rank's place in one process group's collectives."""

    group: str  # the group's id
    name: str  # its description ("default_pg")
    enqueued: int  # last collective entered (-1: none)
    completed: int  # last completed (-1: none)
    recent: tuple[tuple[int, str], ...]  # (seq, op) of its last collectives, oldest first

    def op_at(self, seq: int) -> str:
        """The operation it entered as ``seq`` ("" when not among its recent ones)."""
        return next((op for s, op in reversed(self.recent) if s == seq), "")

    @property
    def label(self) -> str:
        """The group in sentences: its description, else its id."""
        return self.name or f"group {self.group}"


@dataclass(frozen=True, slots=True)
class CollectiveVerdict:
    """What the Flight Recorders say: the ranks out of step, and one line."""

    suspects: tuple[tuple[int, str], ...]  # (rank, why), why starting "flight recorder: "
    verdict: str
    reporting: tuple[int, ...]  # the ranks whose recorder answered


def _reference(values: Sequence[int]) -> int:
    """The value most ranks share (on a tie, the highest)."""
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], v))


def _named(op: str, seq: int, label: str) -> str:
    return f"{op or 'collective'} #{seq} of {label}"


def _behind(standing: Standing, ref: int, main_op: str, waiting: str) -> str:
    last = _named(standing.op_at(standing.enqueued), standing.enqueued, standing.label)
    if standing.enqueued < 0:
        last = f"none in {standing.label}"
    entered = _named(main_op, ref, standing.label)
    return f"flight recorder: never entered {entered} {waiting} (its last: {last})"


def _judge_group(members: Mapping[int, Standing]) -> tuple[list[tuple[int, str]], str]:
    """(suspects, a line) of one process group's members, by rank."""
    label = next(iter(members.values())).label
    ref = _reference([s.enqueued for s in members.values()])
    at_ref = {r: s for r, s in members.items() if s.enqueued == ref}
    ops = Counter(op for s in at_ref.values() if (op := s.op_at(ref)))
    main_op = max(ops, key=lambda o: (ops[o], o)) if ops else ""
    in_main = [r for r, s in at_ref.items() if s.op_at(ref) in {main_op, ""}]
    waiting = f"that {len(in_main)} ranks wait in" if len(in_main) > 1 else "that rank waits in"
    out: list[tuple[int, str]] = []
    for rank, standing in sorted(members.items()):
        other = standing.op_at(ref)
        if standing.enqueued < ref:
            out.append((rank, _behind(standing, ref, main_op, waiting)))
        elif standing.enqueued == ref and other not in {main_op, ""}:
            why = (
                f"flight recorder: entered {_named(other, ref, label)} while "
                f"{len(in_main)} ranks entered {main_op} #{ref} (out of step)"
            )
            out.append((rank, why))
    if not out:
        done = _reference([s.completed for s in at_ref.values()])
        said = f"flight recorder: its last completed collective of {label} is"
        out = [
            (rank, f"{said} #{standing.completed}, the others' #{done}")
            for rank, standing in sorted(at_ref.items())
            if standing.completed < done
        ]
    if out:
        told = ", ".join(str(r) for r, _ in out[:8])
        line = f"{label}: {'rank' if len(out) == 1 else 'ranks'} {told} out of step at #{ref}"
        return out, line
    return [], f"{label}: every rank entered {_named(main_op, ref, label)}"


def _verdict(suspects: dict[int, str], blamed: list[str], calm: list[str]) -> str:
    if suspects:
        rank, why = next(iter(suspects.items()))
        more = f" ({'; '.join(blamed[1:TOLD_GROUPS])})" if len(blamed) > 1 else ""
        verdict = f"rank {rank} {why.removeprefix('flight recorder: ')}{more}"
        if len(suspects) > 1:
            verdict = f"{ranks_text(sorted(suspects))} out of step: {verdict}"
        return verdict
    if calm:
        return f"the Flight Recorders show no rank out of step ({calm[0]})"
    return "the Flight Recorders share no process group"


def localise_collectives(standings: Mapping[int, Sequence[Standing]]) -> CollectiveVerdict | None:
    """The ranks out of step in any group of two or more; None when no recorder answered."""
    reporting = tuple(sorted(r for r, groups in standings.items() if groups))
    if not reporting:
        return None
    by_group: dict[str, dict[int, Standing]] = {}
    for rank in reporting:
        for standing in standings[rank]:
            by_group.setdefault(standing.group, {})[rank] = standing
    suspects: dict[int, str] = {}
    blamed: list[str] = []
    calm: list[str] = []
    for group in sorted(by_group):
        members = by_group[group]
        if len(members) < 2:  # noqa: PLR2004 - one rank has nobody to be out of step with
            continue
        found, line = _judge_group(members)
        for rank, why in found:
            suspects.setdefault(rank, why)
        (blamed if found else calm).append(line)
    told = tuple(sorted(suspects.items()))[:MAX_SUSPECTS]
    return CollectiveVerdict(told, _verdict(suspects, blamed, calm), reporting)
