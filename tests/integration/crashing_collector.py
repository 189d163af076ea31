"""The real collector, which kills itself with SIGKILL at one named step of a fault's path.

Run as ``python -m tests.integration.crashing_collector STEP collector --config FILE``: the
arguments after STEP are ``fleetwatch``'s own. Nothing of the collector is replaced: the journal's
own methods run and commit as they always do, and at STEP the process ends with SIGKILL on the
spot, as the OOM killer or a power cut would end it, the first time STEP is reached:

* ``event``: an Xid event's row has just been committed (the agent has no ack yet);
* ``incident``: an incident has just been journaled as firing (its actions not yet run; on a
  journal of its own, the first of them were decided and journaled in the same transaction);
* ``escalated``: a firing incident has just been journaled as escalated (its escalation's
  actions not yet);
* ``reset_failed``: a GPU reset's failure has just been journaled (the escalation it calls
  for not yet);
* ``action``: a ``notify`` action has just been journaled as planned (nothing sent yet);
* ``answered``: the webhook answered a ``notify``, its outcome not yet journaled;
* ``outcome``: a ``notify``'s outcome has just been journaled;
* ``deferred``: a start has just journaled an action it found cut short as deferred, to run
  again (for a second crash, right after the restart that follows the first).

For the steps in between (the request at the receiver, not yet answered) the test's receiver
kills this process itself.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING, Final

from cli.main import main
from collector.store.events import EventStore
from collector.store.incidents import IncidentStore

if TYPE_CHECKING:
    from collections.abc import Sequence

    from collector.store.events import EventRow
    from collector.store.incidents import ActionRow, IncidentRow

STEPS: Final = (
    "event",
    "incident",
    "escalated",
    "action",
    "answered",
    "outcome",
    "reset_failed",
    "deferred",
)


def _die() -> None:
    sys.stderr.write("crashing_collector: SIGKILL at the chosen step\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class Crash:
    """Wraps the journal's own methods so that the process dies at one step."""

    def __init__(self, step: str) -> None:
        """Remember the step; :meth:`arm` puts the wrappers in place."""
        if step not in STEPS:
            msg = f"unknown step {step!r}: one of {', '.join(STEPS)}"
            raise SystemExit(msg)
        self.step = step
        self.notify_ids: set[int] = set()
        self.reset_ids: set[int] = set()
        self.in_batch = False  # within record's transaction

    def at(self, step: str) -> None:
        """Die here when this is the chosen step."""
        if step == self.step:
            _die()

    def arm(self) -> None:  # noqa: C901, PLR0915 - small wrappers, one per journal method
        """Put the wrappers in place of the journal's methods."""
        crash = self
        insert_events = EventStore.insert_events
        upsert_incident = IncidentStore.upsert_incident
        record = IncidentStore.record
        add_action = IncidentStore.add_action
        finish_action = IncidentStore.finish_action

        def events(store: EventStore, rows: Sequence[EventRow]) -> list[int]:
            ids = insert_events(store, rows)
            if any(r.kind == "xid" and i for r, i in zip(rows, ids, strict=True)):
                crash.at("event")
            return ids

        def journaled(row: IncidentRow) -> None:
            if row.phase == "firing":
                crash.at("incident")
                if row.escalated:
                    crash.at("escalated")

        def incident(store: IncidentStore, row: IncidentRow) -> None:
            upsert_incident(store, row)
            if not crash.in_batch:
                journaled(row)

        def planned(row: ActionRow, action_id: int, *, new: bool) -> None:
            if row.action == "reset_gpu":
                crash.reset_ids.add(action_id)
            if row.action == "notify":
                crash.notify_ids.add(action_id)
                if new:
                    crash.at("action")

        def action(store: IncidentStore, row: ActionRow) -> tuple[int, bool]:
            action_id, new = add_action(store, row)
            if not crash.in_batch:
                planned(row, action_id, new=new)
            return action_id, new

        def recorded(
            store: IncidentStore,
            rows: Sequence[IncidentRow],
            actions: Sequence[ActionRow] = (),
        ) -> list[tuple[int, bool]]:
            crash.in_batch = True  # the rows are journaled once their transaction commits
            try:
                results = record(store, rows, actions)
            finally:
                crash.in_batch = False
            for row in rows:
                journaled(row)
            for action_row, (action_id, new) in zip(actions, results, strict=True):
                planned(action_row, action_id, new=new)
            return results

        def finish(
            store: IncidentStore, action_id: int, state: str, detail: str, finished_ms: int
        ) -> None:
            answered = action_id in crash.notify_ids and state == "succeeded"
            if answered:
                crash.at("answered")
            finish_action(store, action_id, state, detail, finished_ms)
            if answered:
                crash.at("outcome")
            if action_id in crash.reset_ids and state == "failed":
                crash.at("reset_failed")
            if state == "deferred" and detail.startswith("collector restarted"):
                crash.at("deferred")

        EventStore.insert_events = events  # type: ignore[method-assign,assignment]
        IncidentStore.upsert_incident = incident  # type: ignore[method-assign,assignment]
        IncidentStore.record = recorded  # type: ignore[method-assign,assignment]
        IncidentStore.add_action = action  # type: ignore[method-assign,assignment]
        IncidentStore.finish_action = finish  # type: ignore[method-assign,assignment]


if __name__ == "__main__":
    Crash(sys.argv[1]).arm()
    raise SystemExit(main(sys.argv[2:]))
