"""The GETs' filters and what incidents carry (issue 42), on a real SQLite journal.

Each filter is a WHERE clause: a page of ``limit`` rows holds the rows that match, however many
newer ones do not (a cut in Python after the limit would give fewer or none).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import pytest

from collector.api import incidents as incidents_api
from collector.api.fleet import FleetReads
from collector.api.query import Params
from collector.model.fleet import FleetModel
from collector.model.node_states import NodeFlags
from collector.store.events import EventRow
from collector.store.incidents import ActionRow, IncidentRow, SilenceRow
from collector.store.sqlite import JournalReader, SqliteStore
from collector.testing import job_world
from rules.model import Rule, RuleSet, Scope

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

NOW = 100.0  # Unix seconds: every row below is from the first 100 s of 1970


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[tuple[SqliteStore, JournalReader]]:
    path = tmp_path / "journal.db"
    store = SqliteStore(path, "c1")
    try:
        yield store, JournalReader(path)
    finally:
        store.close()


def get(reader: JournalReader, path: str, query: str = "", rules: RuleSet | None = None) -> Any:
    book = incidents_api.rule_book(rules)
    return incidents_api.get(path, Params.read(path, query, NOW), reader, lambda: book)


def incident(iid: str, rule: str, node: str, started: int, resolved: int | None) -> IncidentRow:
    phase = "firing" if resolved is None else "resolved"
    updated = resolved if resolved is not None else started
    return IncidentRow(
        iid, rule, node, node, "critical", phase, started, updated, started, resolved
    )


def rule(name: str, description: str = "", runbook: str = "") -> Rule:
    return Rule(name, Scope.NODE, "true", description=description, runbook=runbook)


@pytest.fixture
def incidents(journal: tuple[SqliteStore, JournalReader]) -> JournalReader:
    """a: r1 on n1 from 1 s to 2 s; b: r1 on n2 from 3 s, firing; c: r2 on n1 from 5 s to 6 s."""
    store, reader = journal
    for row in (
        incident("a", "r1", "n1", 1000, 2000),
        incident("b", "r1", "n2", 3000, None),
        incident("c", "r2", "n1", 5000, 6000),
    ):
        store.incidents.upsert_incident(row)
    return reader


def ids(answer: Any, key: str = "incidents", field: str = "id") -> list[Any]:
    return [row[field] for row in answer[key]]


class TestIncidents:
    def test_node_and_rule(self, incidents):
        """Newest first; today ?node= was ignored and every incident came back."""
        assert ids(get(incidents, "/api/v1/incidents")) == ["c", "b", "a"]
        assert ids(get(incidents, "/api/v1/incidents", "node=n1")) == ["c", "a"]
        assert ids(get(incidents, "/api/v1/incidents", "rule=r1")) == ["b", "a"]
        assert ids(get(incidents, "/api/v1/incidents", "rule=r1&node=n2&open=1")) == ["b"]
        assert ids(get(incidents, "/api/v1/incidents", "node=n9")) == []

    def test_the_filter_comes_before_the_limit(self, incidents):
        """limit=1 with rule=r1 gives r1's newest, though r2's incident is newer still."""
        assert ids(get(incidents, "/api/v1/incidents", "rule=r1&limit=1")) == ["b"]
        assert ids(get(incidents, "/api/v1/incidents", "node=n2&limit=1")) == ["b"]

    @pytest.mark.parametrize(
        ("query", "expected"),
        [
            ("since=2.5&until=4", ["b"]),  # a ended before 2.5 s, c started after 4 s
            ("since=1.5&until=1.8", ["a"]),  # only a was active then
            ("since=2&until=2", ["a"]),  # a resolved at 2 s: still active at 2 s
            ("until=0.5", []),  # nothing had started
            ("since=7", ["b"]),  # b still fires
            ("since=90s", ["b"]),  # 10 s (100 s less 90 s): only b
            ("until=1", ["a"]),  # a started at 1 s
        ],
    )
    def test_incidents_active_in_the_window(self, incidents, query, expected):
        """An incident is listed when it was active at some time from since to until."""
        assert ids(get(incidents, "/api/v1/incidents", query)) == expected

    def test_each_incident_carries_its_rules_text(self, incidents):
        """description and runbook from the rules in use; "" for a rule gone (r2) or none."""
        rules = RuleSet((rule("r1", "NVLink down", "https://wiki/r1"),))
        got = {
            i["id"]: (i["description"], i["runbook"])
            for i in get(incidents, "/api/v1/incidents", "", rules)["incidents"]
        }
        assert got == {
            "a": ("NVLink down", "https://wiki/r1"),
            "b": ("NVLink down", "https://wiki/r1"),
            "c": ("", ""),
        }
        rules = RuleSet((rule("r1", "reloaded"), rule("r2", runbook="https://wiki/r2")))
        got = {
            i["id"]: (i["description"], i["runbook"])
            for i in get(incidents, "/api/v1/incidents", "", rules)["incidents"]
        }
        assert got == {"a": ("reloaded", ""), "b": ("reloaded", ""), "c": ("", "https://wiki/r2")}

    def test_a_pre_flight_hold_carries_its_checks_text(self, journal):
        store, reader = journal
        store.incidents.upsert_incident(incident("p", "preflight_nvlink_up", "n1", 1000, None))
        (got,) = get(reader, "/api/v1/incidents")["incidents"]
        assert got["description"] == "the node failed pre-flight check nvlink_up"


def action(key: str, node: str, created_ms: int) -> ActionRow:
    return ActionRow(key, f"inc-{key}", "drain_node", node, node, "succeeded", created_ms, {})


class TestActions:
    @pytest.fixture
    def actions(self, journal):
        store, reader = journal
        for key, node, created in (("k1", "n1", 1000), ("k2", "n2", 2000), ("k3", "n1", 3000)):
            store.incidents.add_action(action(key, node, created))
        return reader

    def test_node_and_window_on_creation_time(self, actions):
        got = ids(get(actions, "/api/v1/actions"), "actions", "idempotency_key")
        assert got == ["k3", "k2", "k1"]
        query = "since=1.5&until=3"
        assert ids(get(actions, "/api/v1/actions", query), "actions", "idempotency_key") == [
            "k3",
            "k2",
        ]
        query = "node=n1&since=0.5&until=2.5&limit=1"
        assert ids(get(actions, "/api/v1/actions", query), "actions", "idempotency_key") == ["k1"]


class TestSilences:
    def test_the_silences_that_cover_a_node(self, journal):
        """Those naming the node or *, not over yet; each with who added it."""
        store, reader = journal
        for node, rule_name, ends, by in (
            ("n1", "*", 200_000, "token"),
            ("*", "r1", 200_000, "loopback"),
            ("n2", "*", 200_000, "token"),
            ("n1", "r2", 50_000, "token"),  # over at 100 s
        ):
            store.incidents.add_silence(SilenceRow(node, rule_name, 0, ends, "", 0, created_by=by))
        assert ids(get(reader, "/api/v1/silences"), "silences", "node") == ["n1", "*", "n2"]
        got = get(reader, "/api/v1/silences", "node=n1")["silences"]
        assert [(s["node"], s["rule"], s["created_by"]) for s in got] == [
            ("n1", "*", "token"),
            ("*", "r1", "loopback"),
        ]


class TestDrains:
    def test_a_node_keeps_its_own_drain_and_waiting_actions(self, journal):
        """The fleet's counts stay; a waiting action's node is read from the journal."""
        store, reader = journal
        first, _ = store.incidents.add_action(action("w1", "n1", 1000))
        second, _ = store.incidents.add_action(action("w2", "n2", 1000))
        answer = {
            "drained": {"n1": "inc-a", "n3": "inc-c"},
            "waiting": [
                {"action_id": first, "incident": "inc-w1", "action": "drain_node"},
                {"action_id": second, "incident": "inc-w2", "action": "drain_node"},
            ],
            "drained_nodes": 2,
            "drain_cap": 3,
        }
        assert incidents_api.drains_json(answer, None, reader) == answer
        assert incidents_api.drains_json(answer, "n1", reader) == {
            "drained": {"n1": "inc-a"},
            "waiting": [{"action_id": first, "incident": "inc-w1", "action": "drain_node"}],
            "drained_nodes": 2,
            "drain_cap": 3,
        }
        assert incidents_api.drains_json(answer, "n3", reader)["waiting"] == []


class TestFleetReads:
    def test_events_by_node_and_time(self, journal):
        store, reader = journal
        for seq, node, t in ((1, "n1", 1000), (2, "n2", 2000), (3, "n1", 3000), (4, "n1", 4000)):
            store.insert_events([EventRow(node, "b", seq, t, t, "xid", "gpu", xid=79)])
        reads = FleetReads(fleet=FleetModel(), journal=reader, node_flags=NodeFlags, jobs=None)
        events = reads.events(Params.read("/api/v1/events", "node=n1&since=2&until=3.5", NOW))
        assert [e["seq"] for e in events["events"]] == [3]
        query = "node=n1&since=1&order=desc&limit=2"
        events = reads.events(Params.read("/api/v1/events", query, NOW))
        assert [e["seq"] for e in events["events"]] == [4, 3]

    def test_jobs_with_a_rank_on_the_node(self, journal):
        """Job j runs on every node; job k only on node-a."""
        _, reader = journal
        world = job_world()
        world.run(range(3))
        for rank in (0, 1):
            world.report(rank, 1, job="k")
        world.book.publish()
        reads = FleetReads(fleet=world.fleet, journal=reader, node_flags=NodeFlags, jobs=world.book)

        def jobs(node: str | None) -> list[str]:
            status, answer = reads.jobs("", node)
            assert status == HTTPStatus.OK
            assert isinstance(answer, dict)
            return sorted(j["id"] for j in answer["jobs"])

        assert jobs(None) == ["j", "k"]
        assert jobs("node-a") == ["j", "k"]
        assert jobs("node-c") == ["j"]
        assert jobs("node-z") == []
