"""The SQLite journal's files are the collector's alone, however it was started."""

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.store.sqlite import JournalReader, SqliteStore
from collector.testing import event_row


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A shell's usual umask (022), as outside systemd's UMask=0077; the old one afterwards."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("open_umask")
class TestJournalFileModes:
    def test_a_new_journal_and_its_wal_files_are_owner_only(self, tmp_path: Path):
        """Under umask 022 SQLite would make the journal 0644; it is 0600, and so are the -wal
        and -shm files SQLite creates beside it, after a write and a read."""
        path = tmp_path / "state" / "journal.db"
        store = SqliteStore(path)
        store.insert_events([event_row(1)])
        assert JournalReader(path).count() == 1
        files = {p.name: mode(p) for p in path.parent.iterdir()}
        assert files == {"journal.db": 0o600, "journal.db-wal": 0o600, "journal.db-shm": 0o600}
        store.close()

    def test_an_existing_journal_keeps_its_mode(self, tmp_path: Path):
        """A journal someone made group-readable on purpose (for backups) is not changed."""
        path = tmp_path / "journal.db"
        SqliteStore(path).close()
        path.chmod(0o640)
        store = SqliteStore(path)
        store.insert_events([event_row(1)])
        assert mode(path) == 0o640
        store.close()
