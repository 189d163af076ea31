"""The incidents' part in a node's lifecycle: a fault that fires makes the node suspect.

An :class:`~collector.incidents.service.IncidentWatcher`: told of each incident journaled (and,
at start, of each firing one taken back). A firing incident of ``warning`` or worse on a node,
a GPU, an NVLink or an IB port, not silenced, suppressed or of a shadow rule, makes an in-service
node *suspect*; when the last such incident of the node resolves, a suspect node is in service
again. A node out of service (drained, in repair, re-qualifying, RMA) is not moved by them; one
put back in service while such an incident still fires is suspect at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collector.model.lifecycle import STILL_FIRING, Lifecycle, State
from rules.engine import Phase
from rules.model import NODE_SCOPES, Severity

if TYPE_CHECKING:
    from collector.store.incidents import IncidentRow
    from rules.model import Rule

__all__ = ["LifecycleWatch"]


class LifecycleWatch:
    """Moves nodes between in service and suspect as their incidents fire and resolve."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        """Move nodes in ``lifecycle``."""
        self.lifecycle = lifecycle
        self._firing: dict[str, set[str]] = {}  # node -> ids of its incidents that count
        lifecycle.back_in_service.append(self._back)

    def _back(self, node: str) -> None:
        """A node put back in service while one of its faults still fires is suspect."""
        ids = self._firing.get(node)
        if ids:
            first = min(ids)
            rule = first.split(":", 1)[0]
            actor = f"rule:{rule}"
            self.lifecycle.move(
                node, State.SUSPECT, actor=actor, incident=first, reason=STILL_FIRING
            )

    def changed(self, incident: IncidentRow, rule: Rule) -> None:
        """One incident was journaled as it is now."""
        if rule.scope not in NODE_SCOPES or rule.shadow or rule.severity == Severity.INFO:
            return
        node = incident.node
        if incident.phase == Phase.FIRING.value:
            if incident.silenced_by or incident.suppressed_by:
                return
            self._firing.setdefault(node, set()).add(incident.id)
            if self.lifecycle.state(node) == State.IN_SERVICE:
                self.lifecycle.move(
                    node,
                    State.SUSPECT,
                    actor=f"rule:{rule.name}",
                    incident=incident.id,
                    reason=incident.evidence,
                )
            return
        if incident.phase != Phase.RESOLVED.value:
            return
        ids = self._firing.get(node)
        if ids is None or incident.id not in ids:
            return
        ids.discard(incident.id)
        if not ids:
            del self._firing[node]
            if self.lifecycle.state(node) == State.SUSPECT:
                self.lifecycle.move(
                    node, State.IN_SERVICE, actor=f"rule:{rule.name}", incident=incident.id
                )
