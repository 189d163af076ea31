"""Where a hung job's ranks wait, read from their Python stacks, and the ranks that stand out.

Each rank's agent dumps its process's threads (py-spy: frames only, innermost first). A rank's
*signature* is where its main thread waits (else its active thread, else the first with frames):
its innermost :data:`SIGNATURE_FRAMES` frames, leaving out the runtime's own plumbing
(``threading``, ``selectors``, ``queue``, ``asyncio``...), each as ``function@file:line``. The
ranks are grouped by signature:

- the group of the most ranks is the healthy one: in a wedged collective every rank that got
  there waits at the same line, and the ranks elsewhere are the suspects ("rank 2 waits in
  train (train.py:41) while 3 ranks wait in all_reduce (distributed_c10d.py:3252)"); a rank
  that waits in a collective while the most ranks wait outside one waits for them, and is no
  suspect;
- when every rank waits in one place, nobody stands out: "no rank stands out: every rank waits
  in <frame>" (in a collective, what holds it is below Python: the network, a GPU);
- when the largest groups tie (as large, both in a collective or neither), nobody is blamed.

A rank whose dump failed, or that has no frames, has no vote (it is *unknown*). Everything here
is pure, bounded and deterministic: the same dumps give the same groups, verdict and order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

SIGNATURE_FRAMES: Final = 3  # innermost frames of ours that say where a rank waits
MAX_SUSPECTS: Final = 16  # ranks the stacks blame at most (the smallest groups first)
TOLD_GROUPS: Final = 4  # groups a verdict spells out; the rest are counted
TOLD_RANKS: Final = 8  # ranks a verdict lists in one group; the rest are counted
MAIN_THREAD: Final = "MainThread"
# Frames of the runtime's own waiting, not where a program waits (paths end so, "/" separated).
_PLUMBING: Final = (
    "/threading.py",
    "/selectors.py",
    "/queue.py",
    "/concurrent/futures/_base.py",
    "/concurrent/futures/thread.py",
    "/multiprocessing/connection.py",
    "/multiprocessing/synchronize.py",
    "/multiprocessing/queues.py",
)
_PLUMBING_DIRS: Final = ("/asyncio/",)
# A frame in a file under these is a collective's (torch.distributed, c10d, NCCL, gloo).
_COLLECTIVE_FILES: Final = ("torch/distributed/", "c10d", "nccl", "gloo", "deepspeed/comm/")


@dataclass(frozen=True, slots=True, order=True)
class Frame:
    """One frame of a stack: the function, its file and the line it is at (0: unknown)."""

    function: str
    file: str
    line: int

    def key(self) -> str:
        """``function@file:line``: the frame in a signature."""
        return f"{self.function}@{self.file}:{self.line}"

    def where(self) -> str:
        """``function (file.py:line)``, the file without its folders: the frame in a sentence."""
        name = self.file.replace("\\", "/").rsplit("/", 1)[-1] or "?"
        return f"{self.function} ({name}:{self.line})" if self.line else f"{self.function} ({name})"


@dataclass(frozen=True, slots=True)
class Thread:
    """One thread of a rank's dump."""

    name: str
    active: bool
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True, slots=True)
class RankStack:
    """What one rank's dump says of where it waits (``error``: why there is no stack)."""

    rank: int
    frames: tuple[Frame, ...]  # the chosen thread's (:func:`pick_thread`), innermost first
    error: str = ""


@dataclass(frozen=True, slots=True)
class StackGroup:
    """Ranks that wait at the same signature."""

    signature: tuple[Frame, ...]
    ranks: tuple[int, ...]  # ascending
    collective: bool  # the signature is in a collective (or a barrier)

    @property
    def where(self) -> str:
        """The innermost frame, for sentences."""
        return self.signature[0].where()


@dataclass(frozen=True, slots=True)
class Localisation:
    """The ranks grouped by where they wait, who stands out, and the verdict line."""

    groups: tuple[StackGroup, ...]  # the most ranks first
    unknown: tuple[tuple[int, str], ...]  # (rank, why) of the ranks with no vote
    suspects: tuple[tuple[int, str], ...]  # (rank, why), why starting "stack: "
    verdict: str


def pick_thread(threads: Sequence[Thread]) -> Thread | None:
    """The thread that says where a rank waits: the main one, else the active one, else any."""
    with_frames = [t for t in threads if t.frames]
    main = next((t for t in with_frames if t.name == MAIN_THREAD), None)
    active = next((t for t in with_frames if t.active), None)
    return main or active or next(iter(with_frames), None)


def is_plumbing(frame: Frame) -> bool:
    """A frame of the runtime's own waiting (threading, selectors, queue, asyncio, ...)."""
    path = frame.file.replace("\\", "/")
    if path.startswith("<frozen "):
        return True
    return path.endswith(_PLUMBING) or any(d in path for d in _PLUMBING_DIRS)


def is_collective(frame: Frame) -> bool:
    """A frame of torch.distributed, c10d, NCCL or gloo, or of a barrier."""
    path = frame.file.replace("\\", "/").lower()
    return any(part in path for part in _COLLECTIVE_FILES) or "barrier" in frame.function.lower()


def signature(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """The innermost frames of ours (all of them, if every frame is plumbing)."""
    ours = [f for f in frames if not is_plumbing(f)] or list(frames)
    return tuple(ours[:SIGNATURE_FRAMES])


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 2``, ``ranks 2, 5``, or the first TOLD_RANKS and a count."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(str(r) for r in ranks[:TOLD_RANKS])
    more = f", ... ({len(ranks)})" if len(ranks) > TOLD_RANKS else ""
    return f"ranks {shown}{more}"


def _wait(ranks: Sequence[int]) -> str:
    return "waits" if len(ranks) == 1 else "wait"


def localise(stacks: Iterable[RankStack]) -> Localisation:
    """Group the ranks by signature and name the ones that stand out (see the module)."""
    votes: dict[tuple[Frame, ...], list[int]] = {}
    unknown: list[tuple[int, str]] = []
    for stack in sorted(stacks, key=lambda s: s.rank):
        found = signature(stack.frames) if not stack.error else ()
        if found:
            votes.setdefault(found, []).append(stack.rank)
        else:
            unknown.append((stack.rank, stack.error or "no Python frames"))
    groups = sorted(
        (
            StackGroup(sig, tuple(ranks), any(map(is_collective, sig)))
            for sig, ranks in votes.items()
        ),
        key=lambda g: (-len(g.ranks), not g.collective, [f.key() for f in g.signature]),
    )
    suspects, verdict = _judge(groups)
    if unknown:
        verdict += f"; no stack of {ranks_text([r for r, _ in unknown])} ({unknown[0][1]})"
    return Localisation(tuple(groups), tuple(unknown), tuple(suspects), verdict)


def _judge(groups: list[StackGroup]) -> tuple[list[tuple[int, str]], str]:
    """(suspects, verdict) of groups sorted the most ranks first."""
    if not groups:
        return [], "no rank's stack was read"
    top = groups[0]
    if len(groups) == 1:
        below = "; what holds the collective is below Python" if top.collective else ""
        return [], f"no rank stands out: every rank waits in {top.where}{below}"
    runner_up = groups[1]
    if (len(runner_up.ranks), runner_up.collective) == (len(top.ranks), top.collective):
        places = ", ".join(f"{len(g.ranks)} in {g.where}" for g in groups[:TOLD_GROUPS])
        more = f", and {len(groups) - TOLD_GROUPS} more" if len(groups) > TOLD_GROUPS else ""
        return [], f"no rank stands out: no place holds the most ranks ({places}{more})"
    others = f"{len(top.ranks)} ranks wait in {top.where}"
    blamed = [g for g in reversed(groups[1:]) if top.collective or not g.collective]
    if not blamed:  # the few wait in a collective for the many, who wait elsewhere
        waiting = "; ".join(
            f"{ranks_text(g.ranks)} {_wait(g.ranks)} in {g.where}" for g in groups[1:TOLD_GROUPS]
        )
        return [], f"no rank stands out: {others}, outside a collective, while {waiting} for them"
    suspects = [
        (rank, f"stack: waits in {g.where} while {others}") for g in blamed for rank in g.ranks
    ][:MAX_SUSPECTS]
    told = "; ".join(
        f"{ranks_text(g.ranks)} {_wait(g.ranks)} in {g.where}" for g in blamed[:TOLD_GROUPS]
    )
    more = f"; {len(blamed) - TOLD_GROUPS} more places" if len(blamed) > TOLD_GROUPS else ""
    return suspects, f"{told}{more} while {others}"
