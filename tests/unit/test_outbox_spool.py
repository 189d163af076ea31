import errno
import os
from dataclasses import replace
from pathlib import Path

import pytest

from agent.budget import ByteBudget
from agent.config import AgentConfig
from agent.exceptions import ConfigError, OutboxFullError
from agent.findings import PendingEvent
from agent.job_socket import JobQueue
from agent.outbox import Outbox
from agent.spool import Spool
from fleetwatch.model import EventKind, Target
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


class TestRestart:
    def test_the_kernel_log_position_comes_back_with_the_events(self, tmp_path: Path):
        """Held events say which kernel log record they were read up to, after a restart too."""
        box = outbox(tmp_path)
        box.welcome(0)
        box.add(replace(event(1), kmsg_seq=1201))
        box.add(replace(event(2), kmsg_seq=1207))
        box.add(event(3))  # NVML's: no kernel log record
        box.sync()
        assert box.durable
        box.close()
        assert outbox(tmp_path).kmsg_seq() == 1207

    def test_a_restarted_agent_replays_with_the_original_numbers(self, tmp_path: Path):
        """Events of a process that got its Welcome come back numbered as they were sent; the
        next Welcome is an ack for what the journal holds and nothing is renumbered."""
        box = outbox(tmp_path)
        box.welcome(0)
        for i in range(1, 5):
            box.add(event(i))
        box.sync()
        box.ack(1)
        again = outbox(tmp_path)
        assert again.restored >= 3
        assert pending(again)[-3:] == [(2, "m2"), (3, "m3"), (4, "m4")]
        again.welcome(3)  # the collector had journaled 2 and 3, the acks were lost
        assert pending(again) == [(4, "m4")]
        assert again.add(event(5)).seq == 5

    def test_unconfirmed_events_are_renumbered_and_the_disk_follows(self, tmp_path: Path):
        """Events numbered before any Welcome (never sent) move above an earlier process's
        numbers; the renumbering is on disk before they go out, and is not repeated."""
        box = outbox(tmp_path)
        box.add(event(1))
        box.add(event(2))
        box.sync()
        again = outbox(tmp_path)
        assert pending(again) == [(1, "m1"), (2, "m2")]
        again.add(event(3))
        again.sync()
        again.welcome(7)  # an agent of this boot without a spool had used 1..7
        assert pending(again) == [(8, "m1"), (9, "m2"), (10, "m3")]
        third = outbox(tmp_path)
        assert pending(third) == [(8, "m1"), (9, "m2"), (10, "m3")]
        third.welcome(8)
        assert pending(third) == [(9, "m2"), (10, "m3")]

    def test_numbers_lost_from_the_disk_are_not_reused(self, tmp_path: Path):
        """Confirmed events keep their numbers, but events this process numbered before its
        Welcome move above what the journal holds (the disk lost the end of the numbers)."""
        box = outbox(tmp_path)
        box.welcome(0)
        box.add(event(1))
        box.sync()
        again = outbox(tmp_path)
        again.add(event(2))  # numbered 2, but an earlier process's 2 and 3 reached the journal
        again.welcome(3)
        assert pending(again) == [(4, "m2")]

    def test_a_fresh_agent_without_spool_still_renumbers(self):
        """Without a spool the outbox behaves as before: renumber once above the journal."""
        box = Outbox(BOOT)
        box.add(event(1))
        box.welcome(5)
        assert pending(box) == [(6, "m1")]


class TestBound:
    def test_telemetry_goes_before_any_event(self, tmp_path: Path):
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
        assert [e.seq for e in box.after(0)] == [1]
        assert budget.held <= budget.max_bytes

    def test_an_event_is_refused_only_when_events_fill_the_bound(self, tmp_path: Path):
        """Events alone at the bound: the new one is refused, not an old one pushed out, and
        the numbering keeps no hole."""
        budget = ByteBudget(1000)
        box = outbox(tmp_path, budget=budget)
        box.welcome(0)
        added = 0
        while budget.events + 200 < budget.max_bytes:
            box.add(event(added, size=100))
            added += 1
        with pytest.raises(OutboxFullError):
            box.add(event(added, size=100))
        assert added > 0
        assert list(range(1, added + 1)) == [e.seq for e in box.after(0)]
        box.ack(added)
        assert added + 1 == box.add(event(0, size=100)).seq

    def test_step_reports_never_push_out_events(self, tmp_path: Path):
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
    def test_events_the_disk_refuses_are_still_sent(self, tmp_path: Path):
        """ENOSPC keeps the event in the outbox (and counted): the link sends it all the same."""

        def full(_fd: int, _data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        box = Outbox(BOOT, spool=Spool(tmp_path, BOOT, write=full))
        box.welcome(0)
        box.add(event(1))
        box.sync()
        assert [e.seq for e in box.after(0)] == [1]
        assert box.spool is not None
        assert box.spool.write_errors >= 1
        box.ack(1)
        assert box.spool.backlog == 0


class TestConfig:
    def test_the_bound_is_checked(self):
        """spool_max_bytes is a whole number of bytes, 2 MiB at least; 64 MiB by default."""
        assert AgentConfig().spool_max_bytes == 64 << 20
        for bad in (0, 1024, 3.5e6, True, "64MiB"):
            with pytest.raises(ConfigError, match="spool_max_bytes"):
                AgentConfig(spool_max_bytes=bad)  # type: ignore[arg-type]
