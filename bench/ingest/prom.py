"""Debian's real Prometheus scraping the collector during a size's window (``--scrape-sizes``).

It finds the collector's targets through HTTP service discovery (``/api/v1/scrape_targets``: the
fleet's target and one per shard of nodes), as deploy/prometheus/prometheus.yml configures it,
and scrapes every one every ``interval_s`` (15 s). It runs on the load's CPU, so its own work
(about a sample a microsecond) is not the collector's; what it costs is reported beside.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import psutil

from bench.ingest.procs import pinned
from fleetwatch.testing import free_port

if TYPE_CHECKING:
    from pathlib import Path

SAMPLE_LIMIT = 5000


@dataclass
class Prometheus:
    """One Prometheus server and its log."""

    proc: subprocess.Popen[bytes]
    port: int
    log_file: IO[bytes]

    @classmethod
    def start(cls, workdir: Path, collector_base: str, core: int, interval_s: float) -> Prometheus:
        """Configure and start it; it discovers ``collector_base``'s targets at once."""
        binary = shutil.which("prometheus")
        if binary is None:
            msg = "prometheus is missing (scripts/ensure-test-deps.sh installs Debian's)"
            raise RuntimeError(msg)
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            f"global: {{scrape_interval: {interval_s:g}s, evaluation_interval: 60s}}\n"
            "scrape_configs:\n"
            "  - job_name: fleetwatch\n"
            "    scrape_timeout: 10s\n"
            f"    sample_limit: {SAMPLE_LIMIT}\n"
            "    http_sd_configs:\n"
            f"      - url: {collector_base}/api/v1/scrape_targets\n"
            "        refresh_interval: 5s\n"
            "    metric_relabel_configs:\n"
            "      - {action: labeldrop, regex: shard}\n"
        )
        log_file = (workdir / "prometheus.log").open("wb")
        proc = subprocess.Popen(  # noqa: S603 - Debian's prometheus
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            preexec_fn=pinned({core}),  # noqa: PLW1509 - no locks are taken before exec
        )
        return cls(proc, port, log_file)

    def ask(self, path: str, **params: str) -> Any:  # noqa: ANN401 - Prometheus' JSON
        """One API call's ``data`` (None while it is not up)."""
        url = f"http://127.0.0.1:{self.port}{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                return json.loads(resp.read())["data"]
        except OSError:
            return None

    def targets(self) -> list[dict[str, Any]]:
        """The active targets."""
        data = self.ask("/api/v1/targets", state="active")
        return list(data["activeTargets"]) if data else []

    def wait_scraped(self, shards_at_least: int, timeout_s: float) -> float:
        """Wait until every target it found was scraped once and is up; return the seconds.

        The fleet's target and ``shards_at_least`` shard targets at least.
        """
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            targets = self.targets()
            if len(targets) > shards_at_least and all(t["health"] == "up" for t in targets):
                return time.monotonic() - began
            time.sleep(1.0)
        msg = f"Prometheus did not scrape every target within {timeout_s:g} s"
        raise TimeoutError(msg)

    def value(self, promql: str) -> float | None:
        """An instant query's single value."""
        data = self.ask("/api/v1/query", query=promql)
        rows = data["result"] if data else []
        return float(rows[0]["value"][1]) if rows else None

    def figures(self) -> dict[str, Any]:
        """What it scraped: targets, samples a round, the slowest scrape, its own CPU and RSS."""
        targets = self.targets()
        proc = psutil.Process(self.proc.pid)
        return {
            "prometheus_targets": len(targets),
            "prometheus_targets_up": sum(t["health"] == "up" for t in targets),
            "prometheus_samples_per_round": self.value(
                'sum(scrape_samples_scraped{job="fleetwatch"})'
            ),
            "prometheus_largest_target_samples": self.value(
                'max(scrape_samples_scraped{job="fleetwatch"})'
            ),
            "prometheus_scrape_duration_max_s": self.value(
                'max(scrape_duration_seconds{job="fleetwatch"})'
            ),
            "prometheus_scrape_duration_p50_s": self.value(
                'quantile(0.5, scrape_duration_seconds{job="fleetwatch"})'
            ),
            "prometheus_series": self.value("prometheus_tsdb_head_series"),
            "prometheus_rss_mb": round(proc.memory_info().rss / 2**20),
        }

    def stop(self) -> None:
        """Terminate it (kill if it will not go)."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log_file.close()
