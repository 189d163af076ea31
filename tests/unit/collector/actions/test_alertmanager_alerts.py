"""An incident's Alertmanager alert: its label set, annotations, start and end."""

import ast
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from collector.actions import alertmanager_alerts
from collector.actions.alertmanager_alerts import (
    RESERVED_LABELS,
    alert_for,
    alert_labels,
    rfc3339,
    rule_labels,
    target_labels,
)
from collector.store.incidents import IncidentRow
from rules.model import Rule, Scope, Severity

FIRED_MS = 1_767_225_600_250  # 2026-01-01T00:00:00.250Z


def rule(**overrides) -> Rule:
    values: dict[str, Any] = {
        "name": "gpu_lost",
        "scope": Scope.GPU,
        "when": "!gpu.present",
        "severity": Severity.CRITICAL,
        "description": "The GPU fell off the bus.",
        "runbook": "https://runbooks.example/gpu_lost",
        "labels": {"component": "gpu"},
    }
    return Rule(**(values | overrides))


def row(**overrides) -> IncidentRow:
    values: dict[str, Any] = {
        "id": f"gpu_lost:node-7/gpu/3:{FIRED_MS - 5000}",
        "rule": "gpu_lost",
        "node": "node-7",
        "target": "node-7/gpu/3",
        "severity": "critical",
        "phase": "firing",
        "started_ms": FIRED_MS - 5000,
        "updated_ms": FIRED_MS,
        "fired_ms": FIRED_MS,
        "evidence": "GPU 3 GPU-1234",
    }
    return IncidentRow(**(values | overrides))


class TestTargetLabels:
    @pytest.mark.parametrize(
        ("scope", "node", "target", "expected"),
        [
            (Scope.NODE, "node-7", "node-7", {"node": "node-7"}),
            (Scope.GPU, "node-7", "node-7/gpu/3", {"node": "node-7", "gpu": "3"}),
            (
                Scope.NVLINK,
                "node-7",
                "node-7/gpu/3/nvlink/11",
                {"node": "node-7", "gpu": "3", "nvlink": "11"},
            ),
            (
                Scope.IB_PORT,
                "node-7",
                "node-7/ib/mlx5_0/1",
                {"node": "node-7", "ib_device": "mlx5_0", "ib_port": "1"},
            ),
            (Scope.JOB, "job/4711", "job/4711", {"training_job": "4711"}),
            (Scope.FLEET, "fleet", "fleet", {}),
        ],
    )
    def test_each_scope_names_its_parts(self, scope, node, target, expected):
        """A target key becomes the labels of its parts; jobs and the fleet have no node."""
        assert {"target": target} | expected == target_labels(scope, node, target)

    def test_a_key_of_another_shape_keeps_only_target(self):
        """A key that is not its scope's shape gives no parts, never wrong ones."""
        assert target_labels(Scope.GPU, "node-7", "node-7/nic/3") == {
            "target": "node-7/nic/3",
            "node": "node-7",
        }


class TestLabels:
    def test_the_label_set(self):
        """Rule, severity, scope and target, the rule's own labels and the static ones."""
        assert alert_labels(row(), rule(), {"cluster": "a"}) == {
            "alertname": "gpu_lost",
            "severity": "critical",
            "scope": "gpu",
            "node": "node-7",
            "target": "node-7/gpu/3",
            "gpu": "3",
            "component": "gpu",
            "cluster": "a",
        }

    def test_the_incident_id_is_not_a_label(self):
        """Two incidents of one rule on one target (a fault that comes back) are one alert."""
        first = alert_for(row(), rule(), {})
        again = alert_for(
            row(id="gpu_lost:node-7/gpu/3:999", fired_ms=FIRED_MS + 60_000), rule(), {}
        )
        assert first.fingerprint == again.fingerprint
        assert first.annotations["fleetwatch_incident"] != again.annotations["fleetwatch_incident"]

    def test_two_targets_are_two_alerts(self):
        """Another GPU of the node, or the same GPU on another node, is another label set."""
        base = alert_for(row(), rule(), {}).fingerprint
        other_gpu = alert_for(row(target="node-7/gpu/4"), rule(), {}).fingerprint
        other_node = alert_for(row(node="node-8", target="node-8/gpu/3"), rule(), {}).fingerprint
        assert len({base, other_gpu, other_node}) == 3

    def test_precedence_fleetwatch_then_rule_then_static(self):
        """The rule's labels win over static ones; neither may change fleetwatch's own."""
        labels = alert_labels(
            row(),
            rule(labels={"team": "gpu-infra", "severity": "page", "bad-name": "x", "__x": "y"}),
            {"team": "default", "cluster": "a"},
        )
        assert (labels["team"], labels["severity"], labels["cluster"]) == (
            "gpu-infra",
            "critical",
            "a",
        )
        assert "bad-name" not in labels
        assert "__x" not in labels

    def test_the_rule_labels_refused_are_named(self):
        """Invalid and reserved names are kept out and reported, empty values left out."""
        kept, refused = rule_labels(rule(labels={"node": "x", "a-b": "y", "ok": "1", "none": ""}))
        assert (kept, refused) == ({"ok": "1"}, ["node", "a-b"])

    def test_reserved_labels_are_every_label_fleetwatch_sets(self):
        """No label of fleetwatch's own is missing from the reserved set."""
        for scope, node, target in [
            (Scope.NVLINK, "n", "n/gpu/1/nvlink/2"),
            (Scope.IB_PORT, "n", "n/ib/d/1"),
            (Scope.JOB, "job/j", "job/j"),
        ]:
            got = alert_labels(
                row(node=node, target=target), rule(scope=scope, labels={}), {}
            ).keys()
            assert set(got) <= RESERVED_LABELS


class TestBody:
    def test_firing_alert(self):
        """startsAt is the firing time, endsAt the one given; annotations tell the incident."""
        alert = alert_for(row(), rule(), {}, "https://fleetwatch.example:9470/")
        assert {
            "labels": alert.labels,
            "annotations": {
                "summary": "gpu_lost on node-7/gpu/3",
                "description": "The GPU fell off the bus.",
                "evidence": "GPU 3 GPU-1234",
                "runbook_url": "https://runbooks.example/gpu_lost",
                "fleetwatch_incident": row().id,
            },
            "startsAt": "2026-01-01T00:00:00.250Z",
            "endsAt": "2026-01-01T00:04:00.250Z",
            "generatorURL": (
                "https://fleetwatch.example:9470/api/v1/incidents?rule=gpu_lost&node=node-7"
            ),
        } == alert.body(FIRED_MS + 240_000)

    def test_resolved_alert_ends_when_the_incident_resolved(self):
        """A resolved incident's alert ends at its resolution, not at the send."""
        resolved_ms = FIRED_MS + 90_000
        alert = alert_for(row(phase="resolved", resolved_ms=resolved_ms), rule(), {})
        assert alert.body(resolved_ms)["endsAt"] == "2026-01-01T00:01:30.250Z"

    def test_an_end_never_comes_before_the_start(self):
        """endsAt before startsAt (a wall clock stepped back) is the start itself."""
        assert alert_for(row(), rule(), {}).body(0)["endsAt"] == "2026-01-01T00:00:00.250Z"

    def test_no_runbook_no_description_no_link(self):
        """Empty texts are left out, and without an external URL there is no generatorURL."""
        body = alert_for(row(evidence=""), rule(runbook="", description=""), {}).body(FIRED_MS)
        assert list(body["annotations"]) == ["summary", "fleetwatch_incident"]
        assert "generatorURL" not in body

    def test_escalated_and_never_fired(self):
        """An escalated incident says so; one with no firing time starts when it started."""
        alert = alert_for(replace(row(), escalated=True, fired_ms=None), rule(), {})
        assert alert.annotations["escalated"] == "true"
        assert alert.starts_ms == FIRED_MS - 5000

    def test_job_incident_link(self):
        """A job's incident links to the job's incidents (its node is job/<id>)."""
        job = row(rule="job_hung", node="job/4711", target="job/4711")
        link = alert_for(job, rule(name="job_hung", scope=Scope.JOB), {}, "http://c:9470").body(0)
        assert (
            link["generatorURL"] == "http://c:9470/api/v1/incidents?rule=job_hung&node=job%2F4711"
        )


class TestTimes:
    def test_rfc3339_in_utc_with_milliseconds(self):
        """Times are UTC with milliseconds and a Z, as Alertmanager writes them."""
        assert rfc3339(FIRED_MS) == "2026-01-01T00:00:00.250Z"
        assert rfc3339(0) == "1970-01-01T00:00:00.000Z"


def test_all_names_the_public_names():
    """``__all__`` lists exactly what the module defines without a leading underscore."""
    tree = ast.parse(Path(alertmanager_alerts.__file__).read_text(encoding="utf-8"))
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    assert {n for n in defined if not n.startswith("_")} == set(alertmanager_alerts.__all__)
