"""Rules and actions end to end: simulated faults, a real collector, real signed webhooks."""

import asyncio

import pytest

from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import NODES, actions, api, kinds, start

pytestmark = pytest.mark.integration


class TestFaultToAction:
    async def test_xid_79_drains_and_notifies_once(self, running, receiver):
        """A GPU falling off the bus fires gpu_lost: one signed drain request and notifications,
        each action journaled with its outcome; a firing incident does not act again."""
        service, cluster = running
        cluster.nodes["node-2"].xid(3, 79)
        await wait_until(lambda: len(receiver.deliveries()) >= 2, what="webhooks")
        await asyncio.sleep(0.5)  # later ticks must not act again
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
        await asyncio.sleep(0.3)
        drains = [d for d in receiver.deliveries() if d.body["kind"] == "drain_request"]
        assert len(drains) == 1
        rows = await service.journal.do(lambda s: s.incidents.actions(node="node-1"))
        skipped = [r for r in rows if r.action == "drain_node" and r.state == "skipped"]
        assert skipped
        assert "already drained" in skipped[0].detail


class TestSafety:
    async def test_storm_drains_no_more_than_the_cap(self, collector_config, receiver, tmp_path):
        """IB ports down on every node at once: the drain cap holds and the rest wait."""
        acts = actions(receiver, tmp_path, max_drained_nodes=1, max_drained_share=0.5)
        service, cluster = await start(collector_config, tmp_path, acts)
        try:
            for node in cluster.nodes.values():
                node.xid(1, 79)
            await wait_until(
                lambda: service.dispatcher.deferred >= len(NODES) - 1, what="deferrals"
            )
            await asyncio.sleep(0.3)
            drains = [d for d in receiver.deliveries() if d.body["kind"] == "drain_request"]
            assert len(drains) == 1
            rows = await service.journal.do(lambda s: s.incidents.actions(limit=1000))
            deferred = [r for r in rows if r.action == "drain_node" and r.state == "deferred"]
            assert len(deferred) == len(NODES) - 1
            assert all("drain cap reached" in r.detail for r in deferred)
        finally:
            await cluster.stop()
            await service.stop(grace=None)

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
            await asyncio.sleep(0.3)
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
        await asyncio.sleep(0.3)
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
