import json
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
PROVISIONING = REPO / "deploy" / "grafana" / "provisioning"
DEPLOY_DOC = (REPO / "docs" / "deploy.md").read_text()


def load(kind: str) -> dict[str, Any]:
    data = yaml.safe_load((PROVISIONING / kind / "fleetwatch.yaml").read_text())
    assert isinstance(data, dict)
    return data


class TestDatasource:
    def test_one_prometheus_datasource_with_the_documented_uid(self):
        """The data source is Prometheus, proxied by Grafana, with the uid docs/deploy.md names."""
        data = load("datasources")
        assert data["apiVersion"] == 1
        [source] = data["datasources"]
        assert (source["type"], source["access"]) == ("prometheus", "proxy")
        assert source["url"].startswith("http://")
        assert f"`{source['uid']}`" in DEPLOY_DOC

    def test_time_interval_is_the_scrape_interval(self):
        """Grafana's $__rate_interval assumes the data source's interval is Prometheus' scrape
        interval (deploy/prometheus/prometheus.yml)."""
        [source] = load("datasources")["datasources"]
        prometheus = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
        assert source["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]

    def test_dashboards_choose_any_prometheus_source(self):
        """Every generated dashboard selects its data source through a `ds` variable of type
        prometheus, so the provisioned source (or any other) serves it."""
        boards = sorted((REPO / "dashboards" / "json").glob("*.json"))
        assert boards
        for board in boards:
            variables = json.loads(board.read_text())["templating"]["list"]
            ds = [v for v in variables if v["type"] == "datasource"]
            assert [(v["name"], v["query"]) for v in ds] == [("ds", "prometheus")], board.name


class TestDashboardProvider:
    def test_file_provider_into_the_fleetwatch_folder(self):
        """Dashboards load from files into the folder "fleetwatch", read-only in the UI."""
        data = load("dashboards")
        assert data["apiVersion"] == 1
        [provider] = data["providers"]
        assert (provider["type"], provider["folder"]) == ("file", "fleetwatch")
        assert provider["allowUiUpdates"] is False

    def test_deploy_doc_copies_the_generated_json_where_the_provider_reads(self):
        """docs/deploy.md copies dashboards/json/*.json to the provider's path."""
        [provider] = load("dashboards")["providers"]
        path = provider["options"]["path"]
        assert f"dashboards/json/*.json {path}/" in DEPLOY_DOC
