"""Incidents, actions and silences in the journal (SQLite schema version 2 on; PostgreSQL).

Every action is written before it runs and again with its outcome; its idempotency key is unique,
so the same action of the same incident can never be recorded (or run) twice, even across a
collector restart. Where several collectors share a journal, :meth:`IncidentStore.decide_action`
makes the fleet-wide checks (drain cap, breaker, one drain per node and one reset per GPU) and
records the outcome in one transaction under the fleet lock, so two collectors cannot both pass
the same check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from collector.store.sql import where

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from collector.store.sql import SqlConn

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
    created_ms  INTEGER NOT NULL,
    created_by  TEXT    NOT NULL DEFAULT ''  -- who added it, as the API knew them (schema 6)
);
"""
# Schema 6 (SQLite; 3 on PostgreSQL): who added each silence. Silences from before say ''.
ADD_CREATED_BY: Final = "ALTER TABLE silences ADD COLUMN created_by TEXT NOT NULL DEFAULT '';"


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
    created_by: str = ""  # "token" or "loopback" (collector.api.auth); "" before schema 6

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


@dataclass(frozen=True, slots=True)
class FleetActions:
    """What every collector sharing the journal is doing to the fleet, read under the lock.

    ``drained``: node -> incident, for nodes a drain succeeded on and no resume or release has
    given back; ``draining``: nodes with a drain planned or running; ``resetting``: reset targets
    (GPU keys) planned or running; ``drains_since``: drains started within the breaker window;
    ``last_ms``: (action kind, where) -> the newest start of that action there, for cooldowns
    (where: the node, or for resets the incident's target; only starts within the cooldown when
    the caller gives one);
    ``breaker_open_until_ms``: when the fleet-wide breaker closes (0: closed); ``nodes``: how
    many nodes the journal knows; ``rebooting_now``: nodes with a reboot planned or running;
    ``rebooting``: those and the nodes a reboot succeeded on (within the reboot window the
    caller gives) that have not said hello from a new boot since (a node drained by a reboot
    counts in ``drained`` too).
    """

    drained: dict[str, str]
    draining: frozenset[str]
    resetting: frozenset[str]
    drains_since: int
    last_ms: dict[tuple[str, str], int]
    breaker_open_until_ms: int
    nodes: int = 0  # nodes the journal knows (every collector's): the fleet the cap is a share of
    rebooting_now: frozenset[str] = frozenset()
    rebooting: frozenset[str] = frozenset()


# What decide_action's callback answers: (state, why, open the breaker until ms or 0);
# "planned" runs the action.
Decision = tuple[str, str, int]
BREAKER_KEY: Final = "breaker_open_until_ms"


class IncidentStore:
    """Incident, action and silence rows on a journal connection (used from its writer thread)."""

    def __init__(self, db: SqlConn) -> None:
        """Share the journal's connection."""
        self._db = db

    def upsert_incident(self, row: IncidentRow) -> None:
        """Write an incident's current state."""
        updates = ", ".join(
            f"{c} = excluded.{c}" for c in _INCIDENT_COLUMNS.split(", ") if c != "id"
        )
        self._db.run(
            f"INSERT INTO incidents ({_INCIDENT_COLUMNS}) "  # noqa: S608 - constant
            f"VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (id) DO UPDATE SET {updates}",
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

    def record(
        self, incidents: Sequence[IncidentRow], actions: Sequence[ActionRow] = ()
    ) -> list[tuple[int, bool]]:
        """Write incidents' states and the actions they start with: each action's (id, new).

        One transaction (one statement alone needs none): a firing and its first actions are
        journaled together, or not at all.
        """
        if len(incidents) + len(actions) == 1 and incidents:
            self.upsert_incident(incidents[0])
            return []
        with self._db.transaction():
            for row in incidents:
                self.upsert_incident(row)
            return [self.add_action(action) for action in actions]

    def claim_firing(self, row: IncidentRow) -> IncidentRow | None:
        """Journal a newly firing incident unless another is firing for its rule and target.

        Under the fleet lock, so two collectors sharing the journal cannot both open one: the
        other incident is returned (and ``row`` not journaled, its pending row removed) when
        there is one.
        """
        with self._db.transaction():
            self._db.fleet_lock()
            found = self._db.rows(
                f"SELECT {_INCIDENT_COLUMNS} FROM incidents "  # noqa: S608 - constant
                "WHERE rule = ? AND target = ? AND phase = 'firing' AND id <> ? "
                "ORDER BY started_ms, id LIMIT 1",
                (row.rule, row.target, row.id),
            )
            if found:
                # this collector's own row of it, journaled while it was pending, goes
                self._db.run("DELETE FROM incidents WHERE id = ? AND phase = 'pending'", (row.id,))
                return _incident(found[0])
            self.upsert_incident(row)
        return None

    def incidents(  # noqa: PLR0913 - the API's filters
        self,
        *,
        open_only: bool = False,
        limit: int = 100,
        node: str | None = None,
        rule: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
    ) -> list[IncidentRow]:
        """Incidents, newest first, that match every filter given.

        ``open_only``: pending and firing ones; ``since_ms`` and ``until_ms``: those active at
        some time between them (started by ``until_ms``, not resolved before ``since_ms``).
        """
        clauses, params = where(
            ("node = ?", node),
            ("rule = ?", rule),
            ("started_ms <= ?", until_ms),
            ("(resolved_ms IS NULL OR resolved_ms >= ?)", since_ms),
            always=["phase IN ('pending', 'firing')"] if open_only else [],
        )
        rows = self._db.rows(
            f"SELECT {_INCIDENT_COLUMNS} FROM incidents{clauses} "  # noqa: S608 - constant
            "ORDER BY updated_ms DESC, id LIMIT ?",
            (*params, limit),
        )
        return [_incident(r) for r in rows]

    def add_action(self, row: ActionRow) -> tuple[int, bool]:
        """Record a planned action: (id, True) when new.

        (existing id, False) when its idempotency key was journaled before.
        """
        got = self._db.rows(
            "INSERT INTO actions (idempotency_key, incident_id, action, node, target, "
            "state, created_ms, params, detail, finished_ms) VALUES (?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
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
        if got:
            return int(got[0][0]), True
        ((existing,),) = self._db.rows(
            "SELECT id FROM actions WHERE idempotency_key = ?",
            (row.idempotency_key,),
        )
        return int(existing), False

    def decide_action(
        self,
        row: ActionRow,
        decide: Callable[[FleetActions], Decision],
        *,
        breaker_window_ms: int,
        cooldown_ms: int | None = None,
        reboot_window_ms: int | None = None,
    ) -> tuple[int, bool, str, str]:
        """Decide and record an action under the fleet lock: (id, new, state, why).

        ``decide`` sees what every collector is doing (:class:`FleetActions`) and answers the
        state to journal ``row`` in, and when (if at all) the fleet-wide breaker opens until. A
        key journaled before keeps its first decision (new is False). ``reboot_window_ms``:
        how far back a reboot counts as in flight (None: reboots are not looked at).
        """
        with self._db.transaction():
            self._db.fleet_lock()
            existing = self._db.rows(
                "SELECT id, state, detail FROM actions WHERE idempotency_key = ?",
                (row.idempotency_key,),
            )
            if existing:
                ((aid, state, detail),) = existing
                return int(aid), False, str(state), str(detail)
            fleet = self._fleet_actions(
                row.created_ms - breaker_window_ms,
                None if cooldown_ms is None else row.created_ms - cooldown_ms,
                None if reboot_window_ms is None else row.created_ms - reboot_window_ms,
            )
            state, why, breaker_until_ms = decide(fleet)
            if breaker_until_ms > fleet.breaker_open_until_ms:
                self._set_state(BREAKER_KEY, breaker_until_ms)
            finished = None if state in ("planned", "running") else row.created_ms
            decided = ActionRow(
                row.idempotency_key,
                row.incident_id,
                row.action,
                row.node,
                row.target,
                state,
                row.created_ms,
                row.params,
                why,
                finished,
            )
            action_id, _ = self.add_action(decided)
            return action_id, True, state, why

    def reopen_decided(
        self,
        action_id: int,
        decide: Callable[[FleetActions], Decision],
        *,
        now_ms: int,
        breaker_window_ms: int,
        cooldown_ms: int | None = None,
    ) -> tuple[str, str]:
        """A waiting action may run now: decide under the fleet lock, and mark it running if so.

        Returns (state, why); anything but "planned" leaves the row as it was. ("taken", why)
        when the row no longer waits: another collector sharing the journal took it up.
        """
        with self._db.transaction():
            self._db.fleet_lock()
            now = self._db.rows("SELECT state FROM actions WHERE id = ?", (action_id,))
            if not now or now[0][0] != "deferred":
                return "taken", f"no longer waiting: {now[0][0] if now else 'gone'}"
            fleet = self._fleet_actions(
                now_ms - breaker_window_ms, None if cooldown_ms is None else now_ms - cooldown_ms
            )
            state, why, breaker_until_ms = decide(fleet)
            if breaker_until_ms > fleet.breaker_open_until_ms:
                self._set_state(BREAKER_KEY, breaker_until_ms)
            if state == "planned":
                self.reopen_action(action_id, "running")
            return state, why

    def open_breaker(self, until_ms: int) -> None:
        """Open the fleet-wide drain breaker until ``until_ms`` (never shortens it)."""
        with self._db.transaction():
            self._db.fleet_lock()
            if until_ms > self._get_state(BREAKER_KEY):
                self._set_state(BREAKER_KEY, until_ms)

    def fleet_actions(self, since_ms: int) -> FleetActions:
        """What the whole fleet's collectors are doing (drains counted since ``since_ms``)."""
        return self._fleet_actions(since_ms)

    def _fleet_actions(
        self, since_ms: int, recent_ms: int | None = None, reboots_ms: int | None = None
    ) -> FleetActions:
        drained: dict[str, str] = {}
        for node, incident, action in self._db.rows(
            "SELECT node, incident_id, action FROM actions WHERE state = 'succeeded' AND "
            "action IN ('drain_node', 'escalated_drain_node', 'reboot_node', "
            "'escalated_reboot_node', 'resume_node', 'release_node') ORDER BY id",
        ):
            if str(action).endswith(("drain_node", "reboot_node")):  # a reboot drains too
                drained[str(node)] = str(incident)
            else:
                drained.pop(str(node), None)
        busy = self._db.rows(
            "SELECT action, node, target FROM actions WHERE state IN ('planned', 'running') "
            "AND action IN ('drain_node', 'escalated_drain_node', 'reset_gpu', "
            "'escalated_reset_gpu', 'reboot_node', 'escalated_reboot_node')",
        )
        ((since,),) = self._db.rows(
            "SELECT COUNT(*) FROM actions WHERE action IN ('drain_node', 'escalated_drain_node') "
            "AND state IN ('planned', 'running', 'succeeded', 'failed') AND created_ms >= ?",
            (since_ms,),
        )
        last: dict[tuple[str, str], int] = {}
        for a, place, t in self._db.rows(
            "SELECT action, CASE WHEN action IN ('reset_gpu', 'escalated_reset_gpu') "
            "THEN target ELSE node END AS place, MAX(created_ms) FROM actions "
            "WHERE state IN ('planned', 'running', 'succeeded', 'failed') "
            "AND created_ms >= ? GROUP BY action, place",
            (-1 if recent_ms is None else recent_ms,),
        ):
            key = (str(a).removeprefix("escalated_"), str(place))
            last[key] = max(int(t), last.get(key, 0))
        # A person's release ends the node's drain cooldown: a fault after it drains again.
        for node, t in self._db.rows(
            "SELECT node, MAX(created_ms) FROM actions WHERE action = 'release_node' "
            "AND state = 'succeeded' GROUP BY node",
        ):
            drained_ms = last.get(("drain_node", str(node)))
            if drained_ms is not None and int(t) >= drained_ms:
                del last["drain_node", str(node)]
        return FleetActions(
            drained=drained,
            draining=frozenset(str(n) for a, n, _ in busy if str(a).endswith("drain_node")),
            resetting=frozenset(str(t) for a, _, t in busy if str(a).endswith("reset_gpu")),
            drains_since=int(since),
            last_ms=last,
            breaker_open_until_ms=self._get_state(BREAKER_KEY),
            nodes=int(self._db.rows("SELECT COUNT(*) FROM nodes")[0][0]),
            rebooting_now=frozenset(str(n) for a, n, _ in busy if str(a).endswith("reboot_node")),
            rebooting=self._rebooting(reboots_ms) if reboots_ms is not None else frozenset(),
        )

    def _rebooting(self, since_ms: int) -> frozenset[str]:
        """Nodes with a reboot planned, running, or succeeded since ``since_ms`` and not back.

        A node is back once the journal holds a Hello of it from another boot than the one the
        reboot was asked from (the action's ``params.boot_id``).
        """
        rows = self._db.rows(
            "SELECT a.node, a.state, a.params, n.boot_id FROM actions a "
            "LEFT JOIN nodes n ON n.name = a.node "
            "WHERE a.action IN ('reboot_node', 'escalated_reboot_node') "
            "AND a.state IN ('planned', 'running', 'succeeded') AND a.created_ms >= ?",
            (since_ms,),
        )
        out: set[str] = set()
        for node, state, params, boot_now in rows:
            boot = json.loads(params).get("boot_id") if params else None
            back = state == "succeeded" and bool(boot) and boot_now not in (None, "", boot)
            if not back:
                out.add(str(node))
        return frozenset(out)

    def _get_state(self, key: str) -> int:
        rows = self._db.rows("SELECT value FROM fleet_state WHERE key = ?", (key,))
        return int(rows[0][0]) if rows else 0

    def _set_state(self, key: str, value: int) -> None:
        self._db.run(
            "INSERT INTO fleet_state (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def finish_action(self, action_id: int, state: str, detail: str, finished_ms: int) -> None:
        """Record an action's outcome."""
        self._db.run(
            "UPDATE actions SET state = ?, detail = ?, finished_ms = ? WHERE id = ?",
            (state, detail[:2000], finished_ms, action_id),
        )

    def reopen_action(self, action_id: int, state: str) -> None:
        """An action that waited (deferred) is about to run after all."""
        self._db.run(
            "UPDATE actions SET state = ?, detail = '', finished_ms = NULL WHERE id = ?",
            (state, action_id),
        )

    def actions(
        self,
        *,
        node: str | None = None,
        limit: int = 100,
        since_ms: int | None = None,
        until_ms: int | None = None,
    ) -> list[ActionRow]:
        """Actions, newest first (created from ``since_ms`` to ``until_ms``, when given)."""
        clauses, params = where(
            ("node = ?", node), ("created_ms >= ?", since_ms), ("created_ms <= ?", until_ms)
        )
        rows = self._db.rows(
            f"SELECT {_ACTION_COLUMNS} FROM actions{clauses} "  # noqa: S608 - constant
            "ORDER BY id DESC LIMIT ?",
            (*params, limit),
        )
        return [_action(r) for r in rows]

    def succeeded_since(self, since_ms: int, node: str | None = None) -> list[tuple[str, str, int]]:
        """(node, action, when it succeeded) of the actions that succeeded, oldest first.

        Those created from ``since_ms`` on (of ``node``, or all): the reliability counts read it.
        """
        clauses, params = where(
            ("state = ?", "succeeded"), ("created_ms >= ?", since_ms), ("node = ?", node)
        )
        rows = self._db.rows(
            "SELECT node, action, COALESCE(finished_ms, created_ms) FROM actions"  # noqa: S608
            f"{clauses} ORDER BY id",
            tuple(params),
        )
        return [(str(n), str(a), int(t)) for n, a, t in rows]

    def action_nodes(self, action_ids: Sequence[int]) -> dict[int, str]:
        """The node of each action journaled under one of ``action_ids``."""
        if not action_ids:
            return {}
        marks = ", ".join("?" * len(action_ids))
        rows = self._db.rows(
            f"SELECT id, node FROM actions WHERE id IN ({marks})",  # noqa: S608 - only marks
            tuple(action_ids),
        )
        return {int(i): str(n) for i, n in rows}

    def action(self, action_id: int) -> ActionRow | None:
        """One action by its id, or None."""
        rows = self._db.rows(
            f"SELECT {_ACTION_COLUMNS} FROM actions WHERE id = ?",  # noqa: S608 - constant
            (action_id,),
        )
        return _action(rows[0]) if rows else None

    def unfinished_actions(self) -> list[ActionRow]:
        """Actions journaled as planned or running (a restart must settle them, not rerun)."""
        rows = self._db.rows(
            f"SELECT {_ACTION_COLUMNS} FROM actions "  # noqa: S608 - constant
            "WHERE state IN ('planned', 'running') ORDER BY id",
        )
        return [_action(r) for r in rows]

    def add_silence(self, row: SilenceRow) -> int:
        """Store a silence; return its id."""
        ((silence_id,),) = self._db.rows(
            "INSERT INTO silences (node, rule, starts_ms, ends_ms, reason, created_ms, "
            "created_by) VALUES (?,?,?,?,?,?,?) RETURNING id",
            (
                row.node,
                row.rule,
                row.starts_ms,
                row.ends_ms,
                row.reason,
                row.created_ms,
                row.created_by,
            ),
        )
        return int(silence_id)

    def remove_silence(self, silence_id: int) -> bool:
        """Delete a silence; False when there was none with that id."""
        return self._db.run("DELETE FROM silences WHERE id = ?", (silence_id,)) == 1

    def silences(
        self, *, active_at_ms: int | None = None, node: str | None = None
    ) -> list[SilenceRow]:
        """Silences, oldest first (when given: not over at ``active_at_ms``, covering ``node``).

        A silence covers a node when it names the node or ``*``.
        """
        clauses, params = where(("ends_ms > ?", active_at_ms), ("node IN (?, '*')", node))
        rows = self._db.rows(
            "SELECT node, rule, starts_ms, ends_ms, reason, created_ms, id, created_by "  # noqa: S608 - constant
            f"FROM silences{clauses} ORDER BY id",
            params,
        )
        return [SilenceRow(*r) for r in rows]
