"""A collector that starts reads the rules' event windows back from its journal."""

from pathlib import Path

from collector.incidents.evaluator import Evaluator
from collector.incidents.history_restore import restore_history
from collector.model.fleet import FleetModel
from collector.store.events import EventRow
from collector.store.journal import Journal
from collector.store.sqlite import SqliteStore
from fleetwatch.testing import FakeClock, made_up_hello, made_up_uuid
from rules.loader import parse_rules
from rules.xid_catalog import load_catalog

RULES = """\
version: 1
rules:
  - name: reboot_or_rma
    scope: gpu
    when: 'xids("1h").exists(x, x.action == "CONTACT_SUPPORT")'
    keep_firing_for: 1h
    severity: critical
    actions: [drain_node, notify]
"""


def xid_row(node: str, gpu: int, xid: int, seq: int, received_ms: int) -> EventRow:
    return EventRow(
        node=node,
        boot_id="b1",
        seq=seq,
        time_ms=received_ms,
        received_ms=received_ms,
        kind="xid",
        target_kind="gpu",
        gpu_uuid=made_up_uuid(node, gpu),
        xid=xid,
        xid_class="firmware",
    )


def evaluator(clock: FakeClock) -> Evaluator:
    fleet = FleetModel()
    fleet.on_hello(made_up_hello("n1"), clock.monotonic(), clock.now())
    return Evaluator(
        rules=parse_rules(RULES, "t.yaml"), fleet=fleet, catalog=load_catalog(), clock=clock
    )


async def test_an_event_journaled_before_a_crash_still_fires_its_rule(tmp_path: Path):
    """The earlier process journaled (and acked) an Xid 61 and died before its rules looked: the
    new process fires the incident from the journal alone. An event older than the window, or of
    a kind this collector does not know, is left out."""
    clock = FakeClock()
    now_ms = int(clock.now() * 1000)
    store = SqliteStore(tmp_path / "journal.db")
    store.insert_events(
        [
            xid_row("n1", 2, 61, 1, now_ms - 30_000),  # 30 s ago: within every window
            xid_row("n1", 5, 61, 2, now_ms - 25 * 3600 * 1000),  # beyond the 24 h history
        ]
    )
    store.close()
    journal = Journal(SqliteStore(tmp_path / "journal.db"))
    ev = evaluator(clock)
    try:
        assert await restore_history(journal, ev, clock) == 1
    finally:
        await journal.close()
    outcomes = ev.tick()
    fired = {(o.transition.incident.rule, o.transition.incident.target) for o in outcomes}
    assert fired == {("reboot_or_rma", "n1/gpu/2")}


async def test_restored_events_keep_their_age(tmp_path: Path):
    """An event restored 50 minutes after it came in leaves a 1 h window 10 minutes later."""
    clock = FakeClock()
    store = SqliteStore(tmp_path / "journal.db")
    store.insert_events([xid_row("n1", 0, 61, 1, int(clock.now() * 1000) - 50 * 60_000)])
    store.close()
    journal = Journal(SqliteStore(tmp_path / "journal.db"))
    ev = evaluator(clock)
    try:
        await restore_history(journal, ev, clock)
    finally:
        await journal.close()
    assert ev.history.xids("n1/gpu/0", clock.monotonic() - 3600) == [61]
    clock.advance(11 * 60)
    assert ev.history.xids("n1/gpu/0", clock.monotonic() - 3600) == []
