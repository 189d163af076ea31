"""One firing incident per rule and target across the collectors sharing a journal.

A collector that takes a node for a silent peer's (the peer was only waiting for its restarted
database) may evaluate it while the peer still does. When the peer's incident for that rule and
target is already firing in the journal, this collector carries that one on instead of opening a
second: its notification was sent, and a second incident would send another under a new key
(``bench/chaos.py --journal postgres`` counted 7 such duplicates in a seed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from collector.store.incidents import IncidentRow
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import NODES, actions, start

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

RULE = "xid_application_error"


def notified(receiver: WebhookReceiver) -> list[str]:
    return sorted(
        d.body["payload"]["target"]
        for d in receiver.deliveries()
        if d.body["kind"] == "notification" and d.body["payload"]["rule"] == RULE
    )


async def test_a_peers_firing_incident_is_carried_on_not_opened_again(
    collector_config: Callable[..., CollectorConfig],
    pg_dsn: str,
    receiver: WebhookReceiver,
    tmp_path: Path,
) -> None:
    def config(**overrides: object) -> CollectorConfig:
        return collector_config(journal_dsn=pg_dsn, name="here", **overrides)

    service, cluster = await start(config, tmp_path, actions(receiver, tmp_path))
    node = NODES[0]
    try:
        # the peer's incident, firing in the journal since a minute ago
        now_ms = int(service.clock.now() * 1000)
        theirs = IncidentRow(
            id=f"{RULE}:{node}/gpu/0:1",
            rule=RULE,
            node=node,
            target=f"{node}/gpu/0",
            severity="info",
            phase="firing",
            started_ms=now_ms - 60_000,
            updated_ms=now_ms - 60_000,
            fired_ms=now_ms - 60_000,
            resolved_ms=None,
            evidence="the peer's",
        )
        await service.journal.do(lambda s: s.incidents.upsert_incident(theirs))
        cluster.nodes[node].xid(0, 13, "the same fault, seen here")
        cluster.nodes[node].xid(1, 13, "another GPU's fault")
        await wait_until(
            lambda: f"{node}/gpu/1" in notified(receiver), 30, "the other GPU's notification"
        )
        await service.incidents.idle()
        firing = await service.journal.do(lambda s: s.incidents.incidents(open_only=True))
    finally:
        await cluster.stop()
        await service.stop(grace=None)
    assert notified(receiver) == [f"{node}/gpu/1"]  # none for GPU 0: the peer's stands
    gpu0 = [i.id for i in firing if i.target == f"{node}/gpu/0" and i.rule == RULE]
    assert gpu0 == [theirs.id]
