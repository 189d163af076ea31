"""Rules and actions end to end: simulated faults, a real collector, real signed webhooks."""

import asyncio
import urllib.request
from functools import partial
from pathlib import Path

import pytest

from collector.actions.config import ActionsConfig, WebhookConfig
from collector.actions.safety import SafetyConfig
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import actions, api, journaled, kinds, later_ticks, start

pytestmark = pytest.mark.integration

BUILTIN_RULES = Path(__file__).parents[2] / "rules" / "default.yaml"
STORM_RULES = """\
version: 1
rules:
  - name: ib_port_lost
    scope: ib_port
    when: 'port.state != "" && port.state != "ACTIVE"'
    severity: critical
    actions: [{drain_node: {resume_on_resolve: true}}]
"""


class TestFaultToAction:
    async def test_xid_79_drains_and_notifies_once(self, running, receiver):
        """A GPU falling off the bus fires gpu_lost: one signed drain request and notifications,
        each action journaled with its outcome; a firing incident does not act again."""
        service, cluster = running
        cluster.nodes["node-2"].xid(3, 79)
        await wait_until(lambda: len(receiver.deliveries()) >= 2, what="webhooks")
        # The receiver answered before the collector journals the outcomes it was told.
        outcomes = (("drain_node", "succeeded"), ("notify", "succeeded"))
        await wait_until(partial(journaled, service, "node-2", *outcomes), what="outcomes")
        await later_ticks(service)  # later ticks must not act again
        assert ("drain_request", "node-2") in kinds(receiver)
        drains = [d for d in receiver.deliveries() if d.body["kind"] == "drain_request"]
        assert len(drains) == 1
        assert drains[0].body["payload"]["reason"].startswith("fleetwatch: ")
        notes = [
            d.body["payload"] for d in receiver.deliveries() if d.body["kind"] == "notification"
        ]
        assert [(n["rule"], n["target"]) for n in notes] == [("gpu_lost", "node-2/gpu/3")]
        rows = await service.journal.do(lambda s: s.incidents.actions(node="node-2"))
        assert {(r.action, r.state) for r in rows} >= {
            ("drain_node", "succeeded"),
            ("notify", "succeeded"),
        }
        firing = await service.journal.do(lambda s: s.incidents.incidents(open_only=True))
        assert any(i.rule == "gpu_lost" and i.target == "node-2/gpu/3" for i in firing)
        assert service.dispatcher.drained == {
            "node-2": next(r.incident_id for r in rows if r.action == "drain_node")
        }

    async def test_second_fault_on_a_drained_node_drains_nothing_more(self, running, receiver):
        """A node already drained by fleetwatch is not drained again for another incident."""
        service, cluster = running
        cluster.nodes["node-1"].xid(0, 79)
        await wait_until(lambda: "node-1" in service.dispatcher.drained, what="first drain")
        cluster.nodes["node-1"].remap(2, failure=True)
        await wait_until(
            lambda: any(
                i.rule == "row_remap_failure"
                for i in service.evaluator.engine.open_incidents()
                if i.phase == "firing"
            ),
            what="second incident",
        )
        await wait_until(
            partial(journaled, service, "node-1", ("drain_node", "skipped")), what="drain skipped"
        )
        await later_ticks(service)  # a second drain request would be sent by then
        drains = [d for d in receiver.deliveries() if d.body["kind"] == "drain_request"]
        assert len(drains) == 1
        rows = await service.journal.do(lambda s: s.incidents.actions(node="node-1"))
        skipped = [r for r in rows if r.action == "drain_node" and r.state == "skipped"]
        assert skipped
        assert "already drained" in skipped[0].detail


async def drains_are(service: CollectorService, *states: list[str]) -> bool:
    """Whether node-3's drains, as journaled (newest first), are one of ``states``."""
    rows = await service.journal.do(lambda s: s.incidents.actions(node="node-3"))
    return [r.state for r in rows if r.action == "drain_node"] in states


def scrape(service: CollectorService) -> str:
    url = f"http://127.0.0.1:{service.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


class TestSafety:
    async def test_storm_drains_no_more_than_the_cap(self, collector_config, receiver, tmp_path):
        """IB ports down on 40% of the nodes at once: the cap (20% of 10 nodes) drains two,
        the other two wait, and a fleet-level incident says so. When a drained node comes back
        a waiting drain runs; a waiting drain whose fault cleared is dropped."""
        rules = tmp_path / "storm.yaml"
        rules.write_text(STORM_RULES)
        acts = actions(receiver, tmp_path, max_drained_nodes=10, max_drained_share=0.2)
        nodes = [f"node-{i:02d}" for i in range(1, 11)]
        service, cluster = await start(
            collector_config, tmp_path, acts, nodes=nodes, rules=(BUILTIN_RULES, rules)
        )
        try:
            storm = nodes[:4]
            for name in storm:
                cluster.nodes[name].ib_port_down(0)
            await wait_until(
                lambda: (
                    len(service.dispatcher.waiting) == 2 and len(service.dispatcher.drained) == 2
                ),
                what="two drains done and two waiting",  # not while the first two still run
            )
            await wait_until(
                lambda: ("notification", "fleet") in kinds(receiver), what="fleet incident"
            )
            drained = set(service.dispatcher.drained)
            assert len(drained) == 2
            assert drained < set(storm)
            assert sorted(n for k, n in kinds(receiver) if k == "drain_request") == sorted(drained)
            rows = await service.journal.do(lambda s: s.incidents.actions(limit=1000))
            deferred = [r for r in rows if r.action == "drain_node" and r.state == "deferred"]
            assert len(deferred) == 2
            assert all("drain cap reached: 2 of 10 nodes" in r.detail for r in deferred)
            fleet = await service.journal.do(lambda s: s.incidents.incidents(open_only=True))
            assert [i.rule for i in fleet if i.node == "fleet"] == ["drain_cap_reached"]
            metrics = await asyncio.to_thread(scrape, service)
            assert "fleetwatch_drains_waiting 2.0" in metrics
            assert "fleetwatch_drained_nodes 2.0" in metrics
            assert (
                'fleetwatch_incidents_open{phase="firing",rule="drain_cap_reached",'
                'severity="critical"} 1.0'
            ) in metrics

            waiting = set(storm) - drained
            cluster.nodes[min(drained)].ib_port_up(0)  # fixed: resumed, room for one
            await wait_until(
                lambda: len(waiting & set(service.dispatcher.drained)) == 1, what="a drain ran"
            )
            assert len(service.dispatcher.waiting) == 1
            (ran,) = waiting & set(service.dispatcher.drained)
            (dropped,) = waiting - {ran}
            cluster.nodes[dropped].ib_port_up(0)  # its fault cleared while it waited
            await wait_until(lambda: not service.dispatcher.waiting, what="waiting dropped")
            # A node counts as drained once the webhook answered, before the outcome is journaled.
            await wait_until(
                partial(journaled, service, ran, ("drain_node", "succeeded")), what="drain outcome"
            )
            rows = await service.journal.do(lambda s: s.incidents.actions(limit=1000))
            states = {(r.node, r.action, r.state) for r in rows}
            assert (ran, "drain_node", "succeeded") in states
            assert (dropped, "drain_node", "skipped") in states
            assert dropped not in service.dispatcher.drained
            await wait_until(
                lambda: all(i.node != "fleet" for i in service.evaluator.engine.open_incidents()),
                what="fleet incident resolved",
            )
        finally:
            await cluster.stop()
            await service.stop(grace=None)

    async def test_waiting_drains_survive_a_restart(self, collector_config, receiver, tmp_path):
        """A drain waiting behind the cap is read back from the journal by the next collector,
        and what already ran is known as drained (it does not run twice)."""
        rules = tmp_path / "storm.yaml"
        rules.write_text(STORM_RULES)
        acts = actions(receiver, tmp_path, max_drained_nodes=1, max_drained_share=1.0)
        service, cluster = await start(collector_config, tmp_path, acts, rules=(rules,))
        try:
            for name in ("node-1", "node-2"):
                cluster.nodes[name].ib_port_down(0)
            await wait_until(
                lambda: (
                    len(service.dispatcher.waiting) == 1 and len(service.dispatcher.drained) == 1
                ),
                what="one drain done and one waiting",  # not while the first is still running
            )
            await service.incidents.idle()  # and its outcome journaled, for the next collector
            before = (dict(service.dispatcher.drained), set(service.dispatcher.waiting))
        finally:
            await cluster.stop()
            await service.stop(grace=None)
        again = CollectorService(
            collector_config(actions=acts, rules=(rules,), rules_interval=3600), SystemClock()
        )
        await again.start()
        try:
            assert (dict(again.dispatcher.drained), set(again.dispatcher.waiting)) == before
            assert again.dispatcher.status()["drains_waiting"] == 1
        finally:
            await again.stop(grace=None)

    async def test_dry_run_journals_and_does_nothing(self, collector_config, receiver, tmp_path):
        """In dry-run mode the journal says what would have run, and no webhook is sent."""
        service, cluster = await start(
            collector_config, tmp_path, actions(receiver, tmp_path, dry_run=True)
        )
        try:
            cluster.nodes["node-3"].xid(5, 79)
            await wait_until(
                lambda: any(i.phase == "firing" for i in service.evaluator.engine.open_incidents()),
                what="incident",
            )
            await wait_until(partial(journaled, service, "node-3"), what="actions journaled")
            await later_ticks(service)  # what would run has run by then
            rows = await service.journal.do(lambda s: s.incidents.actions(node="node-3"))
            assert rows
            assert {r.state for r in rows} == {"dry_run"}
            assert receiver.deliveries() == []
            assert service.dispatcher.drained == {}
        finally:
            await cluster.stop()
            await service.stop(grace=None)


class TestSilencesApi:
    async def test_silenced_node_runs_no_actions(self, running, receiver):
        """A silence on a node (maintenance) keeps its incidents from acting; the API lists
        incidents, actions and silences, and a silence can be removed."""
        service, cluster = running
        status, made = await asyncio.to_thread(
            api,
            service,
            "POST",
            "/api/v1/silences",
            {"node": "node-4", "duration": "1h", "reason": "cable swap"},
        )
        assert status == 201
        cluster.nodes["node-4"].xid(6, 79)
        await wait_until(
            lambda: any(i.phase == "firing" for i in service.evaluator.engine.open_incidents()),
            what="incident",
        )
        await wait_until(partial(journaled, service, "node-4"), what="actions journaled")
        await later_ticks(service)  # what would run has run by then
        assert receiver.deliveries() == []
        _, actions_seen = await asyncio.to_thread(
            api, service, "GET", "/api/v1/actions?node=node-4"
        )
        assert {a["state"] for a in actions_seen["actions"]} == {"skipped"}
        assert all(f"silence {made['id']}" in a["detail"] for a in actions_seen["actions"])
        _, incidents = await asyncio.to_thread(api, service, "GET", "/api/v1/incidents?open=1")
        assert [(i["rule"], i["silenced_by"]) for i in incidents["incidents"]] == [
            ("gpu_lost", f"silence {made['id']}"),
        ]
        _, silences = await asyncio.to_thread(api, service, "GET", "/api/v1/silences")
        assert [s["reason"] for s in silences["silences"]] == ["cable swap"]
        status, _ = await asyncio.to_thread(
            api, service, "DELETE", f"/api/v1/silences/{made['id']}"
        )
        assert status == 200
        _, silences = await asyncio.to_thread(api, service, "GET", "/api/v1/silences")
        assert silences["silences"] == []

    async def test_bad_silence_is_refused(self, running):
        """A silence without a valid duration, or with unknown fields, gets a 400 saying why."""
        service, _ = running
        status, body = await asyncio.to_thread(
            api, service, "POST", "/api/v1/silences", {"node": "x"}
        )
        assert status == 400
        assert "duration" in body["error"]
        status, body = await asyncio.to_thread(
            api, service, "POST", "/api/v1/silences", {"duration": "1h", "colour": "red"}
        )
        assert status == 400
        status, _ = await asyncio.to_thread(api, service, "DELETE", "/api/v1/silences/999")
        assert status == 404


class TestRestart:
    async def test_a_drain_cut_short_by_a_restart_runs_after_it(
        self, collector_config, receiver, tmp_path
    ):
        """A drain still retrying its webhook when the collector stops is run again, with the
        same idempotency key, by the next collector: it is not lost, and it is sent once."""
        dead = WebhookConfig(url="http://127.0.0.1:9/drain", max_attempts=50)
        acts = ActionsConfig(safety=SafetyConfig(), drain_webhook=dead)
        service, cluster = await start(collector_config, tmp_path, acts)
        try:
            cluster.nodes["node-3"].xid(2, 79)
            await wait_until(
                partial(drains_are, service, ["planned"], ["running"]),
                what="the drain journaled, retrying against a closed port",
            )
        finally:
            await cluster.stop()
            await service.stop(grace=None)
        again = CollectorService(
            collector_config(actions=actions(receiver, tmp_path), rules_interval=0.1),
            SystemClock(),
        )
        await again.start()
        try:
            await wait_until(
                lambda: ("drain_request", "node-3") in kinds(receiver), what="drain after restart"
            )
            # The receiver answered before the collector journals the outcome it was told.
            await wait_until(partial(drains_are, again, ["succeeded"]), what="drain outcome")
            rows = await again.journal.do(lambda s: s.incidents.actions(node="node-3"))
            drains = [r for r in rows if r.action == "drain_node"]
            assert [r.state for r in drains] == ["succeeded"]
            (delivery,) = [d for d in receiver.deliveries() if d.body["kind"] == "drain_request"]
            assert delivery.idempotency_key == "drain_node:" + drains[0].incident_id
        finally:
            await again.stop(grace=None)
