"""The file-backed simulated kernel log: written by one process, read by the agent of another."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from agent.sim.kmsg_file import FIRST_SEQ, KmsgFile, KmsgFileWriter
from agent.sources import kmsg as kmsg_module

if TYPE_CHECKING:
    from pathlib import Path


def test_reader_from_end_sees_only_later_records(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    writer = KmsgFileWriter(path)
    writer.write("before the agent")
    reader = KmsgFile(path, from_start=False)
    assert reader.read() == []
    seq = writer.write("NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, after")
    records = reader.read()
    assert [(r.seq, r.text) for r in records] == [
        (seq, "NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, after")
    ]
    assert reader.read() == []  # each record once


def test_reader_from_start_reads_what_an_earlier_agent_left(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    writer = KmsgFileWriter(path)
    for text in ("one", "two", "three"):
        writer.write(text)
    records = KmsgFile(path, from_start=True).read()
    assert [r.text for r in records] == ["one", "two", "three"]
    assert [r.seq for r in records] == [FIRST_SEQ, FIRST_SEQ + 1, FIRST_SEQ + 2]


def test_a_new_writer_numbers_on_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    KmsgFileWriter(path).write("first")
    assert KmsgFileWriter(path).write("second") == FIRST_SEQ + 1


def test_an_unfinished_record_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    reader = KmsgFile(path, from_start=True)
    with path.open("ab") as f:
        f.write(b"4,1300,10,-;half a li")
    assert reader.read() == []
    with path.open("ab") as f:
        f.write(b"ne\n")
    assert [r.text for r in reader.read()] == ["half a line"]


def test_malformed_records_are_counted_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(b"not a record\n4,1300,10,-;fine\n")
    reader = KmsgFile(path, from_start=True)
    assert [r.text for r in reader.read()] == ["fine"]
    assert reader.malformed == 1


def test_a_long_backlog_comes_in_bounded_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agent.sim.kmsg_file.MAX_RECORDS_PER_READ", 3)
    assert kmsg_module.MAX_RECORDS_PER_READ > 3  # the patch is local to the simulated source
    path = tmp_path / "kmsg"
    writer = KmsgFileWriter(path)
    for i in range(7):
        writer.write(f"line {i}")
    reader = KmsgFile(path, from_start=True)
    seen = [r.text for _ in range(4) for r in reader.read()]
    assert seen == [f"line {i}" for i in range(7)]


def test_a_record_text_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one line"):
        KmsgFileWriter(tmp_path / "kmsg").write("two\nlines")
