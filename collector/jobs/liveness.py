"""Whether a job runs, hangs, failed or finished, from its steps and its ranks' processes.

The agents watch each rank process that reported on their node (``/proc/<pid>/stat``: alive and
how, or gone) and say so every poll (:class:`~fleetwatch.wire.v1.fleetwatch_pb2.RankProcess`).
From that and the job's finished steps, a job is:

- ``finished``: every rank process the agents watch has exited, each saying farewell ``ok``
  (:mod:`fleetwatch.jobclient` does at interpreter exit);
- ``failed``: a rank process ended without ``ok`` (killed, or an uncaught exception), and
  ``exit_grace_s`` later no step finished since: the job is lost (the rest wait for it, or ended
  too);
- ``hung``: every watched rank process is there (as the agents said after the deadline passed),
  yet no step finished for longer than the job's own deadline, ``max(hang_factor x p99 step
  time, hang_floor_s)``, learned once ``HANG_MIN_STEPS`` steps finished (a job that never
  finished a step is still starting up); a job some of whose ranks said ``ok`` since its last
  step (exited, or still exiting) is ending, and hung only if the rest are still there
  ``exit_grace_s`` later;
- ``running`` otherwise, or ``idle`` when nothing was heard of it for ``idle_after_s`` and no
  process says more (an agent too old to watch processes).

A rank whose process is stopped, in uninterruptible sleep, or gone stands out by itself: those are
the first suspects of a hang or a failure (:func:`suspects`); of the gone, first those that ended
without a word (killed: an uncaught exception in the others is often what the first one's end
did to them), then those that ended in an exception, earliest first. In a hang where none does,
the ranks that wait somewhere else than most (their wait channel) are; and when even that names
nobody, the ranks whose Python stack stands out (:mod:`collector.jobs.stacks`, from the evidence
gathered in this hang). A suspect the stacks name too is told with what its stack says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from collector.jobs.processes import GONE

if TYPE_CHECKING:
    from collector.jobs.config import JobsConfig
    from collector.jobs.stacks import Localisation
    from collector.jobs.state import JobState

HANG_MIN_STEPS: Final = 5  # finished steps before a job's step times can set its deadline
CHECKPOINT_FACTOR: Final = 3.0  # an announced checkpoint may take 3 x the longest one so far
STALE_S: Final = 60.0  # a process not described for this long says nothing any more
STANDS_OUT: Final = {"stopped": "stopped", "disk_sleep": "in uninterruptible sleep (D state)"}


@dataclass(frozen=True, slots=True)
class Liveness:
    """A job's state now, and what it rests on."""

    state: str  # running, hung, failed, finished, idle
    silent_s: float  # since the last finished step (or first heard of, before any)
    deadline_s: float  # how long a step may take before the job is hung (0: not learned yet)
    gone: tuple[int, ...]  # ranks whose process exited since the job's last finished step
    since: float | None  # monotonic: when it became hung or failed


def deadline(job: JobState, config: JobsConfig) -> float:
    """How long the job may go without finishing a step (0 before HANG_MIN_STEPS steps).

    While a checkpoint is written that a rank announced after a step no later than the last
    finished one (until a later step finishes), the deadline grows by ``max(3 x the longest
    checkpoint the job reported, checkpoint_floor_s)``.
    """
    times = sorted(s.step_time_s for s in job.steps)
    if len(times) < HANG_MIN_STEPS:
        return 0.0
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    limit = max(config.hang_factor * p99, config.hang_floor_s)
    announced = job.checkpoint_after
    if announced is not None and job.steps[-1].step <= announced:
        longest = max((end - start for start, end in job.checkpoints), default=0.0)
        limit += max(CHECKPOINT_FACTOR * longest, config.checkpoint_floor_s)
    return limit


def judge(
    job: JobState,
    now: float,
    config: JobsConfig,
    *,
    active: bool,
    silent_nodes: frozenset[str] = frozenset(),
) -> Liveness:
    """The job's state at ``now`` (monotonic).

    ``silent_nodes``: nodes that stopped answering; their ranks' processes cannot be described
    (a crashed node's ranks never say they are gone), so a hang is judged by the others'.
    """
    last = job.steps[-1].at if job.steps else job.first_seen
    silent = max(0.0, now - last)
    limit = deadline(job, config)
    watched = {r: p for r, p in job.processes.items() if now - p.seen <= STALE_S}
    ended = {r for r, p in watched.items() if p.state in GONE}
    there = [r for r in watched if r not in ended]
    # a rank that ended before the job's last finished step does not hold it (the job went on,
    # or restarted without it): only those that ended since count
    gone = tuple(sorted(r for r in ended if (watched[r].gone_since or now) >= last))
    dirty = [r for r in gone if watched[r].farewell != "ok"]
    if watched and not there and not dirty:
        return Liveness("finished", silent, limit, gone, None)
    if dirty:
        first = min(watched[r].gone_since or now for r in dirty)
        if now - first >= config.exit_grace_s and last <= first:
            return Liveness("failed", silent, limit, gone, first + config.exit_grace_s)
        return Liveness("running", silent, limit, gone, None)
    # ending: a rank said ok since the last step (exited, or still exiting: an interpreter with
    # torch takes seconds to end) and the others are on their way out; stuck there past
    # exit_grace_s, the job is hung after all
    clean = [
        p.said_since or p.gone_since or now
        for r, p in watched.items()
        if p.farewell == "ok" and (r in gone or r in there)
    ]
    if clean and now - min(clean) < config.exit_grace_s:
        return Liveness("running", silent, limit, gone, None)
    # hung only while the agents say, after the deadline passed, that every process is there
    heard = [r for r in there if (h := job.ranks.get(r)) is None or h.node not in silent_nodes]
    if heard and limit and silent > limit and min(watched[r].seen for r in heard) > last + limit:
        return Liveness("hung", silent, limit, gone, last + limit)
    return Liveness("running" if active or there else "idle", silent, limit, gone, None)


def suspects(
    job: JobState,
    liveness: Liveness,
    stacks: Localisation | None = None,
    window_s: float = math.inf,
) -> list[tuple[int, str]]:
    """(rank, why) of the ranks whose own process stands out: gone, stopped, in D state.

    ``stacks``: the ranks' stacks grouped in this hang (None: none gathered yet). Of the ranks
    gone, only those that went within ``window_s`` of the first: the later ones were ended by
    what the first one's end did (a watchdog, the launcher), not the other way round.
    """
    said = {"": 0, "error": 1, "ok": 2}

    def order(rank: int) -> tuple[int, float]:
        process = job.processes[rank]
        return said.get(process.farewell, 0), process.gone_since or 0.0

    why_gone = {
        "": "its process ended without a word (killed?)",
        "error": "its process ended in an uncaught exception",
        "ok": "its process exited",
    }
    times = [job.processes[r].gone_since for r in liveness.gone]
    first = min((t for t in times if t is not None), default=None)
    early = [
        r
        for r in liveness.gone
        if first is None or (job.processes[r].gone_since or first) <= first + window_s
    ]
    out = [(r, why_gone[job.processes[r].farewell]) for r in sorted(early, key=order)]
    for rank, process in sorted(job.processes.items()):
        why = STANDS_OUT.get(process.state)
        if why is not None:
            out.append((rank, f"its process is {why}"))
    if not out and liveness.state == "hung":
        out += outliers(job)
    if stacks is not None and liveness.state == "hung":
        return with_stacks(out, stacks)
    return out


def with_stacks(found: list[tuple[int, str]], stacks: Localisation) -> list[tuple[int, str]]:
    """The suspects ``found`` by their processes, with what their stacks say where they stand out.

    When ``found`` is nobody, the ranks whose stacks stand out are the suspects.
    """
    if not found:
        return list(stacks.suspects)
    said = dict(stacks.suspects)
    return [(rank, f"{why}; {said[rank]}" if rank in said else why) for rank, why in found]


def outliers(job: JobState) -> list[tuple[int, str]]:
    """In a hang where no process stands out by its state: the ranks that wait somewhere else.

    The ranks are grouped by where their process waits (its state and wait channel). When one
    group holds more than half of them, the ranks outside it are suspects: in a wedged
    collective every healthy rank waits in the same place, and the one holding them elsewhere.
    """
    there = {r: p for r, p in job.processes.items() if p.state not in GONE}
    places: dict[tuple[str, str], list[int]] = {}
    for rank, process in there.items():
        places.setdefault((process.state, process.wchan), []).append(rank)
    if len(places) < 2:  # noqa: PLR2004 - one place: nobody stands out
        return []
    (_, wchan), dominant = max(places.items(), key=lambda item: len(item[1]))
    if 2 * len(dominant) <= len(there) or not wchan:
        return []
    out: list[tuple[int, str]] = []
    for (their_state, their_wchan), ranks in sorted(places.items()):
        if ranks is dominant:
            continue
        where = their_wchan or their_state
        why = f"its process waits in {where} while {len(dominant)} others wait in {wchan}"
        out.extend((rank, why) for rank in sorted(ranks))
    return out
