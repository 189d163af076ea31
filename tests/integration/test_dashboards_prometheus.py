"""Every query of every dashboard answers, with data, from a real Prometheus scraping the demo.

`fleetwatch demo` (the real command: collector, simulated nodes, the built-in fault scenario)
runs while Prometheus 2.x, configured from deploy/prometheus (scrape config, recording and
alerting rules), scrapes it every second. Once the scenario's faults are over, and while the
demo still runs (Prometheus marks a vanished target's series stale at once), each panel target,
annotation and template-variable query of the generated dashboards goes to Prometheus with its
variables filled in. It must parse and return data, and every metric it names must exist in
Prometheus, so that `or vector(0)` cannot hide a metric nobody exports.
"""

import datetime as dt
import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.queries import Query, dashboard_queries, metric_names
from fleetwatch.testing import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy" / "prometheus"
DASHBOARDS = sorted((ROOT / "dashboards" / "json").glob("*.json"))
DEMO_SECONDS = 30  # the built-in scenario's own length: its faults end by 18 s
DEMO_JOB = "demo-pretrain"
# The node detail dashboard shows node-01: a lost GPU (Xid 79, a failure, a drain), IB
# congestion, a thermally throttled GPU, a straggling rank.
NODE = "node-01"
RATE_INTERVAL = "5s"  # Grafana's $__rate_interval for a 1 s scrape interval is 4 s
# Queries the demo cannot give data, and why. Their metric need not exist in Prometheus either
# (tests/unit/dashboards/test_dashboards.py checks it is in the collector's catalog).
MAY_BE_EMPTY = {
    ("fleetwatch-fleet-overview", "panel 'Messages rejected'"): (
        "the demo's agents send nothing the collector refuses, and a rejection reason gets its "
        "series with the first rejection"
    ),
    ("fleetwatch-reliability", "panel 'Which nodes are lemons'"): "no node of the demo is a lemon",
    # No node of the demo is back in service, nor has two incident episodes, in its 30 s.
    **{
        ("fleetwatch-reliability", f"panel '{title}'"): (
            "no repair ends and no node has a second incident episode in the demo"
        )
        for title in (
            "Mean time to repair (30 days)",
            "Median time to repair over the range",
            "Mean time between incidents (30 days)",
            "Median time between incidents over the range",
        )
    },
    # The pre-flight series exist once a run finished; this demo starts no pre-flight run.
    **{
        ("fleetwatch-preflight", f"panel '{title}'"): "no pre-flight run in this demo"
        for title in (
            "Newest run",
            "Since the newest run",
            "Nodes held back",
            "Nodes by their newest qualification",
            "Qualification over time",
            "Runs by verdict",
            "Nodes by verdict",
            "Results refused",
        )
    },
}


def get(port: int, path: str, **params: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - http on loopback
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:  # a bad query answers 400 with the error in JSON
        return dict(json.loads(exc.read()))


def prometheus_config(tmp_path: Path, target: str) -> Path:
    """deploy/prometheus/prometheus.yml, scraping the demo every second with the rules loaded."""
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(DEPLOY / f) for f in config["rule_files"]]
    (job,) = config["scrape_configs"]
    job.update(scrape_interval="1s", scrape_timeout="1s")
    (sd,) = job["http_sd_configs"]  # the collector's own targets: the fleet's and the shards
    sd.update(url=f"http://{target}/api/v1/scrape_targets", refresh_interval="1s")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def substitute(expr: str, range_s: int) -> str:
    """Fill in the dashboard variables as Grafana would for the demo's time range."""
    for name, value in (
        ("$__rate_interval", RATE_INTERVAL),
        ("$__range_s", str(range_s)),
        ("$__range", f"{range_s}s"),
        ("$__interval", "1s"),
        ("$node", NODE),
        ("$job", DEMO_JOB),
    ):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a variable this test does not know: {expr}"
    return expr


def ask(port: int, query: Query, start: float, end: float) -> dict[str, Any]:
    """Send a query the way Grafana does: instant at the end, or over the range."""
    expr = substitute(query.expr, int(end - start))
    if query.variable:  # label_values(metric, label): Grafana asks the series API
        names = metric_names(expr)
        return get(port, "/api/v1/series", **{"match[]": next(iter(names))}, end=str(end))
    if query.instant:
        return get(port, "/api/v1/query", query=expr, time=str(end))
    return get(port, "/api/v1/query_range", query=expr, start=str(start), end=str(end), step="1")


def unix(rfc3339: str) -> float:
    """Prometheus' time stamp (RFC 3339) in Unix seconds."""
    return dt.datetime.fromisoformat(rfc3339).timestamp()


def caught_up(port: int, since: float) -> float | None:
    """When every target was last scraped and every rule group last evaluated, if each was done
    at least twice since ``since`` (Unix seconds; both run every second), and every target is
    up; else None."""
    targets = get(port, "/api/v1/targets")["data"]["activeTargets"]
    groups = get(port, "/api/v1/rules")["data"]["groups"]
    if not targets or not groups or any(t["health"] != "up" for t in targets):
        return None
    last = [unix(t["lastScrape"]) for t in targets] + [unix(g["lastEvaluation"]) for g in groups]
    return min(last) if min(last) > since + 1.0 else None


class Daemons:
    """Prometheus and the demo, started on loopback; stopped whatever happens."""

    def __init__(self, tmp_path: Path) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: scripts/ensure-test-deps.sh installs it"
        self.http_port = free_port()
        self.prom_port = free_port()
        self.logs = (tmp_path / "prometheus.log").open("w"), (tmp_path / "demo.log").open("w")
        config = prometheus_config(tmp_path, f"127.0.0.1:{self.http_port}")
        self.prometheus = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.logs[0],
        )
        self.demo = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.main",
                "demo",
                "--nodes",
                "4",
                "--duration",
                str(DEMO_SECONDS),
                "--http-port",
                str(self.http_port),
                "--workdir",
                str(tmp_path / "demo"),
            ],
            stdout=self.logs[1],
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        self.started = time.time()

    def stop(self) -> None:
        for process in (self.demo, self.prometheus):
            if process.poll() is None:
                process.terminate()
        for process in (self.demo, self.prometheus):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self.logs:
            log.close()


def wait_for(what: str, check: Any, daemons: Daemons, timeout: float) -> Any:
    """Poll ``check`` until it answers something true, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if answer := check():
                return answer
        except OSError:
            pass  # Prometheus not listening yet
        assert daemons.demo.poll() is None, f"the demo ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def test_every_dashboard_query_answers_with_data(tmp_path):
    """After the demo's faults, each panel, annotation and variable query of every dashboard
    parses, returns data, and reads only metrics that exist in Prometheus."""
    daemons = Daemons(tmp_path)
    try:

        def has(promql: str) -> bool:
            return bool(get(daemons.prom_port, "/api/v1/query", query=promql)["data"]["result"])

        wait_for("Prometheus to scrape the demo", lambda: has("fleetwatch_node_up"), daemons, 30)
        begun = time.time()
        # The scenario's last fault, node-04 crashing at 18 s, shows as unreachable ~3 s later.
        wait_for(
            "node-04 to go unreachable",
            lambda: has('fleetwatch_node_up{node="node-04"} == 0'),
            daemons,
            DEMO_SECONDS,
        )
        seen = time.time()
        port = daemons.prom_port
        # A few more scrapes and rule evaluations after the last fault: the queries ask about
        # the time by which everything was scraped and evaluated.
        end = wait_for(
            "more scrapes and rule evaluations",
            lambda: caught_up(port, seen),
            daemons,
            DEMO_SECONDS,
        )
        # What Prometheus holds now (rules, alerts), while the demo still runs: its series go
        # stale once it ends.
        rules = [r for g in get(port, "/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        alerts = {
            (a["labels"]["alertname"], a["labels"].get("node"), a["labels"].get("gpu"))
            for a in get(port, "/api/v1/alerts")["data"]["alerts"]
        }
        assert daemons.demo.poll() is None, "the demo ended before the queries' time"
        names = set(get(port, "/api/v1/label/__name__/values", end=str(end))["data"])
        failures = []
        queries = [
            q for path in DASHBOARDS for q in dashboard_queries(json.loads(path.read_text()))
        ]
        for query in queries:
            answer = ask(port, query, begun, end)
            problem = ""
            if answer.get("status") != "success":
                problem = f"{answer.get('errorType')}: {answer.get('error')}"
            elif (query.dashboard, query.where) in MAY_BE_EMPTY:
                pass
            elif not (answer["data"] if query.variable else answer["data"]["result"]):
                problem = "no data"
            elif missing := metric_names(query.expr) - names:
                problem = f"metrics not in Prometheus: {sorted(missing)}"
            if problem:
                failures.append(f"{query.dashboard} {query.where}: {query.expr!r}: {problem}")
        failures.extend(
            f"rule {rule['name']}: {rule['lastError']}" for rule in rules if rule["health"] == "err"
        )
        failures.extend(
            f"recording rule {rule['name']}: no series"
            for rule in rules
            if rule["type"] == "recording" and rule["name"] not in names
        )
    finally:
        daemons.stop()
    assert len(queries) > 100
    assert set(MAY_BE_EMPTY) <= {(q.dashboard, q.where) for q in queries}
    # The alerting rules see the demo's faults too (pending: their `for` is minutes).
    assert ("FleetwatchGpuLost", "node-01", "3") in alerts
    assert ("FleetwatchNodeUnreachable", "node-04", None) in alerts
    assert not failures, f"{len(failures)} of {len(queries)} queries failed:\n" + "\n".join(
        failures
    )
