"""The ranks' stacks grouped by where they wait, and the ranks that stand out (stacks.py)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from collector.jobs.stacks import (
    MAX_SUSPECTS,
    Frame,
    RankStack,
    Thread,
    is_collective,
    localise,
    pick_thread,
    signature,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

SITE = "/usr/lib/python3/dist-packages/torch/distributed"
JOB = "/opt/train/torch_job.py"
# What py-spy prints of a gloo rank blocked in dist.all_reduce (torch 2.x, innermost first).
ALL_REDUCE = (
    Frame("all_reduce", f"{SITE}/distributed_c10d.py", 3252),
    Frame("wrapper", f"{SITE}/c10d_logger.py", 83),
    Frame("all_reduce_gradients", JOB, 85),
    Frame("train", JOB, 131),
    Frame("main", JOB, 170),
    Frame("<module>", JOB, 178),
)
BROADCAST = (
    Frame("broadcast", f"{SITE}/distributed_c10d.py", 3151),
    Frame("wrapper", f"{SITE}/c10d_logger.py", 83),
    Frame("sync_params", JOB, 60),
    Frame("train", JOB, 120),
)
SLEEPING = (Frame("train", JOB, 126), Frame("main", JOB, 170), Frame("<module>", JOB, 178))
LOADING = (
    Frame("wait", "/usr/lib/python3.11/threading.py", 327),
    Frame("get", "/usr/lib/python3.11/queue.py", 180),
    Frame("next_batch", "/opt/train/data.py", 12),
    Frame("train", JOB, 110),
)


def stacks(frames: Mapping[int, tuple[Frame, ...]]) -> list[RankStack]:
    return [RankStack(rank, f) for rank, f in frames.items()]


class TestLocalise:
    def test_a_rank_sleeping_before_the_collective_is_the_suspect(self):
        """Rank 2 sleeps in its training loop while 3 ranks wait in gloo's all_reduce."""
        found = localise(stacks({0: ALL_REDUCE, 1: ALL_REDUCE, 2: SLEEPING, 3: ALL_REDUCE}))
        assert found.suspects == (
            (
                2,
                (
                    "stack: waits in train (torch_job.py:126) while 3 ranks wait in all_reduce "
                    "(distributed_c10d.py:3252)"
                ),
            ),
        )
        assert found.verdict == (
            "rank 2 waits in train (torch_job.py:126) while 3 ranks wait in all_reduce "
            "(distributed_c10d.py:3252)"
        )
        assert [(g.ranks, g.collective) for g in found.groups] == [((0, 1, 3), True), ((2,), False)]
        assert found.groups[0].signature == ALL_REDUCE[:3]

    def test_every_rank_waiting_in_one_place_outside_a_collective_blames_nobody(self):
        """Every rank waits for its data loader: no rank stands out (the file system might)."""
        found = localise(stacks(dict.fromkeys(range(4), LOADING)))
        assert found.suspects == ()
        assert found.verdict == "no rank stands out: every rank waits in next_batch (data.py:12)"

    def test_every_rank_in_the_same_collective_blames_nobody(self):
        found = localise(stacks(dict.fromkeys(range(8), ALL_REDUCE)))
        assert found.suspects == ()
        assert found.verdict.startswith(
            "no rank stands out: every rank waits in all_reduce (distributed_c10d.py:3252); "
            "what holds the collective is below Python"
        )

    def test_a_rank_in_another_collective_is_the_suspect(self):
        """A desync: rank 5 broadcasts while 7 ranks all-reduce."""
        frames: dict[int, tuple[Frame, ...]] = dict.fromkeys(range(8), ALL_REDUCE)
        frames[5] = BROADCAST
        found = localise(stacks(frames))
        assert [r for r, _ in found.suspects] == [5]
        assert "waits in broadcast (distributed_c10d.py:3151) while 7 ranks" in found.verdict

    def test_a_rank_whose_dump_failed_has_no_vote(self):
        """Rank 3's dump timed out: it is unknown, and the 3 others agreeing blame nobody."""
        found = localise(
            [*stacks(dict.fromkeys(range(3), ALL_REDUCE)), RankStack(3, SLEEPING, "timed out")]
        )
        assert found.suspects == ()
        assert found.unknown == ((3, "timed out"),)
        assert found.verdict.endswith("; no stack of rank 3 (timed out)")

    def test_no_stack_at_all_blames_nobody(self):
        found = localise([RankStack(0, (), "py-spy is missing"), RankStack(1, ())])
        assert (found.suspects, found.groups) == ((), ())
        assert found.unknown == ((0, "py-spy is missing"), (1, "no Python frames"))
        assert found.verdict.startswith("no rank's stack was read")

    def test_as_many_ranks_in_two_places_outside_a_collective_blame_nobody(self):
        frames = {0: SLEEPING, 1: SLEEPING, 2: LOADING, 3: LOADING}
        found = localise(stacks(frames))
        assert found.suspects == ()
        assert found.verdict.startswith("no rank stands out: no place holds the most ranks")

    def test_on_a_tie_the_ranks_outside_the_collective_are_the_suspects(self):
        frames = {0: ALL_REDUCE, 1: SLEEPING, 2: ALL_REDUCE, 3: SLEEPING}
        assert [r for r, _ in localise(stacks(frames)).suspects] == [1, 3]

    def test_the_few_waiting_in_a_collective_for_the_many_are_no_suspects(self):
        """Rank 0 got to the all_reduce; the 3 others wait for their data: rank 0 waits for
        them, and blaming three of four ranks localises nothing."""
        frames = {0: ALL_REDUCE, 1: LOADING, 2: LOADING, 3: LOADING}
        found = localise(stacks(frames))
        assert found.suspects == ()
        assert found.verdict == (
            "no rank stands out: 3 ranks wait in next_batch (data.py:12), outside a collective, "
            "while rank 0 waits in all_reduce (distributed_c10d.py:3252) for them"
        )

    def test_the_groups_and_verdict_do_not_depend_on_the_order_of_the_dumps(self):
        frames = dict.fromkeys(range(12), ALL_REDUCE) | {3: SLEEPING, 7: LOADING, 9: SLEEPING}
        dumps = stacks(frames)
        first = localise(dumps)
        random.Random(4).shuffle(dumps)  # noqa: S311 - an order, not a secret
        assert localise(dumps) == first
        assert [r for r, _ in first.suspects] == [7, 3, 9]  # the smallest group first

    def test_suspects_are_bounded(self):
        frames = dict.fromkeys(range(100), ALL_REDUCE) | dict.fromkeys(range(100, 140), SLEEPING)
        found = localise(stacks(frames))
        assert len(found.suspects) == MAX_SUSPECTS
        assert found.verdict.startswith("ranks 100, 101, 102, 103, 104, 105, 106, 107, ... (40)")


class TestSignature:
    def test_the_runtimes_own_waiting_is_left_out(self):
        """threading's and queue's frames say nothing of where the program waits."""
        assert signature(LOADING) == LOADING[2:]

    def test_a_stack_of_only_plumbing_keeps_its_innermost_frames(self):
        frames = (
            Frame("select", "/usr/lib/python3.11/selectors.py", 468),
            Frame("_run_once", "/usr/lib/python3.11/asyncio/base_events.py", 1898),
        )
        assert signature(frames) == frames

    def test_frames_as_keys_and_in_sentences(self):
        frame = ALL_REDUCE[0]
        assert frame.key() == f"all_reduce@{SITE}/distributed_c10d.py:3252"
        assert frame.where() == "all_reduce (distributed_c10d.py:3252)"
        assert Frame("f", "x.py", 0).where() == "f (x.py)"

    def test_collectives_are_torch_distributed_c10d_nccl_gloo_and_barriers(self):
        assert is_collective(ALL_REDUCE[1])
        assert is_collective(Frame("sync", "/opt/train/barrier_utils.py", 3)) is False
        assert is_collective(Frame("wait_barrier", "/opt/train/utils.py", 3))
        assert is_collective(Frame("run", "/opt/nccl_tests/run.py", 3))
        assert not is_collective(SLEEPING[0])


class TestPickThread:
    def test_the_main_thread_says_where_a_rank_waits(self):
        threads = [
            Thread("pin_memory", active=True, frames=LOADING),
            Thread("MainThread", active=False, frames=ALL_REDUCE),
        ]
        assert pick_thread(threads) == threads[1]

    def test_without_a_main_thread_the_active_one_does(self):
        threads = [
            Thread("Thread-1", active=False, frames=LOADING),
            Thread("Thread-2", active=True, frames=SLEEPING),
        ]
        assert pick_thread(threads) == threads[1]

    def test_threads_without_frames_say_nothing(self):
        assert pick_thread([Thread("MainThread", active=True, frames=())]) is None
        assert pick_thread([]) is None
