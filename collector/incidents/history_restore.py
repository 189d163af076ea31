"""The rules' event windows, read back from the journal when the collector starts.

Rule windows (``xids("10m")``, ``events("gpu_lost", "10m")``) live in memory. Without this, a
collector that crashed after journaling an event but before its rules looked at it would come
back with the event acknowledged (the agent will not send it again) and forgotten by the rules:
the incident would never fire and its drain or reset would never run. Reading back what the
journal received within the longest window closes that hole; incidents that already fired are
restored by the engine from their own table, and their actions are keyed, so evaluating these
events again opens nothing twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import structlog

from fleetwatch.model import EventKind, Target

if TYPE_CHECKING:
    from collector.incidents.evaluator import Evaluator
    from collector.store.journal import Journal
    from fleetwatch.clock import Clock

log = structlog.get_logger("collector.incidents.history_restore")

# The history keeps at most 1000 events per target; this bounds the read across all targets.
MAX_RESTORED: Final = 200_000


async def restore_history(
    journal: Journal, evaluator: Evaluator, clock: Clock, limit: int = MAX_RESTORED
) -> int:
    """Put the journal's events of the last event window back into ``evaluator``'s history.

    Returns how many were restored. Rows of kinds this collector does not know are skipped.
    """
    now_ms = int(clock.now() * 1000)
    since_ms = now_ms - int(evaluator.history.event_window_s * 1000)
    rows = await journal.do(lambda store: store.received_since(since_ms, limit))
    restored = 0
    for row in rows:
        try:
            kind = EventKind(row.kind)
        except ValueError:
            continue
        target = Target(row.target_kind, row.gpu_uuid, row.target_index, row.device)
        evaluator.restore_event(row.node, kind, target, row.xid, (now_ms - row.received_ms) / 1000)
        restored += 1
    log.info("history_restored", events=restored, window_s=evaluator.history.event_window_s)
    return restored
