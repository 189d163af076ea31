"""The collector's HTTP API: its speed, and what slow clients do to it, against a baseline.

Two real collector processes side by side, ``fleetwatch collector`` from this tree and from a
baseline tree (``--baseline DIR``: a checkout of the commit to compare with, for example
``git worktree add /tmp/base <commit>`` or ``git archive <commit> | tar -x -C /tmp/base``; without
it, this tree runs twice). Each is fed by a simulated fleet of its own
(``bench/helpers/sim_fleet.py``: real agents on simulated nodes, real gRPC streams), so
``/metrics`` and the JSON API carry a real fleet's data. Both run with the same open-file limit
(``--nofile``, 256 by default as in the finding of issue 18).

1. Speed: ``--rounds`` rounds; in each, the two collectors in turn (the order alternating) answer
   ``--requests`` sequential requests of each endpoint (a new connection each, as the server
   closes after every answer); the figure per endpoint is the median over rounds of each round's
   median latency, and the ratio this tree / baseline (below 1: this tree is faster).
2. Slow clients: ``--slow`` connections each send half a request and then nothing (a connection
   not accepted within 3 s counts as failed). With them open, 10 ``/healthz`` requests (3 s
   timeout each): how many are answered and how fast. After
   ``--hold`` seconds: how many of the half-sent connections the server has closed, and how many
   of the fleet's nodes are still connected.

About 4 minutes on 2 cores with the defaults, half of it setting up the two fleets. Ends with
one line of JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fleetwatch.testing import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for bench.*
from bench.helpers.children import stop_process
from bench.helpers.pipe import FleetProcess

ROOT = Path(__file__).resolve().parents[1]
PR_SET_PDEATHSIG = 1
ENDPOINTS = ("/metrics", "/api/v1/nodes", "/api/v1/nodes/node-001", "/api/v1/events?limit=100")
HALF_REQUEST = b"GET /api/v1/nodes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Still-Typ"
HEALTH_PROBES = 10
PROBE_TIMEOUT_S = 3.0
RUN_COLLECTOR = "import sys; from cli.main import main; sys.exit(main(sys.argv[1:]))"


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


@dataclass
class Collector:
    """One collector process, the tree it runs from, and its simulated fleet."""

    name: str
    tree: Path
    workdir: Path
    nofile: int
    grpc: str = ""
    http_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    fleet: FleetProcess | None = None
    logs: list[IO[bytes]] = field(default_factory=list)

    def start(self, nodes: int) -> None:
        """Start the collector, then its fleet; return once every node is connected."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.grpc, self.http_port = f"127.0.0.1:{free_port()}", free_port()
        cfg = self.workdir / "collector.toml"
        cfg.write_text(
            f'[collector]\nlisten = "{self.grpc}"\nhttp = "127.0.0.1:{self.http_port}"\n'
            f'journal = "{self.workdir / "journal.db"}"\n'
        )
        nofile = self.nofile

        def limits() -> None:  # pragma: no cover - runs in the child between fork and exec
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        out = (self.workdir / "collector.log").open("wb")
        self.logs.append(out)
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter
            [sys.executable, "-c", RUN_COLLECTOR, "collector", "--config", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=self.tree,
            env={**os.environ, "PYTHONPATH": str(self.tree)},
            preexec_fn=limits,  # noqa: PLW1509 - no locks are taken before exec
        )
        deadline = time.monotonic() + 60
        while get(self.http_port, "/healthz", timeout_s=2)[0] != 200:  # noqa: PLR2004
            if self.proc.poll() is not None or time.monotonic() > deadline:
                msg = f"{self.name}: the collector did not come up (see {out.name})"
                raise RuntimeError(msg)
            time.sleep(0.2)
        fleet_log = (self.workdir / "fleet.log").open("wb")
        self.logs.append(fleet_log)
        self.fleet = FleetProcess(
            [
                f"--collector={self.grpc}",
                f"--root={self.workdir / 'nodes'}",
                f"--nodes={nodes}",
                "--poll-interval=5",
                "--spread=2",
            ],
            fleet_log,
        )
        self.fleet.wait_for("started", 120)
        deadline = time.monotonic() + 120
        while self.connected() < nodes:
            if time.monotonic() > deadline:
                msg = f"{self.name}: {self.connected()} of {nodes} nodes connected"
                raise RuntimeError(msg)
            time.sleep(0.5)

    def connected(self) -> int:
        """Nodes connected now (-1: the API did not answer)."""
        status, body = get(self.http_port, "/api/v1/nodes", timeout_s=10)
        if status != 200:  # noqa: PLR2004
            return -1
        return sum(1 for n in json.loads(body)["nodes"] if n["connected"])

    def stop(self) -> None:
        """Stop the fleet, then the collector."""
        if self.fleet is not None:
            self.fleet.stop()
        if self.proc is not None:
            stop_process(self.proc)
        for f in self.logs:
            f.close()


def get(port: int, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
    """One GET; status 0 when it failed (refused, reset, timed out)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def timed_gets(port: int, path: str, count: int) -> list[float]:
    """Latencies (ms) of ``count`` sequential GETs; a failed one stops the run."""
    times = []
    for _ in range(count):
        began = time.perf_counter()
        status, _ = get(port, path)
        if status != 200:  # noqa: PLR2004
            msg = f"GET {path}: status {status}"
            raise RuntimeError(msg)
        times.append((time.perf_counter() - began) * 1000)
    return times


def speed(collectors: list[Collector], rounds: int, requests: int) -> dict[str, Any]:
    medians: dict[str, dict[str, list[float]]] = {
        c.name: {p: [] for p in ENDPOINTS} for c in collectors
    }
    sizes: dict[str, dict[str, int]] = {c.name: {} for c in collectors}
    for r in range(rounds):
        for c in collectors if r % 2 == 0 else collectors[::-1]:
            for path in ENDPOINTS:
                medians[c.name][path].append(
                    statistics.median(timed_gets(c.http_port, path, requests))
                )
                sizes[c.name][path] = len(get(c.http_port, path)[1])
        log(f"speed: round {r + 1}/{rounds} done")
    result: dict[str, Any] = {}
    for path in ENDPOINTS:
        row = {c.name: round(statistics.median(medians[c.name][path]), 3) for c in collectors}
        row["ratio_current_to_baseline"] = round(row["current"] / row["baseline"], 3)
        row["bytes"] = sizes["current"][path]
        result[path] = row
    return result


def still_open(sock: socket.socket) -> bool:
    """True while the server holds ``sock`` open (no close or reset from it yet)."""
    sock.settimeout(0.0)  # non-blocking
    try:
        return bool(sock.recv(1024))  # data: an answer; b"": closed
    except BlockingIOError:
        return True
    except OSError:
        return False


def slow_clients(c: Collector, count: int, hold_s: float) -> dict[str, Any]:
    before = c.connected()
    held: list[socket.socket] = []
    refused = 0
    for _ in range(count):
        try:
            sock = socket.create_connection(("127.0.0.1", c.http_port), timeout=PROBE_TIMEOUT_S)
            sock.sendall(HALF_REQUEST)
            held.append(sock)
        except OSError:
            refused += 1
    time.sleep(1.0)  # the server takes them up
    latencies, failed = [], 0
    for _ in range(HEALTH_PROBES):
        began = time.perf_counter()
        status, _ = get(c.http_port, "/healthz", timeout_s=PROBE_TIMEOUT_S)
        if status == 200:  # noqa: PLR2004
            latencies.append((time.perf_counter() - began) * 1000)
        else:
            failed += 1
    time.sleep(hold_s)
    open_after = sum(still_open(s) for s in held)
    after = c.connected()
    for s in held:
        s.close()
    return {
        "half_sent": count,
        "connect_failed": refused,
        "healthz_answered": len(latencies),
        "healthz_failed": failed,
        "healthz_median_ms": round(statistics.median(latencies), 2) if latencies else None,
        "hold_s": hold_s,
        "half_sent_still_open_after_hold": open_after,
        "nodes_connected_before": before,
        "nodes_connected_after": after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--baseline", type=Path, default=ROOT, help="tree of the build to compare with"
    )
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--hold", type=float, default=12.0)
    parser.add_argument("--nofile", type=int, default=256)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, journals)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fleetwatch-http-bench-"))
    collectors = [
        Collector("baseline", args.baseline.resolve(), base / "baseline", args.nofile),
        Collector("current", ROOT, base / "current", args.nofile),
    ]
    try:
        for c in collectors:
            c.start(args.nodes)
            log(f"{c.name}: {args.nodes} nodes connected to the collector from {c.tree}")
        result: dict[str, Any] = {
            "nodes": args.nodes,
            "nofile": args.nofile,
            "cpus": os.cpu_count(),
            "baseline_tree": str(args.baseline.resolve()),
            "latency_ms": speed(collectors, args.rounds, args.requests),
        }
        result["slow_clients"] = {}
        for c in collectors:
            result["slow_clients"][c.name] = slow_clients(c, args.slow, args.hold)
            log(f"slow clients: {c.name} done")
    finally:
        for c in collectors:
            c.stop()
        if args.keep:
            log(f"work folder kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
