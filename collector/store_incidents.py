"""Incidents, actions and silences in the SQLite journal (schema version 2).

Every action is written before it runs and again with its outcome; its idempotency key is unique,
so the same action of the same incident can never be recorded (or run) twice, even across a
collector restart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Sequence

SCHEMA_V2: Final = """
CREATE TABLE IF NOT EXISTS incidents (
    id            TEXT PRIMARY KEY,
    rule          TEXT    NOT NULL,
    node          TEXT    NOT NULL,
    target        TEXT    NOT NULL,
    severity      TEXT    NOT NULL,
    phase         TEXT    NOT NULL,   -- pending, firing, resolved, dropped
    started_ms    INTEGER NOT NULL,
    fired_ms      INTEGER,
    resolved_ms   INTEGER,
    evidence      TEXT    NOT NULL DEFAULT '',
    escalated     INTEGER NOT NULL DEFAULT 0,
    firings       INTEGER NOT NULL DEFAULT 0,
    suppressed_by TEXT,
    silenced_by   TEXT,
    updated_ms    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_open ON incidents (phase, updated_ms);
CREATE TABLE IF NOT EXISTS actions (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT    NOT NULL UNIQUE,
    incident_id     TEXT    NOT NULL,
    action          TEXT    NOT NULL,
    node            TEXT    NOT NULL,
    target          TEXT    NOT NULL,
    params          TEXT    NOT NULL DEFAULT '{}',
    state           TEXT    NOT NULL,  -- planned, running, succeeded, failed, skipped, dry_run,
                                     -- deferred, refused
    detail          TEXT    NOT NULL DEFAULT '',
    created_ms      INTEGER NOT NULL,
    finished_ms     INTEGER
);
CREATE INDEX IF NOT EXISTS actions_by_incident ON actions (incident_id);
CREATE INDEX IF NOT EXISTS actions_by_node ON actions (node, created_ms);
CREATE TABLE IF NOT EXISTS silences (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    node        TEXT    NOT NULL DEFAULT '*',   -- a node name, or * for every node
    rule        TEXT    NOT NULL DEFAULT '*',   -- a rule name, or * for every rule
    starts_ms   INTEGER NOT NULL,
    ends_ms     INTEGER NOT NULL,
    reason      TEXT    NOT NULL DEFAULT '',
    created_ms  INTEGER NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class IncidentRow:
    """An incident as journaled (times are Unix milliseconds)."""

    id: str
    rule: str
    node: str
    target: str
    severity: str
    phase: str
    started_ms: int
    updated_ms: int
    fired_ms: int | None = None
    resolved_ms: int | None = None
    evidence: str = ""
    escalated: bool = False
    firings: int = 0
    suppressed_by: str | None = None
    silenced_by: str | None = None


@dataclass(frozen=True, slots=True)
class ActionRow:
    """An action as journaled."""

    idempotency_key: str
    incident_id: str
    action: str
    node: str
    target: str
    state: str
    created_ms: int
    params: dict[str, Any]
    detail: str = ""
    finished_ms: int | None = None
    id: int = 0


@dataclass(frozen=True, slots=True)
class SilenceRow:
    """A silence (or maintenance window): matching incidents run no actions."""

    node: str
    rule: str
    starts_ms: int
    ends_ms: int
    reason: str
    created_ms: int
    id: int = 0

    def matches(self, node: str, rule: str, at_ms: int) -> bool:
        """Whether it silences ``rule`` on ``node`` at ``at_ms``."""
        return (
            self.starts_ms <= at_ms < self.ends_ms
            and self.node in ("*", node)
            and self.rule in ("*", rule)
        )


_INCIDENT_COLUMNS: Final = (
    "id, rule, node, target, severity, phase, started_ms, updated_ms, fired_ms, resolved_ms, "
    "evidence, escalated, firings, suppressed_by, silenced_by"
)
_ACTION_COLUMNS: Final = (
    "id, idempotency_key, incident_id, action, node, target, state, created_ms, params, detail, "
    "finished_ms"
)


def _incident(row: Sequence[Any]) -> IncidentRow:
    (
        iid,
        rule,
        node,
        target,
        sev,
        phase,
        started,
        updated,
        fired,
        resolved,
        ev,
        esc,
        n,
        sup,
        sil,
    ) = row
    return IncidentRow(
        iid,
        rule,
        node,
        target,
        sev,
        phase,
        started,
        updated,
        fired,
        resolved,
        ev,
        bool(esc),
        n,
        sup,
        sil,
    )


def _action(row: Sequence[Any]) -> ActionRow:
    (aid, key, incident, action, node, target, state, created, params, detail, finished) = row
    return ActionRow(
        key,
        incident,
        action,
        node,
        target,
        state,
        created,
        json.loads(params),
        detail,
        finished,
        aid,
    )


class IncidentStore:
    """Incident, action and silence rows on a journal connection (used from its writer thread)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        """Share the journal's connection."""
        self._conn = conn

    def upsert_incident(self, row: IncidentRow) -> None:
        """Write an incident's current state."""
        self._conn.execute(
            f"INSERT OR REPLACE INTO incidents ({_INCIDENT_COLUMNS}) "  # noqa: S608 - constant
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                row.id,
                row.rule,
                row.node,
                row.target,
                row.severity,
                row.phase,
                row.started_ms,
                row.updated_ms,
                row.fired_ms,
                row.resolved_ms,
                row.evidence,
                int(row.escalated),
                row.firings,
                row.suppressed_by,
                row.silenced_by,
            ),
        )

    def incidents(self, *, open_only: bool = False, limit: int = 100) -> list[IncidentRow]:
        """Incidents, newest first (only pending and firing ones with ``open_only``)."""
        where = "WHERE phase IN ('pending', 'firing')" if open_only else ""
        rows = self._conn.execute(
            f"SELECT {_INCIDENT_COLUMNS} FROM incidents {where} "  # noqa: S608 - constant
            "ORDER BY updated_ms DESC, id LIMIT ?",
            (limit,),
        ).fetchall()
        return [_incident(r) for r in rows]

    def add_action(self, row: ActionRow) -> tuple[int, bool]:
        """Record a planned action: (id, True) when new.

        (existing id, False) when its idempotency key was journaled before.
        """
        cur = self._conn.execute(
            "INSERT OR IGNORE INTO actions (idempotency_key, incident_id, action, node, target, "
            "state, created_ms, params, detail, finished_ms) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                row.idempotency_key,
                row.incident_id,
                row.action,
                row.node,
                row.target,
                row.state,
                row.created_ms,
                json.dumps(row.params, sort_keys=True),
                row.detail,
                row.finished_ms,
            ),
        )
        if cur.rowcount == 1:
            return int(cur.lastrowid or 0), True
        (existing,) = self._conn.execute(
            "SELECT id FROM actions WHERE idempotency_key = ?",
            (row.idempotency_key,),
        ).fetchone()
        return int(existing), False

    def finish_action(self, action_id: int, state: str, detail: str, finished_ms: int) -> None:
        """Record an action's outcome."""
        self._conn.execute(
            "UPDATE actions SET state = ?, detail = ?, finished_ms = ? WHERE id = ?",
            (state, detail[:2000], finished_ms, action_id),
        )

    def reopen_action(self, action_id: int, state: str) -> None:
        """An action that waited (deferred) is about to run after all."""
        self._conn.execute(
            "UPDATE actions SET state = ?, detail = '', finished_ms = NULL WHERE id = ?",
            (state, action_id),
        )

    def actions(self, *, node: str | None = None, limit: int = 100) -> list[ActionRow]:
        """Actions, newest first."""
        sql = f"SELECT {_ACTION_COLUMNS} FROM actions"  # noqa: S608 - constant
        params: list[object] = []
        if node is not None:
            sql += " WHERE node = ?"
            params.append(node)
        rows = self._conn.execute(f"{sql} ORDER BY id DESC LIMIT ?", (*params, limit)).fetchall()
        return [_action(r) for r in rows]

    def unfinished_actions(self) -> list[ActionRow]:
        """Actions journaled as planned or running (a restart must settle them, not rerun)."""
        rows = self._conn.execute(
            f"SELECT {_ACTION_COLUMNS} FROM actions "  # noqa: S608 - constant
            "WHERE state IN ('planned', 'running') ORDER BY id",
        ).fetchall()
        return [_action(r) for r in rows]

    def add_silence(self, row: SilenceRow) -> int:
        """Store a silence; return its id."""
        cur = self._conn.execute(
            "INSERT INTO silences (node, rule, starts_ms, ends_ms, reason, created_ms) "
            "VALUES (?,?,?,?,?,?)",
            (row.node, row.rule, row.starts_ms, row.ends_ms, row.reason, row.created_ms),
        )
        return int(cur.lastrowid or 0)

    def remove_silence(self, silence_id: int) -> bool:
        """Delete a silence; False when there was none with that id."""
        cur = self._conn.execute("DELETE FROM silences WHERE id = ?", (silence_id,))
        return cur.rowcount == 1

    def silences(self, *, active_at_ms: int | None = None) -> list[SilenceRow]:
        """Silences (those not over yet at ``active_at_ms``, when given)."""
        sql = "SELECT node, rule, starts_ms, ends_ms, reason, created_ms, id FROM silences"
        params: tuple[object, ...] = ()
        if active_at_ms is not None:
            sql += " WHERE ends_ms > ?"
            params = (active_at_ms,)
        rows = self._conn.execute(f"{sql} ORDER BY id", params).fetchall()
        return [SilenceRow(*r) for r in rows]
