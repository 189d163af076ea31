"""The collector's command broker: a reset asked while the node's stream is not ready waits."""

import asyncio
from pathlib import Path

from collector.commands import CommandBroker
from collector.ingest.session import SessionRegistry, StreamSession
from collector.model.fleet import FleetModel
from collector.stats import CollectorStats
from collector.store.journal import Journal
from collector.store.sqlite import SqliteStore
from fleetwatch.testing import FakeClock, made_up_hello
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.xid_catalog import load_catalog


async def test_a_reset_for_a_stream_still_saying_hello_is_asked_again(tmp_path: Path):
    """The node's new stream is registered but its Hello has not finished: the reset is not a
    failure (which would escalate) but a retry."""
    clock = FakeClock()
    fleet = FleetModel()
    fleet.on_hello(made_up_hello("n1", gpus=2), clock.monotonic(), clock.now())
    journal = Journal(SqliteStore(tmp_path / "journal.db"))
    registry = SessionRegistry()
    session = StreamSession(
        fleet=fleet,
        journal=journal,
        stats=CollectorStats(),
        registry=registry,
        clock=clock,
        config=pb.Config(),
        xid_class=load_catalog().class_of,
    )

    async def half_open_stream() -> None:
        registry.claim("n1", session)

    await asyncio.create_task(half_open_stream())
    try:
        outcome = await CommandBroker(registry, fleet).reset("n1", "n1/gpu/1", force=False)
    finally:
        await journal.close()
    assert (outcome.ok, outcome.retry) == (False, True)
    assert "has not said Hello yet" in outcome.detail
