import errno
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.outbox.spool import Spool
from agent.outbox.spool_format import (
    EVENT,
    MAGIC,
    SegmentHeader,
    event_record,
    frame,
    parse_name,
    scan_segment,
    segment_name,
)
from agent.poll.findings import PendingEvent
from fleetwatch.model import EventKind, Target
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

BOOT = "3c1f9c2e-boot"


def ev(seq: int) -> pb.Event:
    pending = PendingEvent(
        EventKind.XID, Target.gpu("GPU-0000"), 1_000 + seq, xid=13, detail=f"m{seq}"
    )
    return pending.to_pb(seq)


def segments(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def seqs(events: list[pb.Event]) -> list[int]:
    return [e.seq for e in events]


class Quota:
    """os.write with a byte allowance, as on a disk that fills up (short writes, then ENOSPC)."""

    def __init__(self, allowance: int) -> None:
        self.left = allowance
        self.refused = 0

    def __call__(self, fd: int, data: bytes) -> int:
        if self.left <= 0:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, data[: self.left])
        self.left -= n
        return n


def filled(directory: Path, count: int, **kwargs: object) -> Spool:
    spool = Spool(directory, BOOT, **kwargs)  # type: ignore[arg-type]
    spool.open()
    for seq in range(1, count + 1):
        spool.append(ev(seq))
    assert spool.sync()
    return spool


class TestFormat:
    def test_records_round_trip(self):
        """A segment's header and events read back as written."""
        header = SegmentHeader(BOOT, 5, 4, confirmed=True)
        data = header.encode() + event_record(ev(5)) + event_record(ev(6))
        scan = scan_segment(data)
        assert scan.header == header
        assert seqs(scan.events) == [5, 6]
        assert scan.damage is None
        assert len(data) == scan.good_bytes

    @pytest.mark.parametrize(
        ("cut", "why"),
        [(3, "torn record frame"), (20, "torn record at byte")],
    )
    def test_a_torn_tail_keeps_what_came_before(self, cut, why):
        """A record cut short by a crash ends the scan; the records before it are kept."""
        whole = SegmentHeader(BOOT, 1, 0, confirmed=False).encode() + event_record(ev(1))
        second = event_record(ev(2))
        scan = scan_segment(whole + second[:cut])
        assert seqs(scan.events) == [1]
        assert len(whole) == scan.good_bytes
        assert why in (scan.damage or "")

    def test_a_flipped_bit_fails_the_checksum(self):
        """Rot inside a record is caught by its CRC, whatever the bytes still decode to."""
        good = SegmentHeader(BOOT, 1, 0, confirmed=False).encode() + event_record(ev(1))
        bad = bytearray(event_record(ev(2)))
        bad[-3] ^= 0x40
        scan = scan_segment(good + bytes(bad) + event_record(ev(3)))
        assert seqs(scan.events) == [1]
        assert "checksum mismatch" in (scan.damage or "")

    def test_garbage_lengths_and_types_are_damage(self):
        """An absurd length or an unknown record type stops the scan without reading on."""
        head = SegmentHeader(BOOT, 1, 0, confirmed=False).encode()
        huge = (0xFFFFFFF0).to_bytes(4, "little") + b"\0" * 5
        assert "impossible record length" in (scan_segment(head + huge).damage or "")
        assert "unknown record type" in (scan_segment(head + frame(9, b"x")).damage or "")
        assert "undecodable" in (scan_segment(head + frame(EVENT, b"\xff\xff")).damage or "")

    def test_a_file_that_is_not_a_segment_has_no_header(self):
        """Wrong magic, or no header record first, is damage from byte 0."""
        assert scan_segment(b"hello").header is None
        assert scan_segment(MAGIC + event_record(ev(1))).header is None
        assert scan_segment(MAGIC + frame(1, b"{}")).header is None

    def test_names_sort_by_epoch_then_number(self):
        """Segment names are zero-padded; other files are not segments."""
        assert parse_name(segment_name(3, 42)) == (3, 42)
        assert parse_name("notes.txt") is None
        assert segment_name(1, 9) < segment_name(1, 10) < segment_name(2, 1)


class TestRestart:
    def test_unacked_events_come_back_with_their_numbers(self, tmp_path: Path):
        """A new process of the same boot gets every event not acked, numbered as before (acks
        are not written one by one: acked events still in the active segment come back too,
        and the collector's journal drops them)."""
        spool = filled(tmp_path, 5)
        spool.ack(2)
        spool.close()
        again = Spool(tmp_path, BOOT)
        recovered = again.open()
        assert seqs(recovered.events) == [1, 2, 3, 4, 5]
        assert [e.detail for e in recovered.events] == ["m1", "m2", "m3", "m4", "m5"]
        assert recovered.next_seq == 6
        assert again.damaged == 0

    def test_everything_acked_leaves_only_the_next_number(self, tmp_path: Path):
        """A fully acked spool restores nothing but still knows which number comes next."""
        spool = filled(tmp_path, 3, compact_bytes=1)
        spool.ack(3)
        spool.close()
        recovered = Spool(tmp_path, BOOT).open()
        assert recovered.events == []
        assert recovered.next_seq == 4

    def test_events_written_but_not_synced_are_there_after_a_process_crash(self, tmp_path):
        """The page cache survives a process crash: appended events are read back."""
        spool = Spool(tmp_path, BOOT)
        spool.open()
        spool.append(ev(1))
        spool.close()
        assert seqs(Spool(tmp_path, BOOT).open().events) == [1]

    def test_another_boots_events_are_counted_and_removed(self, tmp_path: Path):
        """Events of a previous boot cannot be sent on this boot's stream: counted, logged, gone."""
        filled(tmp_path, 3).close()
        spool = Spool(tmp_path, "new-boot")
        with capture_logs() as logs:
            recovered = spool.open()
        assert recovered.events == []
        assert recovered.next_seq == 1
        assert spool.previous_boot_events == 3
        assert any(e["event"] == "spool_previous_boot_dropped" for e in logs)
        assert len(segments(tmp_path)) == 1  # only the new boot's segment

    def test_leftovers_of_an_unfinished_rewrite_are_ignored(self, tmp_path: Path):
        """A lower epoch is obsolete and a temporary file unfinished: both are removed."""
        spool = filled(tmp_path, 2)
        spool.rewrite([ev(2)], 3)
        spool.close()
        old = tmp_path / segment_name(0, 1)
        old.write_bytes(SegmentHeader(BOOT, 1, 0, confirmed=False).encode())
        (tmp_path / ".tmp-junk").write_bytes(b"half")
        recovered = Spool(tmp_path, BOOT).open()
        assert seqs(recovered.events) == [2]
        assert recovered.fixed_through == 2
        assert not old.exists()
        assert not (tmp_path / ".tmp-junk").exists()


class TestDamage:
    def test_a_torn_last_record_is_cut_off_once(self, tmp_path: Path):
        """A crash mid-write: the events before it are kept, the damage counted and cut off,
        so the next start finds a clean file."""
        filled(tmp_path, 4).close()
        path = tmp_path / segment_name(0, 1)
        path.write_bytes(path.read_bytes()[:-5])
        spool = Spool(tmp_path, BOOT)
        with capture_logs() as logs:
            recovered = spool.open()
        assert seqs(recovered.events) == [1, 2, 3]
        assert spool.damaged == 1
        assert any(e["event"] == "spool_damaged" and e["log_level"] == "error" for e in logs)
        spool.close()
        again = Spool(tmp_path, BOOT)
        assert seqs(again.open().events) == [1, 2, 3]
        assert again.damaged == 0

    def test_rot_in_an_old_segment_drops_what_no_longer_follows(self, tmp_path: Path):
        """Events after a hole in the numbers are not restored: sent after the hole, the
        collector would refuse the stream."""
        spool = filled(tmp_path, 2, segment_bytes=1)  # one event per segment
        for seq in (3, 4):
            spool.append(ev(seq))
            spool.sync()
        spool.close()
        names = segments(tmp_path)
        assert [parse_name(n) for n in names] == [(0, 1), (0, 3), (0, 4), (0, 5)]
        second = tmp_path / names[1]
        data = bytearray(second.read_bytes())
        data[-2] ^= 0x01
        second.write_bytes(bytes(data))
        again = Spool(tmp_path, BOOT)
        recovered = again.open()
        assert seqs(recovered.events) == [1, 2]
        assert again.damaged == 2  # the rotten record, and the gap after it
        assert not any(parse_name(n) == (0, 5) for n in segments(tmp_path))

    def test_a_header_that_does_not_read_is_damage_not_a_crash(self, tmp_path: Path):
        """A segment whose header is garbage is counted and removed."""
        (tmp_path / segment_name(0, 1)).write_bytes(b"\x00" * 64)
        spool = Spool(tmp_path, BOOT)
        recovered = spool.open()
        assert recovered.events == []
        assert spool.damaged == 1


class TestCompaction:
    def test_fully_acked_segments_are_deleted(self, tmp_path: Path):
        """Closed segments go once every event in them is acked; the spool does not grow."""
        spool = filled(tmp_path, 1, segment_bytes=100)
        for seq in range(2, 7):
            spool.append(ev(seq))
            spool.sync()
        before = spool.held_bytes
        assert len(segments(tmp_path)) > 2
        spool.ack(6)
        assert len(segments(tmp_path)) == 1
        assert spool.held_bytes < before

    def test_a_long_acked_active_segment_is_rotated_away(self, tmp_path: Path):
        """The active segment is replaced once fully acked and longer than compact_bytes."""
        spool = filled(tmp_path, 3, compact_bytes=100)
        spool.ack(3)
        names = segments(tmp_path)
        assert [parse_name(n) for n in names] == [(0, 4)]


class TestFullDisk:
    def test_refused_writes_keep_events_in_memory_and_retry(self, tmp_path: Path):
        """ENOSPC loses nothing: events wait in memory, failures are counted and logged once,
        and the next sync after space comes back writes them; a restart then finds them all."""
        quota = Quota(1 << 20)
        spool = Spool(tmp_path, BOOT, write=quota)
        spool.open()
        spool.append(ev(1))
        assert spool.sync()
        quota.left = 30  # room for part of one record
        with capture_logs() as logs:
            for seq in (2, 3, 4):
                spool.append(ev(seq))
            assert not spool.sync()
            assert not spool.sync()
        failed = [e for e in logs if e["event"] == "spool_write_failed"]
        assert [e["log_level"] for e in failed][:2] == ["error", "debug"]
        assert failed[0]["errno"] == "ENOSPC"
        assert spool.write_errors >= 2
        assert spool.backlog == 3
        quota.left = 1 << 20
        with capture_logs() as logs:
            assert spool.sync()
        assert any(e["event"] == "spool_write_recovered" for e in logs)
        assert spool.backlog == 0
        spool.close()
        again = Spool(tmp_path, BOOT)
        assert seqs(again.open().events) == [1, 2, 3, 4]

    def test_events_acked_while_the_disk_refuses_need_no_write(self, tmp_path: Path):
        """What the collector journaled while the disk was full is never written; a restart
        restores the rest without a hole."""
        quota = Quota(1 << 20)
        spool = Spool(tmp_path, BOOT, write=quota)
        spool.open()
        spool.append(ev(1))
        spool.sync()
        quota.left = 0
        for seq in (2, 3, 4):
            spool.append(ev(seq))
        spool.sync()
        spool.ack(3)
        assert spool.backlog == 1
        quota.left = 1 << 20
        assert spool.sync()
        spool.close()
        recovered = Spool(tmp_path, BOOT).open()
        assert seqs(recovered.events) == [4]
        assert recovered.next_seq == 5

    def test_a_failed_fsync_writes_the_batch_again(self, tmp_path: Path):
        """After fsync fails nothing since the last good one is trusted: it is written anew."""
        failures = [True]

        def fsync(fd: int) -> None:
            if failures and failures.pop():
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            os.fsync(fd)

        spool = Spool(tmp_path, BOOT, fsync=fsync)
        spool.open()  # the first fsync (of the new segment) fails: events wait in memory
        spool.append(ev(1))
        spool.append(ev(2))
        assert spool.sync()
        assert spool.write_errors == 1
        spool.close()
        assert seqs(Spool(tmp_path, BOOT).open().events) == [1, 2]

    def test_an_unusable_directory_is_a_write_error_not_a_crash(self, tmp_path: Path):
        """A spool directory that cannot be made keeps events in memory and says so."""
        blocker = tmp_path / "file"
        blocker.write_text("x")
        spool = Spool(blocker / "spool", BOOT)
        recovered = spool.open()
        assert recovered.events == []
        spool.append(ev(1))
        assert not spool.sync()
        assert spool.write_errors >= 2
        assert spool.backlog == 1
