"""The journal behind ``bench/chaos.py``'s collectors: a SQLite file, or a PostgreSQL server.

Each kind says what the collectors' config needs (:meth:`config_lines`) and reads back, beside the
running collectors, how many journal rows carry each injected marker and how many nodes the
journal knows. The PostgreSQL one also owns the server (:class:`cli.dev.pg_server.PgServer`,
durable: fsync on, as in production), which the chaos run kills with SIGKILL and stops cleanly,
then starts again on the same data.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections import Counter
from typing import TYPE_CHECKING, Final, Protocol

import psycopg

from cli.dev.pg_server import PgServer

if TYPE_CHECKING:
    from pathlib import Path

MARKER: Final = re.compile(r"chaos-event-(\d+)")
MARKED: Final = "SELECT detail FROM events WHERE detail LIKE '%chaos-event-%'"
NODES: Final = "SELECT count(*) FROM nodes"


def count_markers(details: list[str]) -> Counter[int]:
    """How many of ``details`` carry each marker."""
    counts: Counter[int] = Counter()
    for detail in details:
        match = MARKER.search(detail)
        if match:
            counts[int(match[1])] += 1
    return counts


class ChaosJournal(Protocol):
    """What the chaos run needs of its journal."""

    kind: str

    def config_lines(self, name: str) -> str:
        """The ``[collector]`` lines that point collector ``name`` at this journal."""
        ...

    def markers(self) -> Counter[int]:
        """Journal rows per marker (empty when the journal cannot be read just now)."""
        ...

    def nodes(self) -> int:
        """Nodes the journal knows (0 when it cannot be read just now)."""
        ...

    def close(self) -> None:
        """Release what it holds (a server)."""
        ...


class SqliteJournal:
    """One collector's SQLite file, read read-only beside it."""

    kind = "sqlite"

    def __init__(self, path: Path) -> None:
        """The journal file ``path`` (the collector creates it)."""
        self.path = path

    def config_lines(self, name: str) -> str:  # noqa: ARG002 - one collector: no name needed
        """``journal = PATH``."""
        return f'journal = "{self.path}"\n'

    def _rows(self, sql: str) -> list[tuple[object, ...]]:
        with contextlib.suppress(sqlite3.Error):
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
            try:
                return conn.execute(sql).fetchall()
            finally:
                conn.close()
        return []

    def markers(self) -> Counter[int]:
        """Journal rows per marker."""
        return count_markers([str(detail) for (detail,) in self._rows(MARKED)])

    def nodes(self) -> int:
        """Nodes the journal knows."""
        rows = self._rows(NODES)
        return int(str(rows[0][0])) if rows else 0

    def close(self) -> None:
        """Nothing to release."""


class PostgresJournal:
    """A PostgreSQL server of its own, one database that every collector shares."""

    kind = "postgres"

    def __init__(self) -> None:
        """Start the server (durable) and create the database."""
        self.server = PgServer(durable=True)
        self.server.start()
        self.dsn = self.server.create_database("chaos")
        self.kills = 0
        self.restarts = 0

    def config_lines(self, name: str) -> str:
        """``journal_dsn`` and the collector's ``name`` in the shared journal."""
        return f'journal_dsn = "{self.dsn}"\nname = "{name}"\n'

    def _rows(self, sql: str) -> list[tuple[object, ...]]:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.dsn, connect_timeout=5) as conn,
        ):
            return list(conn.execute(sql).fetchall())
        return []

    def markers(self) -> Counter[int]:
        """Journal rows per marker."""
        return count_markers([str(detail) for (detail,) in self._rows(MARKED)])

    def nodes(self) -> int:
        """Nodes the journal knows."""
        rows = self._rows(NODES)
        return int(str(rows[0][0])) if rows else 0

    def kill(self) -> None:
        """SIGKILL the server."""
        if self.server.running:
            self.server.kill()
            self.kills += 1

    def shut_down(self) -> None:
        """Stop the server cleanly."""
        if self.server.running:
            self.server.shut_down()
            self.restarts += 1

    def bring_back(self) -> None:
        """Start the server again if it is down."""
        if not self.server.running:
            self.server.restart()

    @property
    def up(self) -> bool:
        """Whether the server runs."""
        return self.server.running

    def close(self) -> None:
        """Stop the server and remove its files."""
        self.server.stop()
