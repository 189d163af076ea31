"""The Grafana dashboards: generated JSON is current, well formed, and reads exported metrics."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from collector.export.catalog import catalog
from dashboards import build
from dashboards.queries import dashboard_queries, metric_names

ROOT = Path(__file__).parents[3]
JSON_DIR = ROOT / "dashboards" / "json"
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "fleetwatch.yaml"
DASHBOARDS = sorted(JSON_DIR.glob("*.json"))
# A histogram's series are its _bucket, _sum and _count.
CATALOG_NAMES = {spec.name for spec in catalog()} | {
    f"{spec.name}{suffix}"
    for spec in catalog()
    if spec.kind == "histogram"
    for suffix in ("_bucket", "_sum", "_count")
}
# Series Prometheus makes itself, which rules may read.
PROMETHEUS_SERIES = {"up"}


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in sorted(RULES_DIR.glob("*.yml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def recorded() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def provisioned_prometheus() -> dict[str, Any]:
    """The one Prometheus data source deploy/grafana provisions."""
    sources = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    (source,) = [s for s in sources if s["type"] == "prometheus"]
    return dict(source)


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


class TestGenerated:
    def test_committed_json_is_what_the_code_builds(self, tmp_path):
        """Regenerating the dashboards gives the committed JSON byte for byte (else: run
        `make dashboards`)."""
        written = build.write_all(tmp_path)
        assert sorted(p.name for p in DASHBOARDS) == sorted(p.name for p in written)
        for path in written:
            committed = (JSON_DIR / path.name).read_text()
            assert committed == path.read_text(), f"{path.name} is stale: run `make dashboards`"

    def test_main_writes_into_the_folder_it_is_given(self, tmp_path, capsys):
        """`python -m dashboards.build --out DIR` writes one file per dashboard and names it."""
        assert build.main(["--out", str(tmp_path / "out")]) == 0
        names = sorted(p.name for p in (tmp_path / "out").iterdir())
        assert names == sorted(p.name for p in DASHBOARDS)
        assert len(capsys.readouterr().out.splitlines()) == len(names)

    def test_deploy_docs_state_the_grafana_the_schema_version_needs(self):
        """Every dashboard is at schemaVersion 42, first in Grafana 12.2.0, and docs/deploy.md
        says so (a new SDK that moves the schema fails here until the docs move too)."""
        assert {load(path)["schemaVersion"] for path in DASHBOARDS} == {42}
        docs = " ".join((ROOT / "docs" / "deploy.md").read_text().split())
        assert "`schemaVersion` 42, so they need Grafana 12.2 or later" in docs

    def test_there_are_the_five_dashboards(self):
        """Fleet overview, node detail, job health, reliability and pre-flight are generated."""
        assert [p.stem for p in DASHBOARDS] == [
            "fleetwatch-fleet-overview",
            "fleetwatch-job-health",
            "fleetwatch-node-detail",
            "fleetwatch-preflight",
            "fleetwatch-reliability",
        ]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
class TestDashboard:
    def test_has_a_prometheus_datasource_variable_every_query_uses(self, path):
        """A `ds` variable of type prometheus; every panel and target queries `${ds}`."""
        dashboard = load(path)
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["ds"]["type"] == "datasource"
        assert variables["ds"]["query"] == "prometheus"
        for panel in all_panels(dashboard):
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${ds}"}, panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${ds}", panel["title"]
        for annotation in dashboard["annotations"]["list"]:
            assert annotation["datasource"]["uid"] == "${ds}"

    def test_datasource_variable_defaults_to_the_provisioned_prometheus(self, path):
        """`ds` starts on the data source deploy/grafana provisions (its uid, shown by its
        name), not on whatever Prometheus is Grafana's default."""
        source = provisioned_prometheus()
        variables = {v["name"]: v for v in load(path)["templating"]["list"]}
        assert {"text": source["name"], "value": source["uid"]} == variables["ds"]["current"]

    def test_identity_time_and_refresh(self, path):
        """uid is the file name, tagged fleetwatch, a time range and a refresh interval."""
        dashboard = load(path)
        assert path.stem == dashboard["uid"]
        assert len(dashboard["uid"]) <= 40
        assert "fleetwatch" in dashboard["tags"]
        assert dashboard["refresh"]
        assert dashboard["time"]["to"] == "now"
        assert dashboard["title"].startswith("fleetwatch: ")

    def test_panel_ids_unique_and_refids_unique_per_panel(self, path):
        """Panel ids are 1..n; a panel's queries are A, B, C ..."""
        panels = all_panels(load(path))
        assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
        for panel in panels:
            refs = [t["refId"] for t in panel.get("targets", [])]
            assert refs == [chr(ord("A") + i) for i in range(len(refs))], panel["title"]

    def test_every_panel_has_a_title_description_and_a_query(self, path):
        """No empty panels: each says what it shows and queries something."""
        for panel in all_panels(load(path)):
            if panel["type"] == "row":
                continue
            assert panel["title"]
            assert panel["description"], panel["title"]
            assert panel["targets"], panel["title"]
            assert all(t["expr"] for t in panel["targets"]), panel["title"]

    def test_legends_are_shown(self, path):
        """0.0.21 hides legends by default: time series and state timelines show theirs."""
        for panel in all_panels(load(path)):
            if panel["type"] in ("timeseries", "state-timeline"):
                assert panel["options"]["legend"]["showLegend"] is True, panel["title"]

    def test_tables_ask_for_tables_and_other_panels_for_series(self, path):
        """Table panels read table-format results; stats and bars read series, so their legend
        (e.g. each node state's name) applies."""
        for panel in all_panels(load(path)):
            for target in panel.get("targets", []):
                wanted = "table" if panel["type"] == "table" else None
                assert target.get("format") == wanted, panel["title"]

    def test_rates_use_the_rate_interval_or_the_range(self, path):
        """rate() and increase() windows are $__rate_interval (or $__range for totals)."""
        for query in dashboard_queries(load(path)):
            for window in re.findall(r"\[([^\]]+)\]", query.expr):
                assert window in ("$__rate_interval", "$__range"), (query.where, query.expr)

    def test_reads_only_metrics_the_collector_exports(self, path):
        """Every metric a query reads is in the collector's catalog, or is a recording rule
        of deploy/prometheus/rules."""
        known = CATALOG_NAMES | recorded()
        for query in dashboard_queries(load(path)):
            names = metric_names(query.expr)
            assert names, (query.where, query.expr)
            assert names <= known, (query.where, query.expr, sorted(names - known))


class TestPrometheusRules:
    def test_rules_read_only_metrics_the_collector_exports(self):
        """Recording and alerting rules read cataloged metrics, recorded series and `up`."""
        known = CATALOG_NAMES | recorded() | PROMETHEUS_SERIES
        for rule in rules():
            names = metric_names(rule["expr"])
            assert names, rule
            assert names <= known, (rule.get("record") or rule["alert"], sorted(names - known))

    def test_recording_rules_follow_the_naming_convention(self):
        """level:metric:operations, the metric a fleetwatch one without `_total`."""
        for name in recorded():
            level, metric, operations = name.split(":")
            assert level
            assert operations
            assert metric.startswith("fleetwatch_")
            assert not metric.endswith("_total")

    def test_alerts_have_severity_summary_and_description(self):
        """Every alert says how bad it is and what to do."""
        alerts = [rule for rule in rules() if "alert" in rule]
        assert alerts
        for alert in alerts:
            assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
            assert alert["annotations"]["summary"], alert["alert"]
            assert alert["annotations"]["description"], alert["alert"]


class TestMetricNames:
    @pytest.mark.parametrize(
        ("expr", "names"),
        [
            ("fleetwatch_node_up", {"fleetwatch_node_up"}),
            ('fleetwatch_gpu_present{node="$node"} == 0', {"fleetwatch_gpu_present"}),
            (
                "sum by (class) (rate(fleetwatch_gpu_xid_errors_total[$__rate_interval]))",
                {"fleetwatch_gpu_xid_errors_total"},
            ),
            (
                "fleetwatch_gpu_info and on (node, gpu) (fleetwatch_gpu_present == 0)",
                {"fleetwatch_gpu_info", "fleetwatch_gpu_present"},
            ),
            ("count(fleetwatch_incident_firing) or vector(0)", {"fleetwatch_incident_firing"}),
            (
                "avg_over_time(fleet:fleetwatch_nodes:count[$__range]) * $__range_s / 86400",
                {"fleet:fleetwatch_nodes:count"},
            ),
            ('up{job="fleetwatch"} == 0', {"up"}),
            ('label_replace(a, "dst", "x", "src", "(.*)") * 1e3 offset 5m', {"a"}),
            ("sum(x) without (gpu) / ignoring (gpu) group_left (model) y", {"x", "y"}),
            ("label_values(fleetwatch_node_up, node)", {"fleetwatch_node_up"}),
            ('label_values(fleetwatch_job_step{job=~".+"}, job)', {"fleetwatch_job_step"}),
            ("label_values(node)", set()),
            ("time() - 1", set()),
        ],
    )
    def test_finds_the_metrics_an_expression_reads(self, expr, names):
        """Functions, keywords, label names, strings, numbers and variables are not metrics."""
        assert names == metric_names(expr)

    def test_queries_of_a_dashboard_include_annotations_and_variables(self):
        """Panel targets, annotation expressions and variable queries are all listed."""
        queries = dashboard_queries(load(JSON_DIR / "fleetwatch-node-detail.json"))
        kinds = {q.where.split()[0] for q in queries}
        assert kinds == {"panel", "annotation", "variable"}
        variables = [q for q in queries if q.variable]
        assert [q.expr for q in variables] == ["label_values(fleetwatch_node_up, node)"]
        assert any(q.instant for q in queries)
