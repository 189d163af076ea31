import asyncio
import errno
import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.exceptions import ConfigError, OutboxFullError
from agent.jobs.listener import JobQueue
from agent.outbox.budget import ByteBudget
from agent.outbox.queue import Outbox
from agent.outbox.spool import Spool, record_size
from agent.poll.findings import PendingEvent
from fleetwatch.model import EventKind, Target
from fleetwatch.testing import wait_until
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

BOOT = "boot-1"


def event(n: int = 0, size: int = 0) -> PendingEvent:
    detail = f"m{n}" + "x" * size
    return PendingEvent(EventKind.XID, Target.gpu("GPU-0000"), 1_000 + n, xid=13, detail=detail)


def step(n: int) -> pb.JobStep:
    return pb.JobStep(job_id="job", rank=0, step=n, time_unix_ms=1, step_time_s=1.0)


def outbox(state: Path, **kwargs: object) -> Outbox:
    return Outbox(BOOT, spool=Spool(state, BOOT), **kwargs)  # type: ignore[arg-type]


def pending(box: Outbox) -> list[tuple[int, str]]:
    return [(e.seq, e.detail) for e in box.after(0)]


def durable(box: Outbox) -> bool:
    return box.durable  # read afresh: it changes across awaits


class TestRestart:
    async def test_the_kernel_log_position_comes_back_with_the_events(self, tmp_path: Path):
        """Held events say which kernel log record they were read up to, after a restart too."""
        box = outbox(tmp_path)
        box.welcome(0)
        box.add(replace(event(1), kmsg_seq=1201))
        box.add(replace(event(2), kmsg_seq=1207))
        box.add(event(3))  # NVML's: no kernel log record
        await box.sync()
        assert box.durable
        await box.close()
        assert outbox(tmp_path).kmsg_seq() == 1207

    async def test_a_restarted_agent_replays_with_the_original_numbers(self, tmp_path: Path):
        """Events of a process that got its Welcome come back numbered as they were sent; the
        next Welcome is an ack for what the journal holds and nothing is renumbered."""
        box = outbox(tmp_path)
        box.welcome(0)
        for i in range(1, 5):
            box.add(event(i))
        await box.sync()
        box.ack(1)
        await box.settled()  # the ack's clean-up is done before the "restart"
        again = outbox(tmp_path)
        assert again.restored >= 3
        assert pending(again)[-3:] == [(2, "m2"), (3, "m3"), (4, "m4")]
        again.welcome(3)  # the collector had journaled 2 and 3, the acks were lost
        await again.sync()
        assert pending(again) == [(4, "m4")]
        assert again.add(event(5)).seq == 5

    async def test_unconfirmed_events_are_renumbered_and_the_disk_follows(self, tmp_path: Path):
        """Events numbered before any Welcome (never sent) move above an earlier process's
        numbers; the renumbering is on disk before they go out, and is not repeated."""
        box = outbox(tmp_path)
        box.add(event(1))
        box.add(event(2))
        await box.sync()
        again = outbox(tmp_path)
        assert pending(again) == [(1, "m1"), (2, "m2")]
        again.add(event(3))
        await again.sync()
        again.welcome(7)  # an agent of this boot without a spool had used 1..7
        assert pending(again) == []  # nothing goes out before the new numbers are on disk
        await again.sync()
        assert pending(again) == [(8, "m1"), (9, "m2"), (10, "m3")]
        third = outbox(tmp_path)
        assert pending(third) == [(8, "m1"), (9, "m2"), (10, "m3")]
        third.welcome(8)
        await third.sync()
        assert pending(third) == [(9, "m2"), (10, "m3")]

    async def test_numbers_lost_from_the_disk_are_not_reused(self, tmp_path: Path):
        """Confirmed events keep their numbers, but events this process numbered before its
        Welcome move above what the journal holds (the disk lost the end of the numbers)."""
        box = outbox(tmp_path)
        box.welcome(0)
        box.add(event(1))
        await box.sync()
        again = outbox(tmp_path)
        again.add(event(2))  # numbered 2, but an earlier process's 2 and 3 reached the journal
        again.welcome(3)
        await again.sync()
        assert pending(again) == [(4, "m2")]

    def test_a_fresh_agent_without_spool_still_renumbers(self):
        """Without a spool the outbox behaves as before: renumber once above the journal."""
        box = Outbox(BOOT)
        box.add(event(1))
        box.welcome(5)
        assert pending(box) == [(6, "m1")]


class SlowDisk:
    """An fsync that waits while the disk is held (a disk taking its time), counting calls."""

    def __init__(self) -> None:
        self.free = threading.Event()
        self.free.set()
        self.calls = 0
        self.waiting = 0

    def hold(self) -> None:
        self.free.clear()

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.waiting += 1
        self.free.wait(30)  # bounded: a failed test must not leave the thread waiting for good
        self.waiting -= 1
        os.fsync(fd)


class TestDiskThread:
    async def test_an_event_goes_out_only_once_its_fsync_returned(self, tmp_path: Path):
        """While the fsync of event 1 waits on the disk, the loop goes on numbering (event 2),
        nothing is released to the link; the sync's return releases what it covered."""
        disk = SlowDisk()
        box = Outbox(BOOT, spool=Spool(tmp_path, BOOT, fsync=disk))
        box.welcome(0)
        await box.settled()
        disk.hold()
        box.add(event(1))
        first = asyncio.create_task(box.sync())
        await wait_until(lambda: disk.waiting == 1, what="the fsync to wait on the disk")
        assert box.add(event(2)).seq == 2
        assert pending(box) == []
        assert not durable(box)
        disk.free.set()
        assert await first
        assert pending(box) == [(1, "m1")]  # 2 was numbered after that sync was handed over
        assert await box.sync()
        assert pending(box) == [(1, "m1"), (2, "m2")]
        assert durable(box)
        await box.close()

    async def test_syncs_waiting_together_share_one_fsync(self, tmp_path: Path):
        """Four syncs asked for while one waits on the disk are served by one more fsync."""
        disk = SlowDisk()
        box = Outbox(BOOT, spool=Spool(tmp_path, BOOT, fsync=disk))
        box.welcome(0)
        await box.settled()  # the Welcome's confirmed segment is written
        disk.hold()
        box.add(event(1))
        first = asyncio.create_task(box.sync())
        await wait_until(lambda: disk.waiting == 1, what="the fsync to wait on the disk")
        calls = disk.calls
        later = []
        for n in range(2, 6):
            box.add(event(n))
            later.append(asyncio.create_task(box.sync()))
        await asyncio.sleep(0)  # each of them is waiting now
        disk.free.set()
        assert all(await asyncio.gather(first, *later))
        assert disk.calls == calls + 1
        assert [seq for seq, _ in pending(box)] == [1, 2, 3, 4, 5]
        await box.close()

    async def test_a_welcome_releases_nothing_until_its_numbers_are_on_disk(self, tmp_path: Path):
        """Restored events renumbered by the first Welcome wait until the rewrite is on disk."""
        box = outbox(tmp_path)
        box.add(event(1))
        box.add(event(2))
        await box.close()  # never met a collector: its numbers are not confirmed
        disk = SlowDisk()
        again = Outbox(BOOT, spool=Spool(tmp_path, BOOT, fsync=disk))
        disk.hold()
        again.welcome(7)  # an agent of this boot without a spool had used 1..7
        await wait_until(lambda: disk.waiting == 1, what="the rewrite to wait on the disk")
        assert pending(again) == []
        disk.free.set()
        await again.sync()
        assert pending(again) == [(8, "m1"), (9, "m2")]
        await again.close()


STUCK_AT_EXIT = """
import asyncio, os, sys, threading
from pathlib import Path
from agent.poll.findings import PendingEvent
from agent.outbox.queue import Outbox
from agent.outbox.spool import Spool
from fleetwatch.model import EventKind, Target

stuck = threading.Event()

def fsync(fd):
    if stuck.is_set():
        threading.Event().wait()  # a disk that never answers
    os.fsync(fd)

async def main():
    box = Outbox("boot-1", spool=Spool(Path(sys.argv[1]), "boot-1", fsync=fsync))
    stuck.set()
    box.add(PendingEvent(EventKind.XID, Target.gpu("GPU-0000"), 1, xid=13))
    try:
        await asyncio.wait_for(box.sync(), 0.5)
    except TimeoutError:
        print("sync still waiting", flush=True)

asyncio.run(main())
"""


class TestStuckDisk:
    def test_a_process_whose_fsync_never_returns_still_exits(self, tmp_path: Path):
        """The disk thread is a daemon: an fsync that never returns does not hold the exit
        (what the killed write leaves is what a crash leaves)."""
        done = subprocess.run(
            [sys.executable, "-c", STUCK_AT_EXIT, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "sync still waiting" in done.stdout, done.stderr
        assert done.returncode == 0, done.stderr


class TestBound:
    async def test_telemetry_goes_before_any_event(self, tmp_path: Path):
        """When the bound is reached, an event sheds the oldest step reports; events stay."""
        budget = ByteBudget(4096)
        jobs = JobQueue(budget=budget)
        budget.shed = jobs.shed
        box = outbox(tmp_path, budget=budget)
        for n in range(200):
            jobs.add(step(n))
        assert jobs.dropped > 0  # the steps alone filled the bound
        assert budget.held <= budget.max_bytes
        kept = len(jobs)
        box.add(event(1, size=300))
        assert len(jobs) < kept
        assert jobs.take(1)[0].step > 200 - kept  # the oldest went
        await box.sync()
        assert [e.seq for e in box.after(0)] == [1]
        assert budget.held <= budget.max_bytes

    async def test_an_event_is_refused_only_when_events_fill_the_bound(self, tmp_path: Path):
        """Events alone at the bound: the new one is refused, not an old one pushed out, and
        the numbering keeps no hole."""
        budget = ByteBudget(1000)
        box = outbox(tmp_path, budget=budget)
        box.welcome(0)
        one = record_size(event(0, size=100).to_pb(1))
        added = 0
        while budget.events + one <= budget.max_bytes:
            box.add(event(added, size=100))
            added += 1
        with pytest.raises(OutboxFullError):
            box.add(event(added, size=100))
        assert added == budget.max_bytes // one  # refused only when events alone fill it
        await box.sync()
        assert list(range(1, added + 1)) == [e.seq for e in box.after(0)]
        box.ack(added)
        assert added + 1 == box.add(event(0, size=100)).seq

    async def test_step_reports_never_push_out_events(self, tmp_path: Path):
        """A step report that does not fit beside the events is the one dropped."""
        budget = ByteBudget(1000)
        jobs = JobQueue(budget=budget)
        budget.shed = jobs.shed
        box = outbox(tmp_path, budget=budget)
        while budget.room() > 150:
            box.add(event(0, size=50))
        events = len(box)
        for n in range(50):
            jobs.add(step(n))
        assert events == len(box)
        assert jobs.dropped > 0
        assert budget.held <= budget.max_bytes


class TestFullDisk:
    async def test_events_the_disk_refuses_are_still_sent(self, tmp_path: Path):
        """ENOSPC keeps the event in the outbox (and counted): the link sends it all the same."""

        def full(_fd: int, _data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        box = Outbox(BOOT, spool=Spool(tmp_path, BOOT, write=full))
        box.welcome(0)
        box.add(event(1))
        await box.sync()
        assert [e.seq for e in box.after(0)] == [1]
        assert box.spool_state.write_errors >= 1
        box.ack(1)
        await box.settled()
        assert box.spool_state.backlog == 0


class TestConfig:
    def test_the_bound_is_checked(self):
        """spool_max_bytes is a whole number of bytes, 2 MiB at least; 64 MiB by default."""
        assert AgentConfig().spool_max_bytes == 64 << 20
        for bad in (0, 1024, 3.5e6, True, "64MiB"):
            with pytest.raises(ConfigError, match="spool_max_bytes"):
                AgentConfig(spool_max_bytes=bad)  # type: ignore[arg-type]
