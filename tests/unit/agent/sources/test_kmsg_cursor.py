import errno
import json
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import agent.sources.kmsg_cursor as cursor_module
from agent.sources.kmsg import KmsgRecord
from agent.sources.kmsg_cursor import KmsgCursor, filter_new

BOOT = "3f1c2a9e-5b7d-4e60-8a21-9c0d4b6e7f12"
OTHER_BOOT = "b2e4d6f8-0a1c-4e3f-9b5d-7c9e1a3b5d70"


def record(seq: int) -> KmsgRecord:
    return KmsgRecord(seq=seq, ts_us=seq * 10, level=4, facility=0, text=f"line {seq}")


def seqs(records: list[KmsgRecord]) -> list[int]:
    return [r.seq for r in records]


class TestKmsgCursor:
    def test_save_then_load_gives_the_sequence_number(self, tmp_path: Path):
        """A restarted agent of the same boot gets back the last number saved."""
        path = tmp_path / "kmsg-cursor.json"
        KmsgCursor(path, BOOT).save(2704)
        assert KmsgCursor(path, BOOT).load() == 2704

    def test_missing_file_is_no_cursor_and_no_error(self, tmp_path: Path):
        """The first start of a boot has no cursor; that is normal, not an error."""
        cursor = KmsgCursor(tmp_path / "kmsg-cursor.json", BOOT)
        with capture_logs() as logs:
            assert cursor.load() is None
        assert cursor.errors == 0
        assert logs == []

    def test_cursor_of_another_boot_is_ignored(self, tmp_path: Path):
        """Sequence numbers start again every boot, so an old boot's cursor means nothing."""
        path = tmp_path / "kmsg-cursor.json"
        KmsgCursor(path, OTHER_BOOT).save(99_000)
        cursor = KmsgCursor(path, BOOT)
        with capture_logs() as logs:
            assert cursor.load() is None
        assert cursor.errors == 0
        assert [e["event"] for e in logs] == ["kmsg_cursor_other_boot"]

    def test_save_creates_parent_directories(self, tmp_path: Path):
        """The state directory may not exist yet on a fresh node."""
        path = tmp_path / "var" / "lib" / "fleetwatch" / "kmsg-cursor.json"
        KmsgCursor(path, BOOT).save(7)
        assert json.loads(path.read_text("utf-8")) == {"version": 1, "boot_id": BOOT, "seq": 7}

    def test_save_replaces_atomically_and_leaves_no_temporary_files(self, tmp_path: Path):
        """Each save replaces the whole file; nothing but the cursor is left behind."""
        path = tmp_path / "kmsg-cursor.json"
        cursor = KmsgCursor(path, BOOT)
        cursor.save(10)
        inode = path.stat().st_ino
        cursor.save(11)
        assert path.stat().st_ino != inode
        assert [p.name for p in tmp_path.iterdir()] == ["kmsg-cursor.json"]
        assert KmsgCursor(path, BOOT).load() == 11

    def test_saving_the_same_number_again_writes_nothing(self, tmp_path: Path):
        """A poll with no new records costs no disk write."""
        path = tmp_path / "kmsg-cursor.json"
        cursor = KmsgCursor(path, BOOT)
        cursor.save(10)
        inode = path.stat().st_ino
        cursor.save(10)
        assert path.stat().st_ino == inode

    @pytest.mark.parametrize(
        "content",
        [
            b"",
            b"{not json",
            b"\xff\xfe\x00garbage",
            b"[1, 2, 3]",
            b'{"version": 2, "boot_id": "x", "seq": 1}',
            b'{"version": 1, "boot_id": "3f1c2a9e-5b7d-4e60-8a21-9c0d4b6e7f12", "seq": "12"}',
            b'{"version": 1, "boot_id": "3f1c2a9e-5b7d-4e60-8a21-9c0d4b6e7f12", "seq": -1}',
            b'{"version": 1, "boot_id": "3f1c2a9e-5b7d-4e60-8a21-9c0d4b6e7f12", "seq": true}',
            b'{"version": 1, "boot_id": 7, "seq": 12}',
            b"[" * 100_000,
        ],
    )
    def test_corrupt_file_is_logged_counted_and_ignored(self, tmp_path: Path, content: bytes):
        """A damaged cursor reads as no cursor, with a warning and a count, never an exception."""
        path = tmp_path / "kmsg-cursor.json"
        path.write_bytes(content)
        cursor = KmsgCursor(path, BOOT)
        with capture_logs() as logs:
            assert cursor.load() is None
        assert cursor.errors == 1
        assert [(e["event"], e["log_level"]) for e in logs] == [("kmsg_cursor_corrupt", "warning")]
        assert logs[0]["path"] == str(path)

    def test_unreadable_file_is_logged_counted_and_ignored(self, tmp_path: Path):
        """A cursor path that cannot be read (here a directory) is counted, not raised."""
        path = tmp_path / "kmsg-cursor.json"
        path.mkdir()
        cursor = KmsgCursor(path, BOOT)
        with capture_logs() as logs:
            assert cursor.load() is None
        assert cursor.errors == 1
        assert [e["event"] for e in logs] == ["kmsg_cursor_unreadable"]

    def test_corrupt_file_is_replaced_by_the_next_save(self, tmp_path: Path):
        """After a damaged file, saving writes a good cursor again."""
        path = tmp_path / "kmsg-cursor.json"
        path.write_bytes(b"{oops")
        cursor = KmsgCursor(path, BOOT)
        with capture_logs():
            assert cursor.load() is None
        cursor.save(40)
        assert KmsgCursor(path, BOOT).load() == 40

    def test_failed_write_is_logged_counted_and_keeps_the_old_file(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ):
        """A write that fails (disk full) leaves the old cursor and no temporary file behind."""
        path = tmp_path / "kmsg-cursor.json"
        cursor = KmsgCursor(path, BOOT)
        cursor.save(5)

        def disk_full(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fsync", disk_full)
        with capture_logs() as logs:
            cursor.save(6)
        monkeypatch.undo()
        assert cursor.errors == 1
        assert [(e["event"], e["error"]) for e in logs] == [
            ("kmsg_cursor_save_failed", "No space left on device"),
        ]
        assert [p.name for p in tmp_path.iterdir()] == ["kmsg-cursor.json"]
        assert KmsgCursor(path, BOOT).load() == 5

    def test_unwritable_directory_is_logged_and_counted(self, tmp_path: Path):
        """A state directory that cannot be created (a file in the way) is counted, not raised."""
        blocker = tmp_path / "state"
        blocker.write_text("x")
        cursor = KmsgCursor(blocker / "kmsg-cursor.json", BOOT)
        with capture_logs() as logs:
            cursor.save(6)
        assert cursor.errors == 1
        assert [e["event"] for e in logs] == ["kmsg_cursor_save_failed"]

    def test_failed_save_is_retried_by_the_next_save(self, tmp_path: Path):
        """A failed save does not count as saved, so the same number is written next time."""
        blocker = tmp_path / "state"
        blocker.write_text("x")
        path = blocker / "kmsg-cursor.json"
        cursor = KmsgCursor(path, BOOT)
        with capture_logs():
            cursor.save(8)
        blocker.unlink()
        cursor.save(8)
        assert KmsgCursor(path, BOOT).load() == 8

    @pytest.mark.parametrize("seq", [-1, True, 1.5])
    def test_save_refuses_what_is_not_a_sequence_number(self, tmp_path: Path, seq):
        """Saving a negative or non-integer number is a programming error and says so."""
        with pytest.raises(ValueError, match="sequence numbers"):
            KmsgCursor(tmp_path / "c.json", BOOT).save(seq)

    def test_boot_id_is_required(self, tmp_path: Path):
        """Without a boot id a cursor could not tell boots apart, so it is refused."""
        with pytest.raises(ValueError, match="boot id"):
            KmsgCursor(tmp_path / "c.json", "")


class TestFilterNew:
    def test_keeps_only_records_after_the_cursor(self):
        """Records up to and including the saved number were handled by the earlier process."""
        records = [record(s) for s in (2700, 2701, 2702, 2703, 2704)]
        assert seqs(filter_new(records, 2702)) == [2703, 2704]

    def test_no_cursor_keeps_everything(self):
        """Without a cursor (new boot, first start) every record is new."""
        records = [record(s) for s in (1, 2, 3)]
        assert seqs(filter_new(records, None)) == [1, 2, 3]

    def test_everything_old_gives_nothing(self):
        """Re-reading the ring buffer up to the cursor reports nothing again."""
        assert filter_new([record(s) for s in (10, 11, 12)], 12) == []

    def test_sequence_restart_keeps_the_records_after_it(self):
        """Numbers that go backwards mean a new log, so what follows is new despite the cursor."""
        records = [record(s) for s in (500, 501, 3, 4)]
        assert seqs(filter_new(records, 501)) == [3, 4]

    def test_accepts_any_iterable_and_keeps_order(self):
        """A generator works and the kept records stay in log order."""
        assert seqs(filter_new((record(s) for s in (5, 7, 9)), 6)) == [7, 9]


class TestPublicNames:
    def test_all_lists_the_public_names(self):
        """``__all__`` names exactly the module's public classes, functions and constants."""
        public = {
            name
            for name, value in vars(cursor_module).items()
            if not name.startswith("_")
            and (
                getattr(value, "__module__", None) == cursor_module.__name__
                or (name.isupper() and name != "TYPE_CHECKING")
            )
        }
        assert set(cursor_module.__all__) == public
