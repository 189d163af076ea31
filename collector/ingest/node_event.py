"""An agent's event as the collector takes it: read off the wire once, after it was checked.

The collector's own Xid catalog classes the event (``xid_class``); the class the agent attached
(``agent_xid_class``, from the agent's copy of the catalog, which may be older) is kept only as
evidence and decides nothing (docs/decisions.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetwatch.model import EventKind, Target, event_kind_from_pb

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

# Alike events, for coalescing (collector.ingest.coalesce): kind, target and Xid.
EventKey = tuple[EventKind, Target, int]


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One event of one boot of one node, with a readable kind and target."""

    node: str
    boot_id: str
    seq: int
    time_ms: int  # the agent's clock
    kind: EventKind
    target: Target
    xid: int  # 0: not an Xid
    xid_class: str  # the collector's catalog's class; "" when not an Xid
    detail: str
    agent_xid_class: str = ""  # what the agent's catalog said: evidence, never a decision

    @property
    def key(self) -> EventKey:
        """What alike events share."""
        return (self.kind, self.target, self.xid)

    @property
    def classes_differ(self) -> bool:
        """Whether the agent named a class and it is not the collector's."""
        return bool(self.agent_xid_class) and self.agent_xid_class != self.xid_class


def node_event(
    event: pb.Event, *, node: str, boot_id: str, xid_class: Callable[[int], str]
) -> NodeEvent:
    """The domain event of a validated wire ``event``, classed by ``xid_class`` (the catalog's)."""
    return NodeEvent(
        node=node,
        boot_id=boot_id,
        seq=event.seq,
        time_ms=event.time_unix_ms,
        kind=event_kind_from_pb(event.kind),
        target=Target.from_pb(event.target),
        xid=event.xid,
        xid_class=xid_class(event.xid) if event.xid else "",
        detail=event.detail,
        agent_xid_class=event.xid_class,
    )
