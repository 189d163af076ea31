"""A benchmark collector's HTTP API: waiting for it, its JSON, its metrics, its whole journal."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess


def http_get(url: str, timeout_s: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return bytes(resp.read())


def wait_healthy(base: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> bool:
    """Wait until ``base``/healthz answers; False if ``proc`` ended or time ran out first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            http_get(base + "/healthz", timeout_s=2)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        else:
            return True


def api(base: str, path: str) -> Any:  # noqa: ANN401 - JSON
    return json.loads(http_get(base + path))


def nodes_reported(base: str) -> int:
    """Nodes whose first report is in the collector's model (they have a GPU temperature)."""
    text = http_get(base + "/metrics", timeout_s=30.0).decode()
    seen = set()
    for line in text.splitlines():
        if line.startswith("fleetwatch_gpu_temperature_celsius{"):
            labels = line[line.index("{") + 1 : line.index("}")]
            for pair in labels.split(","):
                name, _, value = pair.partition("=")
                if name == "node":
                    seen.add(value.strip('"'))
    return len(seen)


def journal_events(base: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = api(base, f"/api/v1/events?after={after}&limit=1000&order=asc")
        events.extend(page["events"])
        if page["last_id"] is None or len(page["events"]) < 1000:  # noqa: PLR2004
            return events
        after = page["last_id"]
