"""The forwarder's rounds: what is sent when, to which Alertmanager, and what a failure does."""

import json
from dataclasses import replace
from typing import Any

import pytest
from structlog.testing import capture_logs

from collector.actions import alertmanager
from collector.actions.alertmanager import KEEP_RESOLVED_S, AlertForwarder
from collector.actions.alertmanager_config import AlertmanagerConfig
from collector.export.alertmanager import AlertmanagerCollector
from collector.store.incidents import IncidentRow
from fleetwatch.testing import FakeClock
from rules.model import Mode, Rule, Scope, Severity

GPU_LOST = Rule(name="gpu_lost", scope=Scope.GPU, when="true", severity=Severity.CRITICAL)
APP_XID = Rule(name="xid_application_error", scope=Scope.GPU, when="true", severity=Severity.INFO)


class FakeAlertmanager:
    """Records each batch; answers with the error set (None: taken)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.batches: list[list[dict[str, Any]]] = []
        self.error: str | None = None

    def post(self, body: bytes) -> str | None:
        if self.error is None:
            self.batches.append(json.loads(body))
        return self.error

    def alerts(self) -> list[dict[str, Any]]:
        return [a for batch in self.batches for a in batch]


class Fleet:
    """The incidents firing now, as the collector's evaluator would say."""

    def __init__(self) -> None:
        self.firing: dict[str, Rule] = {}

    def __call__(self) -> dict[str, Rule]:
        return dict(self.firing)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def fleet():
    return Fleet()


@pytest.fixture
def am():
    return FakeAlertmanager("http://am-1:9093")


def make(clock, fleet, *endpoints, **config) -> AlertForwarder:
    cfg = AlertmanagerConfig(urls=tuple(e.url for e in endpoints), **config)
    return AlertForwarder(config=cfg, endpoints=endpoints, clock=clock, firing=fleet)


def fire(forwarder, fleet, clock, rule=GPU_LOST, target="node-7/gpu/3", **fields) -> IncidentRow:
    now_ms = int(clock.now() * 1000)
    values: dict[str, Any] = {
        "id": f"{rule.name}:{target}:{now_ms}",
        "rule": rule.name,
        "node": target.split("/")[0],
        "target": target,
        "severity": rule.severity.value,
        "phase": "firing",
        "started_ms": now_ms,
        "updated_ms": now_ms,
        "fired_ms": now_ms,
    }
    row = IncidentRow(**(values | fields))
    fleet.firing[row.id] = rule
    forwarder.changed(row, rule)
    return row


def resolve(forwarder, fleet, clock, row: IncidentRow, rule=GPU_LOST) -> IncidentRow:
    now_ms = int(clock.now() * 1000)
    done = replace(row, phase="resolved", resolved_ms=now_ms, updated_ms=now_ms)
    del fleet.firing[row.id]
    forwarder.changed(done, rule)
    return done


def ends(alert: dict[str, Any]) -> str:
    return str(alert["endsAt"])


class TestFiring:
    async def test_a_firing_incident_goes_out_at_once_then_at_each_full_round(
        self, clock, fleet, am
    ):
        """The round after the change sends it, ending 4 resend intervals on; a later round
        without change sends nothing, a full one sends it again with a later end."""
        forwarder = make(clock, fleet, am, resend_interval_s=60.0)
        fire(forwarder, fleet, clock)
        assert await forwarder.send_round(full=False)
        [alert] = am.alerts()
        assert alert["labels"]["alertname"] == "gpu_lost"
        assert alert["startsAt"] == "2026-01-01T00:00:00.000Z"
        assert ends(alert) == "2026-01-01T00:04:00.000Z"
        assert await forwarder.send_round(full=False)
        assert len(am.batches) == 1
        clock.advance(60)
        assert await forwarder.send_round(full=True)
        [again] = am.batches[1]
        assert (again["startsAt"], ends(again)) == (alert["startsAt"], "2026-01-01T00:05:00.000Z")
        assert forwarder.held() == (1, 0)

    async def test_one_post_per_round_with_every_alert(self, clock, fleet, am):
        """Three incidents that fire together go in one request."""
        forwarder = make(clock, fleet, am)
        for gpu in range(3):
            fire(forwarder, fleet, clock, target=f"node-7/gpu/{gpu}")
        await forwarder.send_round(full=False)
        assert [len(b) for b in am.batches] == [3]

    async def test_a_large_round_is_sent_in_batches(self, clock, fleet, am, monkeypatch):
        """More alerts than a batch holds go in several requests, all of them."""
        monkeypatch.setattr(alertmanager, "MAX_BATCH", 2)
        forwarder = make(clock, fleet, am)
        for gpu in range(5):
            fire(forwarder, fleet, clock, target=f"node-7/gpu/{gpu}")
        await forwarder.send_round(full=False)
        assert [len(b) for b in am.batches] == [2, 2, 1]

    async def test_below_min_severity_silenced_and_suppressed_are_not_sent(self, clock, fleet, am):
        """Info incidents (below the default warning), silenced and suppressed ones stay out."""
        forwarder = make(clock, fleet, am)
        fire(forwarder, fleet, clock, rule=APP_XID)
        fire(forwarder, fleet, clock, target="node-7/gpu/4", silenced_by="silence 3")
        fire(forwarder, fleet, clock, target="node-7/gpu/5", suppressed_by="node_unreachable:x")
        assert await forwarder.send_round(full=True)
        assert am.batches == []
        info = make(clock, fleet, am, min_severity=Severity.INFO)
        fire(info, fleet, clock, rule=APP_XID)
        await info.send_round(full=False)
        assert [a["labels"]["alertname"] for a in am.alerts()] == ["xid_application_error"]

    async def test_a_shadow_rule_pages_nobody(self, clock, fleet, am):
        """A rule in shadow mode acts on nothing: its incidents are not sent either."""
        forwarder = make(clock, fleet, am)
        fire(forwarder, fleet, clock, rule=replace(GPU_LOST, mode=Mode.SHADOW))
        assert await forwarder.send_round(full=True)
        assert am.batches == []

    async def test_an_incident_the_service_took_back_goes_out_at_the_first_round(
        self, clock, fleet, am
    ):
        """After a restart the service tells each firing incident again: the first (full) round
        sends it with its old start, and Alertmanager carries the same alert on."""
        clock.advance(600)
        forwarder = make(clock, fleet, am)
        fire(forwarder, fleet, clock, fired_ms=int(clock.now() * 1000) - 300_000)
        await forwarder.send_round(full=True)
        assert am.alerts()[0]["startsAt"] == "2026-01-01T00:05:00.000Z"

    async def test_an_incident_that_never_fired_wakes_nothing(self, clock, fleet, am):
        """Pending and dropped incidents are no alerts: their changes start no round."""
        forwarder = make(clock, fleet, am)
        row = IncidentRow("gpu_lost:n/gpu/1:0", "gpu_lost", "n", "n/gpu/1", "critical", "", 0, 0)
        forwarder.changed(replace(row, phase="pending"), GPU_LOST)
        forwarder.changed(replace(row, phase="dropped"), GPU_LOST)
        assert not forwarder._wake.is_set()
        assert await forwarder.send_round(full=True)
        assert (am.batches, forwarder.held()) == ([], (0, 0))


class TestResolved:
    async def test_resolved_goes_out_at_once_then_at_full_rounds_for_15_minutes(
        self, clock, fleet, am
    ):
        """The resolution is sent with the resolved time as its end, at the next round, again
        at each full one, and no more after 15 minutes."""
        forwarder = make(clock, fleet, am, resend_interval_s=60.0)
        row = fire(forwarder, fleet, clock)
        await forwarder.send_round(full=False)
        clock.advance(90)
        resolve(forwarder, fleet, clock, row)
        clock.advance(1)
        await forwarder.send_round(full=False)
        [done] = am.batches[-1]
        assert (done["startsAt"], ends(done)) == (
            "2026-01-01T00:00:00.000Z",
            "2026-01-01T00:01:30.000Z",
        )
        assert forwarder.held() == (0, 1)
        await forwarder.send_round(full=False)
        assert len(am.batches) == 2
        clock.advance(60)
        await forwarder.send_round(full=True)
        assert ends(am.batches[-1][0]) == "2026-01-01T00:01:30.000Z"
        clock.advance(KEEP_RESOLVED_S)
        sent = len(am.batches)
        await forwarder.send_round(full=True)
        assert (sent, (0, 0)) == (len(am.batches), forwarder.held())

    async def test_resolved_before_its_first_send_is_sent_resolved(self, clock, fleet, am):
        """An incident that resolves before a round sent it (or while one did) is sent as
        resolved: whatever Alertmanager may have of it ends."""
        forwarder = make(clock, fleet, am)
        row = fire(forwarder, fleet, clock)
        clock.advance(2)
        resolve(forwarder, fleet, clock, row)
        await forwarder.send_round(full=False)
        [done] = am.alerts()
        assert ends(done) == "2026-01-01T00:00:02.000Z"

    async def test_the_same_alert_firing_again_replaces_its_resolution(self, clock, fleet, am):
        """A new incident of the rule on the target is the same label set: its resolution is
        not sent any more (it would end the new one)."""
        forwarder = make(clock, fleet, am)
        row = fire(forwarder, fleet, clock)
        await forwarder.send_round(full=False)
        clock.advance(10)
        resolve(forwarder, fleet, clock, row)
        await forwarder.send_round(full=False)
        clock.advance(10)
        fire(forwarder, fleet, clock)
        await forwarder.send_round(full=True)
        [alert] = am.batches[-1]
        assert alert["startsAt"] == "2026-01-01T00:00:20.000Z"
        assert forwarder.held() == (1, 0)

    async def test_an_incident_gone_without_resolving_is_ended_now(self, clock, fleet, am):
        """An incident that no longer fires with no change told (its rule was removed by a
        reload) is sent ended at the round that finds it gone."""
        forwarder = make(clock, fleet, am)
        row = fire(forwarder, fleet, clock)
        await forwarder.send_round(full=False)
        del fleet.firing[row.id]
        clock.advance(30)
        await forwarder.send_round(full=True)
        assert ends(am.batches[-1][0]) == "2026-01-01T00:00:30.000Z"


class TestReload:
    async def test_new_labels_end_the_old_label_set(self, clock, fleet, am):
        """A reload that changes the static labels ends each alert under its old labels and
        sends it under the new ones, at once."""
        forwarder = make(clock, fleet, am, labels={"cluster": "a"})
        fire(forwarder, fleet, clock)
        await forwarder.send_round(full=False)
        clock.advance(5)
        forwarder.configure(AlertmanagerConfig(urls=(am.url,), labels={"cluster": "b"}), (am,))
        await forwarder.send_round(full=True)
        old, new = am.batches[-1]
        assert (old["labels"]["cluster"], ends(old)) == ("a", "2026-01-01T00:00:05.000Z")
        assert (new["labels"]["cluster"], ends(new)) == ("b", "2026-01-01T00:04:05.000Z")

    async def test_a_raised_min_severity_ends_what_no_longer_qualifies(self, clock, fleet, am):
        """Alerts below the new min_severity are ended, not left to expire."""
        forwarder = make(clock, fleet, am, min_severity=Severity.INFO)
        fire(forwarder, fleet, clock, rule=APP_XID)
        await forwarder.send_round(full=False)
        forwarder.configure(AlertmanagerConfig(urls=(am.url,)), (am,))
        await forwarder.send_round(full=True)
        [ended] = am.batches[-1]
        assert ends(ended) == ended["startsAt"]

    async def test_no_urls_sends_nothing_and_keeps_no_resolution(self, clock, fleet):
        """Without Alertmanagers a round does nothing and succeeds, and resolved incidents are
        not kept for a later send."""
        forwarder = make(clock, fleet)
        row = fire(forwarder, fleet, clock)
        assert await forwarder.send_round(full=True)
        resolve(forwarder, fleet, clock, row)
        assert forwarder.held() == (0, 0)

    async def test_turned_on_by_a_reload_it_sends_what_fires(self, clock, fleet, am):
        """Incidents that fired while it was off go out at the round after the reload."""
        forwarder = make(clock, fleet)
        fire(forwarder, fleet, clock)
        await forwarder.send_round(full=True)
        forwarder.configure(AlertmanagerConfig(urls=(am.url,)), (am,))
        await forwarder.send_round(full=True)
        assert [a["labels"]["alertname"] for a in am.alerts()] == ["gpu_lost"]


class TestFailures:
    async def test_one_alertmanager_down_does_not_stop_the_other(self, clock, fleet, am):
        """The one that answers gets the alerts; the failure is counted and logged with the
        error; the alert counts as delivered (the other gets it at the next full round)."""
        down = FakeAlertmanager("http://am-2:9093")
        down.error = "HTTP 400 Bad Request: invalid label set"
        forwarder = make(clock, fleet, am, down)
        fire(forwarder, fleet, clock)
        with capture_logs() as logs:
            assert await forwarder.send_round(full=False)
        assert len(am.alerts()) == 1
        assert (forwarder.failures[down.url], forwarder.failures[am.url]) == (1, 0)
        assert forwarder.sent[am.url] == 1
        [failed] = [e for e in logs if e["event"] == "alertmanager_send_failed"]
        assert failed["alertmanager"] == down.url
        assert failed["error"] == "HTTP 400 Bad Request: invalid label set"
        assert failed["log_level"] == "warning"
        down.error = None
        await forwarder.send_round(full=True)
        assert len(down.alerts()) == 1

    async def test_a_round_no_one_took_is_sent_again(self, clock, fleet, am):
        """When every Alertmanager failed, the next round (not only a full one) sends it."""
        am.error = "ConnectionRefusedError: [Errno 111] Connection refused"
        forwarder = make(clock, fleet, am)
        fire(forwarder, fleet, clock)
        assert not await forwarder.send_round(full=False)
        am.error = None
        assert await forwarder.send_round(full=False)
        assert len(am.alerts()) == 1

    async def test_a_down_alertmanager_is_logged_once_a_minute_then_its_recovery(
        self, clock, fleet, am
    ):
        """Every failure counts; the log says the first, then at most one a minute with the
        number it did not say, and one line when the Alertmanager takes alerts again."""
        am.error = "ConnectionRefusedError: [Errno 111] Connection refused"
        forwarder = make(clock, fleet, am)
        fire(forwarder, fleet, clock)
        with capture_logs() as logs:
            for _ in range(3):
                await forwarder.send_round(full=True)
                clock.advance(5)
            clock.advance(60)
            await forwarder.send_round(full=True)
            am.error = None
            await forwarder.send_round(full=True)
        failed = [e for e in logs if e["event"] == "alertmanager_send_failed"]
        assert [e["unlogged"] for e in failed] == [0, 2]
        assert forwarder.failures[am.url] == 4
        [back] = [e for e in logs if e["event"] == "alertmanager_send_recovered"]
        assert (back["alertmanager"], back["unlogged"]) == (am.url, 0)

    async def test_a_poster_that_raises_is_a_failed_send(self, clock, fleet, am):
        """A bug in sending is counted as a failure, not a crash of the forwarder."""

        def broken(body: bytes) -> str | None:
            raise RuntimeError("boom")

        am.post = broken
        forwarder = make(clock, fleet, am)
        fire(forwarder, fleet, clock)
        assert not await forwarder.send_round(full=False)
        assert forwarder.failures[am.url] == 1


class TestMetrics:
    async def test_the_families_have_one_series_per_alertmanager(self, clock, fleet, am):
        """Sent, failed and the last success per URL; alerts kept, by state."""
        forwarder = make(clock, fleet, am)
        fire(forwarder, fleet, clock)
        await forwarder.send_round(full=False)
        got = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in AlertmanagerCollector(forwarder).collect()
            for s in family.samples
        }
        url = (("alertmanager", am.url),)
        assert got[("fleetwatch_alertmanager_alerts_sent_total", url)] == 1
        assert got[("fleetwatch_alertmanager_send_failures_total", url)] == 0
        assert got[("fleetwatch_alertmanager_last_success_timestamp_seconds", url)] == clock.now()
        assert got[("fleetwatch_alertmanager_alerts", (("state", "firing"),))] == 1
        assert got[("fleetwatch_alertmanager_alerts", (("state", "resolved"),))] == 0
