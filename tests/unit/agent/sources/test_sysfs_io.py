import errno
import os
from pathlib import Path

import pytest

from agent.sources.sysfs_io import FdBudget, OpenFiles, read_files


@pytest.fixture
def counters(tmp_path: Path) -> Path:
    for name, value in (("symbol_error", 3), ("link_downed", 0), ("port_xmit_wait", 9)):
        (tmp_path / name).write_text(f"{value}\n")
    return tmp_path


NAMES = ("link_downed", "port_xmit_wait", "symbol_error")


def kept(files: OpenFiles) -> dict[str, int] | None:
    """The descriptors a set keeps (a function, so each look is fresh to the type checker)."""
    return files._fds


class TestOpenFiles:
    def test_kept_descriptors_see_new_values(self, counters: Path):
        """Re-reading from offset 0 through a kept descriptor gives the current value."""
        budget = FdBudget(10)
        files = OpenFiles(str(counters), NAMES, budget)
        assert files.read().data["symbol_error"] == b"3\n"
        assert budget.used == 3
        (counters / "symbol_error").write_text("40\n")
        assert files.read().data["symbol_error"] == b"40\n"
        files.close()
        assert budget.used == 0

    def test_without_budget_it_reads_the_usual_way(self, counters: Path):
        """With no descriptors to spare, every read opens and closes, with the same result."""
        budget = FdBudget(2)
        files = OpenFiles(str(counters), NAMES, budget)
        first = files.read()
        assert budget.used == 0
        assert first.data == read_files(str(counters), NAMES).data

    def test_a_failing_descriptor_is_dropped_and_reopened(self, counters: Path):
        """When a kept descriptor fails, this read falls back and the next one reopens."""
        budget = FdBudget(10)
        files = OpenFiles(str(counters), NAMES, budget)
        files.read()
        fds = kept(files)
        assert fds is not None
        os.close(fds["port_xmit_wait"])  # as if the device went away under us
        fds["port_xmit_wait"] = os.open(os.devnull, os.O_WRONLY)  # unreadable fd
        assert files.read().data["port_xmit_wait"] == b"9\n"
        assert kept(files) is None
        assert files.read().data["link_downed"] == b"0\n"
        assert kept(files) is not None
        files.close()

    def test_missing_file_is_reported_and_not_kept(self, counters: Path):
        """A file that is not there is listed as missing; nothing stays open for the set."""
        files = OpenFiles(str(counters), (*NAMES, "VL15_dropped"), FdBudget(10))
        batch = files.read()
        assert batch.missing == ["VL15_dropped"]
        assert kept(files) is None

    def test_out_of_descriptors_gives_up_keeping(self, counters: Path, monkeypatch):
        """EMFILE while opening stops keeping files open; values are still read."""
        real_open = os.open
        calls = {"n": 0}

        def open_or_emfile(path, flags, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError(errno.EMFILE, "Too many open files")
            return real_open(path, flags, *args, **kwargs)

        budget = FdBudget(10)
        files = OpenFiles(str(counters), NAMES, budget)
        monkeypatch.setattr(os, "open", open_or_emfile)
        batch = files.read()
        monkeypatch.undo()
        assert batch.data["symbol_error"] == b"3\n"
        assert budget.used == 0
        assert budget.limit == 0  # nobody keeps files open any more
