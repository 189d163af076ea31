"""A firing and the first of its actions are journaled together, in one call to the writer.

A fault's way to its webhook paid two round trips through the event loop to the journal's
writer thread: one for the incident, one for its first action. At 4,096 nodes each is a few
milliseconds. The first action of each chain (the drains and resets in order; each notification
beside them) is now decided before the incident is journaled and goes in its transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from collector.main import CollectorService
from collector.store.incidents import IncidentRow
from fleetwatch.clock import SystemClock
from fleetwatch.model import EventKind, Target
from fleetwatch.testing import made_up_hello, wait_until
from tests.integration.fleet_harness import actions

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.actions.dispatcher import Dispatcher
    from collector.actions.journaling import FirePlan
    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

NODE = "node-7"


@pytest.fixture
async def service(
    collector_config: Callable[..., CollectorConfig], receiver: WebhookReceiver, tmp_path: Path
) -> AsyncIterator[CollectorService]:
    """A real collector acting through signed webhooks, ticked by the test (not by itself)."""
    config = collector_config(actions=actions(receiver, tmp_path), rules_interval=3600)
    service = CollectorService(config, SystemClock())
    await service.start()
    await service.incidents.stop(grace=0)
    clock = service.clock
    service.fleet.on_hello(made_up_hello(NODE, gpus=2), clock.monotonic(), clock.now())
    try:
        yield service
    finally:
        await service.stop(grace=None)


def lose_gpu(service: CollectorService, index: int) -> None:
    """GPU ``index`` of the node falls off the bus (Xid 79): gpu_lost drains and notifies."""
    gpu = Target.gpu(made_up_hello(NODE, gpus=2).gpus[index].uuid)
    service.fleet.apply_event(NODE, EventKind.GPU_LOST, gpu, 79)


def transactions(statements: list[str]) -> list[list[str]]:
    """The writer's statements, one list per commit (a statement alone is a commit of its own)."""
    out: list[list[str]] = []
    current: list[str] | None = None
    for sql in statements:
        word = sql.split(None, 1)[0].upper()
        if word == "BEGIN":
            current = []
        elif word in ("COMMIT", "ROLLBACK"):
            if current is not None:
                out.append(current)
            current = None
        elif current is not None:
            current.append(sql)
        else:
            out.append([sql])
    return out


async def test_a_firing_and_its_first_actions_commit_together(
    service: CollectorService, receiver: WebhookReceiver
):
    """The incident's row and its drain's and notification's rows are one commit."""
    statements: list[str] = []
    service.journal.store.db.conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
    lose_gpu(service, 0)
    await service.incidents.tick(urgent=True)
    await wait_until(lambda: len(receiver.deliveries()) >= 2, 10, "the drain and the notification")
    service.journal.store.db.conn.set_trace_callback(None)  # type: ignore[attr-defined]
    await service.incidents.idle()  # the outcomes are journaled once the receiver has answered

    with_incident = [
        t for t in transactions(statements) if any("INSERT INTO incidents" in s for s in t)
    ]
    assert len(with_incident) == 1, with_incident
    inserted = [s for s in with_incident[0] if s.startswith("INSERT INTO actions")]
    assert len(inserted) == 2, with_incident[0]  # drain_node and notify
    assert sorted(d.body["kind"] for d in receiver.deliveries()) == [
        "drain_request",
        "notification",
    ]
    rows = await service.journal.do(lambda s: s.incidents.actions(node=NODE))
    assert sorted((r.action, r.state) for r in rows) == [
        ("drain_node", "succeeded"),
        ("notify", "succeeded"),
    ]
    assert service.dispatcher.draining == set()  # the place the plan held is given back


async def test_two_firings_in_one_tick_drain_their_node_once(
    service: CollectorService, receiver: WebhookReceiver
):
    """Both GPUs of a node fall off the bus at once: two incidents, decided in the same tick
    before either is journaled. The first holds the node's place, so the second's drain is
    journaled as skipped, and one drain request leaves; both notifications do."""
    lose_gpu(service, 0)
    lose_gpu(service, 1)
    await service.incidents.tick(urgent=True)
    await wait_until(lambda: len(receiver.deliveries()) >= 3, 10, "a drain, two notifications")
    await service.incidents.idle()  # every action the tick started is done: a second drain too
    kinds = sorted(d.body["kind"] for d in receiver.deliveries())
    assert kinds == ["drain_request", "notification", "notification"]
    rows = await service.journal.do(lambda s: s.incidents.actions(node=NODE))
    drains = sorted((r.state, r.detail) for r in rows if r.action == "drain_node")
    assert [state for state, _ in drains] == ["skipped", "succeeded"], drains
    assert "being drained for another incident" in drains[0][1]
    drained_by = [r.incident_id for r in rows if (r.action, r.state) == ("drain_node", "succeeded")]
    assert service.dispatcher.drained == {NODE: drained_by[0]}


async def test_a_plan_the_journal_did_not_take_gives_its_place_back(service: CollectorService):
    """When the journal refuses a firing (it is down), its plan's held places go back: the
    firing is journaled again at a later tick, and its drain must not find its own node held."""
    rule = service.evaluator.engine.rules["gpu_lost"]
    row = IncidentRow(
        id=f"gpu_lost:{NODE}/gpu/0:1",
        rule="gpu_lost",
        node=NODE,
        target=f"{NODE}/gpu/0",
        severity="critical",
        phase="firing",
        started_ms=1,
        updated_ms=1,
    )
    plan = service.dispatcher.plan(row, rule, rule.actions)
    assert plan is not None
    assert [(p.name, p.state) for p in plan.firsts] == [
        ("drain_node", "planned"),
        ("notify", "planned"),
    ]
    assert service.dispatcher.draining == {NODE}
    plan.release()
    assert service.dispatcher.draining == set()
    again = service.dispatcher.plan(row, rule, rule.actions)
    assert again is not None
    assert again.firsts[0].state == "planned", again.firsts[0].why
    again.release()


class _PlanFails:
    """The real dispatcher, whose planning breaks (a bug, a bad value): fault injection."""

    def __init__(self, inner: Dispatcher) -> None:
        self.inner = inner

    def plan(self, *_args: Any, **_kwargs: Any) -> FirePlan | None:
        msg = "planning broke"
        raise RuntimeError(msg)

    async def fire(self, *args: Any, **kwargs: Any) -> None:
        await self.inner.fire(*args, **kwargs)

    async def resolve(self, *args: Any, **kwargs: Any) -> None:
        await self.inner.resolve(*args, **kwargs)

    async def settle(self, *args: Any, **kwargs: Any) -> None:
        await self.inner.settle(*args, **kwargs)


async def test_a_plan_that_breaks_loses_neither_the_firing_nor_its_actions(
    service: CollectorService, receiver: WebhookReceiver
):
    """Planning is an optimisation: when it raises, the firing is journaled all the same and its
    actions are decided when they run, as they were before plans."""
    service.incidents.sink = _PlanFails(service.dispatcher)
    lose_gpu(service, 0)
    await service.incidents.tick(urgent=True)
    await wait_until(lambda: len(receiver.deliveries()) >= 2, 10, "the drain and the notification")
    await service.incidents.idle()  # the outcomes are journaled once the receiver has answered
    incidents = await service.journal.do(lambda s: s.incidents.incidents(open_only=True))
    assert [(i.rule, i.phase) for i in incidents] == [("gpu_lost", "firing")]
    rows = await service.journal.do(lambda s: s.incidents.actions(node=NODE))
    assert sorted((r.action, r.state) for r in rows) == [
        ("drain_node", "succeeded"),
        ("notify", "succeeded"),
    ]
