"""A stream session against a real journal (SQLite in tmp_path) and fleet model; only the gRPC
context is a stand-in, and the clock is fake so budgets and windows run in no time."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from structlog.testing import capture_logs

from collector.ingest.session import SessionRegistry, StreamSession
from collector.ingest.throttle import IngestLimits
from collector.model.fleet import FleetModel
from collector.stats import CollectorStats
from collector.store.journal import Journal
from collector.store.sqlite import JournalReader, SqliteStore
from fleetwatch.testing import FakeClock, made_up_hello, made_up_uuid
from fleetwatch.wire.repeats import occurrences, parse_repeats, seqs_covered
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.xid_catalog import load_catalog, parse_catalog

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

NODE = "gpu-001"
HELLO = made_up_hello(NODE, gpus=2, nvlinks=2, ib_ports=1, boot_id="boot-1")
UUID = made_up_uuid(NODE, 0)
NOW_MS = 1_767_225_600_000


class FakeContext:
    """The part of grpc.aio.ServicerContext a session uses: reads from a queue, keeps writes."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.sent: list[pb.CollectorMessage] = []
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def read(self) -> object:
        raw = await self.inbox.get()
        return grpc.aio.EOF if raw is None else raw

    async def write(self, message: pb.CollectorMessage) -> None:
        self.sent.append(message)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError

    def acks(self) -> list[int]:
        return [m.ack.seq for m in self.sent if m.WhichOneof("body") == "ack"]

    def send(self, *messages: pb.AgentMessage) -> None:
        for message in messages:
            self.inbox.put_nowait(message.SerializeToString())


def xid(seq: int, xid_: int = 13, gpu: str = UUID, time_ms: int = NOW_MS) -> pb.AgentMessage:
    target = pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=gpu)
    event = pb.Event(
        seq=seq,
        time_unix_ms=time_ms,
        kind=pb.EVENT_KIND_XID,
        target=target,
        xid=xid_,
        detail=f"NVRM: Xid 13 n={seq}",
    )
    return pb.AgentMessage(event=event)


class Collector:
    """The shared parts of a collector, and a way to run one stream to its end."""

    def __init__(self, tmp_path: Path, limits: IngestLimits) -> None:
        self.clock = FakeClock()
        self.fleet = FleetModel()
        self.stats = CollectorStats()
        self.journal = Journal(SqliteStore(tmp_path / "journal.db"))
        self.reader = JournalReader(tmp_path / "journal.db")
        self.registry = SessionRegistry(limits)
        self.catalog = load_catalog()

    async def stream(self, *messages: pb.AgentMessage, hello: pb.Hello = HELLO) -> FakeContext:
        """Run a stream that sends ``messages`` after its Hello, then closes its side."""
        context = FakeContext()
        context.send(pb.AgentMessage(hello=hello), *messages)
        context.inbox.put_nowait(None)
        session = StreamSession(
            fleet=self.fleet,
            journal=self.journal,
            stats=self.stats,
            registry=self.registry,
            clock=self.clock,
            config=pb.Config(),
            xid_class=self.catalog.class_of,
        )
        with contextlib.suppress(grpc.aio.AbortError):
            await asyncio.wait_for(session.run(context), 10)  # type: ignore[arg-type]
        return context

    def seqs(self) -> list[int]:
        rows = self.reader.events(node=NODE, limit=100_000)
        return [s for r in rows if r.seq is not None for s in seqs_covered(r.seq, r.detail)]


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Any]:
    made: list[Collector] = []

    def build(**limits: Any) -> Collector:
        made.append(Collector(tmp_path, IngestLimits(**limits)))
        return made[-1]

    yield build
    for c in made:
        await c.journal.close()


class TestFlood:
    async def test_alike_events_past_the_burst_become_one_row_and_none_is_lost(self, make):
        """1000 copies of one Xid: 3 rows of their own, the rest in one coalesced row; every
        number is journaled exactly once and the last ack covers them all."""
        c = make(repeat_burst=3)
        context = await c.stream(*(xid(n) for n in range(1, 1001)))
        rows = c.reader.events(node=NODE, limit=10_000)
        assert [r.seq for r in rows] == [1, 2, 3, 1000]
        assert parse_repeats(rows[-1].detail) is not None
        assert rows[-1].detail.startswith("[repeated 997 times over ")
        assert c.seqs() == list(range(1, 1001))
        assert context.acks() == [1, 2, 3, 1000]
        assert (c.stats.events_journaled, c.stats.events_coalesced) == (1000, 997)
        assert c.fleet.snapshot()[NODE].gpus[UUID].xid_counts[13] == 1000
        assert c.registry.throttle.snapshot()[0].coalesced == 997

    async def test_another_event_journals_the_held_run_first_so_acks_stay_in_order(self, make):
        """A held run is committed before a different event, so acks never pass it."""
        c = make(repeat_burst=1)
        other = xid(6, xid_=31)
        context = await c.stream(*(xid(n) for n in range(1, 6)), other, xid(7))
        assert [r.seq for r in c.reader.events(node=NODE)] == [1, 5, 6, 7]
        assert context.acks() == [1, 5, 6, 7]
        assert c.seqs() == list(range(1, 8))

    async def test_a_replay_into_a_coalesced_range_is_a_duplicate(self, make):
        """After a reconnect the agent sends numbers a coalesced row covers: acked, dropped."""
        c = make(repeat_burst=2)
        await c.stream(*(xid(n) for n in range(1, 21)))
        context = await c.stream(*(xid(n) for n in range(10, 23)))
        assert c.seqs() == list(range(1, 23))
        assert c.stats.events_duplicate == 11
        assert context.acks()[-1] == 22
        assert context.sent[0].welcome.journaled.seq == 20

    async def test_events_alike_but_far_apart_in_time_are_not_coalesced(self, make):
        """A replayed backlog of one Xid once a second (by the agent's clock) is not a flood."""
        c = make(repeat_burst=2)
        await c.stream(*(xid(n, time_ms=NOW_MS + n * 1000) for n in range(1, 51)))
        rows = c.reader.events(node=NODE, limit=100)
        assert len(rows) == 50
        assert all(occurrences(r.detail) == 1 for r in rows)


class TestBudget:
    async def test_a_node_over_its_budget_waits_and_loses_nothing(self, make):
        """50 events at 10 a second with a burst of 5: 4.5 s of waiting, all 50 journaled."""
        c = make(events_per_s=10.0, event_burst=5.0)
        start = c.clock.monotonic()
        await c.stream(*(xid(n, xid_=n % 7 + 1) for n in range(1, 51)))
        assert c.clock.monotonic() - start == pytest.approx(4.5, abs=0.05)
        (view,) = c.registry.throttle.snapshot()
        assert view.throttled_s["events"] == pytest.approx(4.5, abs=0.05)
        assert view.throttled["events"] == 45
        assert c.seqs() == list(range(1, 51))

    async def test_samples_are_charged_to_their_own_budget(self, make):
        """A report of 300 samples against 100/s with a burst of 100 waits 2 s."""
        c = make(samples_per_s=100.0, sample_burst=100.0)
        gpu = pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=UUID)
        samples = [pb.Sample(target=gpu, signal=f"s{i}", int_value=i) for i in range(300)]
        await c.stream(pb.AgentMessage(report=pb.Report(samples=samples)))
        (view,) = c.registry.throttle.snapshot()
        assert view.throttled_s == {"events": 0.0, "samples": pytest.approx(2.0)}


class TestHostileValues:
    async def test_bad_samples_cost_only_themselves_and_are_counted(self, make):
        """A report with NaN-free but impossible values keeps the stream and the good samples."""
        c = make()
        gpu = pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=UUID)
        report = pb.Report(
            time_unix_ms=NOW_MS,
            samples=[
                pb.Sample(target=gpu, signal="temperature_celsius", real_value=1e12),
                pb.Sample(target=gpu, signal="power_watts", real_value=-5.0),
                pb.Sample(target=gpu, signal="power_watts", real_value=350.0),
                pb.Sample(target=gpu, signal="nvlink_up", int_value=1),  # a GPU target: fine
            ],
        )
        context = await c.stream(pb.AgentMessage(report=report), xid(1))
        assert context.aborted is None
        assert dict(c.stats.samples_rejected) == {"out_of_range": 1, "negative": 1}
        gpu_state = c.fleet.snapshot()[NODE].gpus[UUID]
        assert gpu_state.number("power_watts") == 350.0
        assert gpu_state.number("temperature_celsius") is None
        assert context.acks() == [1]

    async def test_a_counter_going_down_is_taken_as_a_reset_and_counted(self, make):
        """ECC counts 9 then 2: the model holds 2, and one reset is counted; a gauge going down
        is not a reset."""
        c = make()
        gpu = pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=UUID)

        def report(ecc: int, temp: int) -> pb.AgentMessage:
            return pb.AgentMessage(
                report=pb.Report(
                    samples=[
                        pb.Sample(target=gpu, signal="ecc_sbe_volatile_total", int_value=ecc),
                        pb.Sample(target=gpu, signal="temperature_celsius", int_value=temp),
                    ]
                )
            )

        await c.stream(report(9, 80), report(2, 40))
        assert c.stats.counter_resets == 1
        assert c.fleet.snapshot()[NODE].gpus[UUID].number("ecc_sbe_volatile_total") == 2

    async def test_an_event_from_a_wrong_clock_is_journaled_at_receipt(self, make):
        """Stamped 10 years ahead or in 1970: journaled with the collector's time, the agent's
        noted in the detail, counted by reason; nothing is refused."""
        c = make()
        future = NOW_MS + 10 * 365 * 86_400_000
        await c.stream(xid(1, time_ms=future), xid(2, xid_=31, time_ms=1), xid(3, xid_=43))
        rows = c.reader.events(node=NODE)
        assert [r.time_ms for r in rows] == [NOW_MS] * 3
        assert f"agent time {future} ms is in the future" in rows[0].detail
        assert "agent time 1 ms is in the past" in rows[1].detail
        assert dict(c.stats.bad_times) == {"event_time_future": 1, "event_time_past": 1}

    async def test_report_times_going_backwards_are_counted(self, make):
        """Reports are placed by receipt; a report clock that steps back is only counted."""
        c = make()
        times = [NOW_MS, NOW_MS + 1000, NOW_MS + 500, 0, NOW_MS + 2000]
        await c.stream(*(pb.AgentMessage(report=pb.Report(time_unix_ms=t)) for t in times))
        assert dict(c.stats.bad_times) == {"report_time_backwards": 1}
        assert c.stats.reports == 5


class TestSequence:
    async def test_a_stream_that_starts_past_a_gap_is_refused_and_nothing_is_acked(self, make):
        """The journal holds 1-3; a new stream's first event is 5: the ack for 5 would say 4 is
        journaled, so the stream is refused, naming the gap, and counted; 4 then 5 is taken."""
        c = make()
        await c.stream(xid(1), xid(2), xid(3))
        context = await c.stream(xid(5), xid(6))
        assert context.aborted is not None
        code, details = context.aborted
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "event seq 5 skips 4" in details
        assert "through 3" in details
        assert context.acks() == []
        assert c.seqs() == [1, 2, 3]
        assert c.stats.rejected["seq_gap"] == 1
        assert c.stats.seq_gaps == 1
        context = await c.stream(xid(4), xid(5))
        assert context.aborted is None
        assert context.acks() == [4, 5]
        assert c.seqs() == [1, 2, 3, 4, 5]

    async def test_a_first_stream_must_start_at_one(self, make):
        """Nothing journaled for the boot: a first event numbered 3 skips 1..2."""
        c = make()
        context = await c.stream(xid(3))
        assert context.aborted is not None
        assert "event seq 3 skips 1..2" in context.aborted[1]
        assert "the Hello said no resume_seq" in context.aborted[1]
        assert c.seqs() == []

    async def test_a_gap_the_hello_declared_settled_is_taken_and_counted(self, make):
        """The agent says numbers below 5 were acked elsewhere or lost (resume_seq 5): with 1-3
        journaled, its stream may start at 5 (counted as a gap, not refused), but not at 6."""
        c = make()
        await c.stream(xid(1), xid(2), xid(3))
        hello = pb.Hello()
        hello.CopyFrom(HELLO)
        hello.resume_seq = 5
        refused = await c.stream(xid(6), hello=hello)
        assert refused.aborted is not None
        assert "event seq 6 skips 4..5" in refused.aborted[1]
        assert "resume_seq 5" in refused.aborted[1]
        context = await c.stream(xid(5), xid(6), hello=hello)
        assert context.aborted is None
        assert context.acks() == [5, 6]
        assert [r.seq for r in c.reader.events(node=NODE)] == [1, 2, 3, 5, 6]
        assert c.stats.seq_gaps == 2
        assert c.stats.rejected["seq_gap"] == 1

    async def test_a_replay_below_the_journal_is_still_acked(self, make):
        """Numbers already journaled (a replay) are no gap: acked again and dropped."""
        c = make()
        await c.stream(xid(1), xid(2), xid(3))
        context = await c.stream(xid(2), xid(3), xid(4))
        assert context.aborted is None
        assert context.acks() == [2, 3, 4]
        assert c.seqs() == [1, 2, 3, 4]


class TestJournalRefusal:
    async def test_an_event_the_database_refuses_ends_its_own_stream_with_a_clear_status(
        self, make, tmp_path: Path
    ):
        """A row the journal's database refuses (here a trigger in the real SQLite file, as a
        constraint would) ends the stream that sent it with a status naming the event, counted;
        what came before it stays journaled and acked."""
        c = make()
        with sqlite3.connect(tmp_path / "journal.db") as db:
            db.execute(
                "CREATE TRIGGER refuse_poison BEFORE INSERT ON events "
                "WHEN NEW.detail LIKE '%poison%' BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
            )
        poison = xid(2, xid_=31)
        poison.event.detail = "poison"
        context = await c.stream(xid(1), poison, xid(3, xid_=43))
        assert context.aborted is not None
        code, details = context.aborted
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "event seq 2 could not be journaled" in details
        assert "poisoned row" in details
        assert context.acks() == [1]
        assert c.seqs() == [1]
        assert c.stats.rejected["journal_refused"] == 1


class TestXidClass:
    async def test_the_collector_s_catalog_classes_events_and_the_agent_s_is_only_logged(
        self, make
    ):
        """An agent whose catalog is not the collector's (Xid 13 sent as "bus", the collector's
        copy says "memory"): the journal holds the collector's class, for a coalesced row too,
        and the agent's is logged as what it said."""
        c = make(repeat_burst=1)
        c.catalog = parse_catalog(
            "version: 1\nxids:\n"
            "  13: {name: Graphics engine exception, class: memory, action: IGNORE, fatal: false}\n"
        )
        sent = [xid(n) for n in range(1, 4)]
        for message in sent:
            message.event.xid_class = "bus"
        with capture_logs() as logs:
            await c.stream(*sent)
        rows = c.reader.events(node=NODE)
        assert [(r.seq, r.xid_class) for r in rows] == [(1, "memory"), (3, "memory")]
        said = [e for e in logs if e["event"] == "xid_class_differs"]
        assert [(e["xid"], e["agent_said"], e["xid_class"]) for e in said] == [
            (13, "bus", "memory")
        ]


class TestSettle:
    async def test_a_new_stream_waits_for_the_old_streams_commit(self):
        """settle() returns only once the node's write in flight is done."""
        registry = SessionRegistry()
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def write() -> None:
            await gate

        task = asyncio.ensure_future(write())
        registry.track_write("n1", task)
        settling = asyncio.ensure_future(registry.settle("n1"))
        for _ in range(5):  # turns enough for settle() to return, were it not waiting
            await asyncio.sleep(0)
        assert not settling.done()
        gate.set_result(None)
        await asyncio.wait_for(settling, 1)
        await registry.settle("n2")  # nothing in flight: at once
