"""The API as the on-call engineer's CLI calls it (issue 42), over real HTTP on loopback.

Unknown query parameters are a 400 that names them (today ``?node=`` and ``?since=`` were
ignored and everything came back), filters select in the journal, incidents carry their rule's
text (the rules of the last reload), and a silence must be meant and records who added it.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
from typing import TYPE_CHECKING, Any

import pytest
from structlog.testing import capture_logs

from collector.main import CollectorService
from collector.reload import ConfigSource
from collector.store.incidents import ActionRow, IncidentRow
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until
from tests.integration.raw_http import refused, request

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

TOKEN = "0123456789abcdef-api-token"  # noqa: S105 - a test token
TOKEN_VAR = "FLEETWATCH_TEST_QUERY_TOKEN"  # noqa: S105 - a variable name
ME = pwd.getpwuid(os.getuid()).pw_name
JSON = {"Content-Type": "application/json"}
# Each GET endpoint, as a path that reaches it, and the name its 400 gives it.
ENDPOINTS = [
    ("/metrics", "/metrics"),
    ("/metrics/fleet", "/metrics/fleet"),
    ("/metrics/shards/0", "/metrics/shards/<n>"),
    ("/api/v1/scrape_targets", "/api/v1/scrape_targets"),
    ("/api/v1/nodes", "/api/v1/nodes"),
    ("/api/v1/nodes/node-1", "/api/v1/nodes/<name>"),
    ("/api/v1/nodes/node-1/evidence", "/api/v1/nodes/<name>/evidence"),
    ("/api/v1/events", "/api/v1/events"),
    ("/api/v1/incidents", "/api/v1/incidents"),
    ("/api/v1/actions", "/api/v1/actions"),
    ("/api/v1/silences", "/api/v1/silences"),
    ("/api/v1/drains", "/api/v1/drains"),
    ("/api/v1/jobs", "/api/v1/jobs"),
    ("/api/v1/jobs/llama", "/api/v1/jobs/<id>"),
    ("/api/v1/preflight", "/api/v1/preflight"),
    ("/api/v1/preflight/latest", "/api/v1/preflight/<id>"),
]


async def get(service: CollectorService, path: str) -> tuple[int, Any]:
    answer = await asyncio.to_thread(request, service.http_port, "GET", path)
    return answer.status, answer.json() if answer.body[:1] in (b"{", b"[") else answer.body


async def post(service: CollectorService, body: object, token: str | None = None) -> Any:
    headers = dict(JSON) | ({"Authorization": f"Bearer {token}"} if token else {})
    answer = await asyncio.to_thread(
        request, service.http_port, "POST", "/api/v1/silences", json.dumps(body), headers
    )
    return answer.status, answer.json()


class TestStrictParameters:
    async def test_every_get_refuses_what_it_does_not_take(self, collector: CollectorService):
        """Each GET endpoint answers an unknown parameter with a 400 naming it and what the
        endpoint takes, counted as bad_request; /healthz takes anything, and a scrape without
        parameters is answered as ever."""
        with capture_logs() as logs:
            for path, name in ENDPOINTS:
                status, body = await get(collector, f"{path}?nodes=x")
                assert status == 400, path
                assert body["error"].startswith(f"unknown query parameter(s) nodes for {name}; ")
        refusals = [e for e in logs if e["event"] == "api_request_refused"]
        assert [e["reason"] for e in refusals] == ["bad_request"] * len(ENDPOINTS)
        status, body = await get(collector, "/api/v1/incidents?since=1h&foo=1&bar=2")
        assert status == 400
        assert body["error"] == (
            "unknown query parameter(s) bar, foo for /api/v1/incidents; it takes limit, node, "
            "open, rule, since, until"
        )
        assert (await get(collector, "/healthz?probe=1")) == (200, b"ok\n")
        assert (await get(collector, "/metrics"))[0] == 200
        assert (await get(collector, "/metrics?"))[0] == 200
        counts = await asyncio.to_thread(refused, collector.http_port)
        assert counts["bad_request"] == len(ENDPOINTS) + 1

    async def test_a_bad_time_or_window_is_a_400(self, collector: CollectorService):
        status, body = await get(collector, "/api/v1/events?since=yesterday")
        assert status == 400
        assert "since='yesterday' is not a time: give a duration back from now" in body["error"]
        status, body = await get(collector, "/api/v1/actions?since=1h&until=2h")
        assert (status, body["error"]) == (400, "since='1h' is after until='2h'")


class TestFilters:
    async def test_node_rule_and_time_select_in_the_journal(self, collector: CollectorService):
        """Rows of two nodes journaled an hour apart: each filter gives its own rows only."""
        now_ms = int(collector.clock.now() * 1000)
        hour = 3_600_000
        old, new = now_ms - 2 * hour, now_ms - 10_000

        def write(store: Any) -> None:
            for iid, node, rule, started, resolved in (
                ("old", "node-a", "gpu_lost", old, old + 60_000),
                ("new", "node-b", "nvlink_down", new, None),
            ):
                phase = "firing" if resolved is None else "resolved"
                store.incidents.upsert_incident(
                    IncidentRow(
                        iid, rule, node, node, "critical", phase, started, started, None, resolved
                    )
                )
                store.incidents.add_action(
                    ActionRow(f"k-{iid}", iid, "drain_node", node, node, "succeeded", started, {})
                )

        await collector.journal.do(write)

        async def incidents(query: str) -> list[str]:
            status, body = await get(collector, f"/api/v1/incidents?{query}")
            assert status == 200, body
            return [i["id"] for i in body["incidents"]]

        assert await incidents("node=node-a") == ["old"]
        assert await incidents("rule=nvlink_down") == ["new"]
        assert await incidents("node=node-b&since=30m") == ["new"]
        assert await incidents("node=node-a&since=30m") == []
        assert await incidents("node=node-a&until=90m") == ["old"]
        _, body = await get(collector, "/api/v1/actions?since=1h")
        assert [a["idempotency_key"] for a in body["actions"]] == ["k-new"]
        _, body = await get(collector, "/api/v1/actions?node=node-a&until=1h")
        assert [a["idempotency_key"] for a in body["actions"]] == ["k-old"]


class TestSilences:
    async def test_a_silence_must_be_meant_and_says_who_added_it(self, collector: CollectorService):
        """From loopback without a token: the fleet-wide one needs "all", a rule's typo is
        refused with the rule it resembles, and a good one is listed with created_by the
        local user the kernel says made the request; each refusal is a bad_request."""
        status, body = await post(collector, {"duration": "1h"})
        assert (status, body["error"]) == (
            400,
            'a silence of every rule on every node needs "all": true',
        )
        status, body = await post(collector, {"rule": "gpu_lots", "duration": "1h"})
        assert status == 400
        assert "did you mean gpu_lost?" in body["error"]
        status, body = await post(collector, {"node": "node-9", "duration": "1h"})
        assert status == 400
        assert "no node 'node-9' in the fleet" in body["error"]
        assert (await post(collector, {"rule": "gpu_lost", "duration": "1h"}))[0] == 201
        assert (await post(collector, {"node": "node-9", "duration": "1h", "force": True}))[
            0
        ] == 201
        _, body = await get(collector, "/api/v1/silences")
        assert [(s["node"], s["rule"], s["created_by"]) for s in body["silences"]] == [
            ("*", "gpu_lost", f"user {ME}"),
            ("node-9", "*", f"user {ME}"),
        ]
        _, body = await get(collector, "/api/v1/silences?node=node-9")
        assert [s["node"] for s in body["silences"]] == ["*", "node-9"]
        counts = await asyncio.to_thread(refused, collector.http_port)
        assert counts["bad_request"] == 3

    @pytest.mark.parametrize(
        ("secret", "sent", "by"),
        [
            (TOKEN, TOKEN, "token"),
            (f"# people\nalice {TOKEN}\nci-bot other-{TOKEN}\n", f"other-{TOKEN}", "token ci-bot"),
        ],
    )
    async def test_with_a_token_it_says_which(
        self, collector_config: Callable[..., CollectorConfig], secret: str, sent: str, by: str
    ):
        """The token's name when the file names its tokens, and the local user as well."""
        service = CollectorService(
            collector_config(api_token_env=TOKEN_VAR), SystemClock(), environ={TOKEN_VAR: secret}
        )
        await service.start()
        try:
            with capture_logs() as logs:
                status, answer = await post(
                    service, {"all": True, "duration": "15m", "reason": "fabric"}, token=sent
                )
                assert status == 201
                _, body = await get(service, "/api/v1/silences")
                assert [(s["node"], s["created_by"]) for s in body["silences"]] == [
                    ("*", f"{by}, user {ME}")
                ]
                headers = dict(JSON) | {"Authorization": f"Bearer {sent}"}
                removed = await asyncio.to_thread(
                    request,
                    service.http_port,
                    "DELETE",
                    f"/api/v1/silences/{answer['id']}",
                    None,
                    headers,
                )
                assert removed.status == 200
            # The log says what was silenced, until when and by whom; and who removed it.
            [added] = [e for e in logs if e["event"] == "silence_added"]
            assert (added["node"], added["rule"], added["reason"]) == ("*", "*", "fabric")
            assert added["created_by"] == f"{by}, user {ME}"
            assert added["until_ms"] > 0
            [gone] = [e for e in logs if e["event"] == "silence_removed"]
            assert (gone["id"], gone["removed_by"]) == (answer["id"], f"{by}, user {ME}")
        finally:
            await service.stop(grace=None)


RULES = """\
version: 1
rules:
  - name: fleet_empty
    scope: fleet
    when: 'fleet.nodes == 0'
    severity: info
    description: no node has said Hello
    runbook: https://wiki.example/fleet_empty
"""


@pytest.fixture
async def with_rules(tmp_path: Path) -> AsyncIterator[tuple[CollectorService, ConfigSource]]:
    rules = tmp_path / "site.yaml"
    rules.write_text(RULES)
    config = tmp_path / "collector.toml"
    config.write_text(
        "[collector]\n"
        'listen = "127.0.0.1:0"\n'
        'http = "127.0.0.1:0"\n'
        f'journal = "{tmp_path / "journal.db"}"\n'
        f'rules = ["{rules}"]\n'
        "rules_interval = 0.05\n"
    )
    source = ConfigSource(config, {})
    service = CollectorService(source.load(), SystemClock())
    await service.start()
    try:
        yield service, source
    finally:
        await service.stop(grace=None)


class TestRuleText:
    async def test_incidents_carry_the_text_of_the_rules_in_use(self, with_rules, tmp_path):
        """The firing incident's description and runbook; after a reload that rewrote them,
        the new text (the rule is the same, its incident goes on)."""
        service, source = with_rules
        await wait_until(
            lambda: bool(service.reader.read(lambda s: s.incidents(rule="fleet_empty"))),
            what="the incident journaled",
        )
        _, body = await get(service, "/api/v1/incidents?rule=fleet_empty")
        (first,) = body["incidents"]
        assert (first["description"], first["runbook"]) == (
            "no node has said Hello",
            "https://wiki.example/fleet_empty",
        )
        (tmp_path / "site.yaml").write_text(
            RULES.replace("no node has said Hello", "the fleet is empty").replace(
                "    runbook: https://wiki.example/fleet_empty\n", ""
            )
        )
        assert service.reload(source)
        _, body = await get(service, "/api/v1/incidents?rule=fleet_empty")
        (again,) = body["incidents"]
        assert (again["id"], again["description"], again["runbook"]) == (
            first["id"],
            "the fleet is empty",
            "",
        )
