"""The reconnect storm of ``bench/collector_ingest.py``: a fleet back in the model after a restart.

A collector (pinned to its CPU) takes a fleet of replayed nodes (``bench/ingest/load.py
--reconnect``: each node reconnects with an agent's backoff, as ``agent/link/stream.py`` paces
it, and never gives up); once every node's first Report is in, the collector is killed (SIGKILL) and
started again on the same config and journal. ``reconnect_s``: from the restarted collector's
first accepted TCP connection to every node's first Report in its model (the ack of an event
sent right after that Report). Meanwhile the nodes already back keep sending a Report a second
and probe events: their send-to-ack latency (p50/p99/max) says whether the storm slows the
ingest of the nodes already in.

Also runnable on its own (``.venv/bin/python bench/ingest/reconnect.py --nodes 1024``), with
``--profile`` (py-spy on the restarted collector for the storm's first seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import IO, Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for bench.*
from bench.helpers.children import tail
from bench.helpers.collector_api import wait_healthy
from bench.helpers.pipe import FleetProcess
from bench.ingest.procs import LOAD, ROOT, Collector, Cores, log, pinned, record
from bench.ingest.size import hist_percentile, profile_start, profile_summary
from bench.ingest.wire import node_name

STORM_LIMIT_S = 240.0  # a restart whose fleet is not back by then is reported as not back
# The probes that say whether the nodes already back are slowed come from a process of their
# own with this many nodes: a load process reconnecting 512 nodes on the load's one core lags
# by hundreds of ms in a storm, and that lag (in the probe's write and in its ack's read) passed
# for the collector's. A real node's agent has its own machine.
PROBE_NODES = 32
PROBE_RATE = 10.0  # probe events a second from the probe process
STEADY_S = 10.0  # the probes' window before the restart: their figures with no storm


def _process(  # noqa: PLR0913, PLR0917 - one load process's share and settings
    collector: Collector,
    recording: Path,
    core: int,
    name: str,
    first: int,
    count: int,
    *,
    nodes: int,
    events_per_s: float,
) -> FleetProcess:
    err: IO[bytes] = (collector.workdir / f"{name}.log").open("wb")
    return FleetProcess(
        [
            f"--collector={collector.listen}",
            f"--recording={recording}",
            f"--first={first}",
            f"--count={count}",
            f"--nodes={nodes}",
            f"--events-per-s={events_per_s:g}",
            f"--connecting={count}",  # no pacing of our own: the agents' backoff only
            "--reconnect",
            f"--role={'probe' if name == 'probe' else 'load'}",
        ],
        err,
        script=LOAD,
        preexec=pinned({core}),
    )


def load_start(
    nodes: int, collector: Collector, recording: Path, core: int, per: int
) -> list[FleetProcess]:
    """Start the nodes, each reconnecting as an agent does: the probe process first.

    The first process holds the last ``PROBE_NODES`` nodes and sends ``PROBE_RATE`` probe
    events a second; the others ``per`` nodes each, with the fleet's 20 probes a second shared
    by their size (those probes are the load's; their figures are given apart).
    """
    probe = min(PROBE_NODES, nodes // 2)
    bulk = nodes - probe
    procs = [
        _process(
            collector,
            recording,
            core,
            "probe",
            bulk + 1,
            probe,
            nodes=nodes,
            events_per_s=PROBE_RATE * nodes / probe,
        )
    ]
    for i in range(math.ceil(bulk / per)):
        first, count = 1 + i * per, min(per, bulk - i * per)
        procs.append(
            _process(
                collector,
                recording,
                core,
                f"load-{i}",
                first,
                count,
                nodes=nodes,
                events_per_s=20.0,
            )
        )
    for proc in procs:
        proc.wait_for("started", 60)
    return procs


def ask(procs: list[FleetProcess], op: str) -> list[dict[str, Any]]:
    for proc in procs:
        proc.send(op=op)
    return [proc.wait_for(op, 60) for proc in procs]


def wait_ready(procs: list[FleetProcess], nodes: int, limit_s: float, began: float) -> list[Any]:
    """Poll until every node is ready; return the curve [[s, ready], ...] (last: all or not)."""
    curve: list[Any] = []
    while True:
        ready = sum(s["ready"] for s in ask(procs, "status"))
        waited = time.monotonic() - began
        curve.append([round(waited, 1), ready])
        if ready >= nodes or waited > limit_s:
            return curve
        if len(curve) % 20 == 0:
            log(f"    {ready}/{nodes} nodes in after {waited:.0f} s")
        time.sleep(0.5)


def first_accept(listen: str, proc: subprocess.Popen[bytes], limit_s: float = 60.0) -> float:
    """Monotonic time at which ``listen`` first accepts a TCP connection."""
    host, _, port = listen.rpartition(":")
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = "the restarted collector exited"
            raise RuntimeError(msg)
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex((host, int(port))) == 0:
                return time.monotonic()
        time.sleep(0.005)
    msg = f"the restarted collector did not accept on {listen} in {limit_s:g} s"
    raise TimeoutError(msg)


def restart(collector: Collector, core: int, command: list[str]) -> Collector:
    """SIGKILL the collector and start it again on the same config, ports and journal."""
    os.kill(collector.proc.pid, signal.SIGKILL)
    collector.proc.wait()
    collector.log_file.close()
    cfg = collector.workdir / "collector.toml"
    out = (collector.workdir / "collector-restarted.log").open("wb")
    proc = subprocess.Popen(  # noqa: S603 - the venv's own command
        [*command, "collector", "--config", str(cfg)],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        preexec_fn=pinned({core}),  # noqa: PLW1509 - no locks are taken before exec
    )
    return Collector(proc, collector.base, collector.listen, collector.workdir, out)


def evaluations(collector: Collector) -> float:
    """The collector's ``fleetwatch_rule_evaluations_total`` now."""
    with urllib.request.urlopen(collector.base + "/metrics/fleet", timeout=60) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith("fleetwatch_rule_evaluations_total "):
            return float(line.split()[1])
    msg = "no fleetwatch_rule_evaluations_total in /metrics/fleet"
    raise RuntimeError(msg)


def evaluations_per_node_s(collector: Collector, nodes: int, seconds: float = 10.0) -> float:
    """Rule conditions evaluated a second per node, the whole fleet streaming (steady)."""
    first, began = evaluations(collector), time.monotonic()
    time.sleep(seconds)
    done = evaluations(collector) - first
    return round(done / (time.monotonic() - began) / nodes, 2)


def loop_lag_p99_ms(windows: list[dict[str, Any]]) -> float | None:
    """The p99 of how late the processes' event loops woke, over ``windows`` together."""
    hist: Counter[int] = Counter()
    for w in windows:
        hist.update({int(k): int(v) for k, v in w.get("loop_lag_ms_hist", {}).items()})
    return hist_percentile(hist, 0.99)


def probe_figures(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The probe process's figures and the load processes', apart.

    ``probe_ack_*``: the probe process's events, send to ack (none without a probe process);
    ``load_probe_ack_*``: the load processes' own probes, which hold their loops' lag; each
    group's loop lag p99.
    """
    probe = [w for w in windows if w.get("role") == "probe"]
    load = [w for w in windows if w.get("role") != "probe"]
    out = {f"load_{k}": v for k, v in lag_figures(load).items()}
    out.update(lag_figures(probe))
    out["probe_loop_lag_p99_ms"] = loop_lag_p99_ms(probe)
    out["load_loop_lag_p99_ms"] = loop_lag_p99_ms(load)
    return out


def lag_figures(windows: list[dict[str, Any]]) -> dict[str, Any]:
    lags: list[float] = sorted(float(ms) for w in windows for _, ms in w["event_lags"])
    if not lags:
        return {"probe_events": 0}

    def q(p: float) -> float:
        return round(lags[min(len(lags) - 1, int(p * len(lags)))], 1)

    return {
        "probe_events": len(lags),
        "probe_ack_p50_ms": q(0.5),
        "probe_ack_p99_ms": q(0.99),
        "probe_ack_max_ms": round(lags[-1], 1),
        "probe_events_unacked": sum(w["events_unacked"] for w in windows),
    }


def measure(  # noqa: PLR0913 - the benchmark's shared parts
    nodes: int,
    workdir: Path,
    recording: Path,
    cores: Cores,
    command: list[str],
    *,
    per: int = 512,
    profile_s: float = 0.0,
) -> dict[str, Any]:
    """One restart with ``nodes`` nodes; the figures (``reconnect_s`` None when not all came)."""
    row: dict[str, Any] = {"nodes": nodes, "load_1m": round(os.getloadavg()[0], 2)}
    collector = Collector.start(workdir, "http://127.0.0.1:9/hook", nodes, cores.collector, command)
    procs: list[FleetProcess] = []
    try:
        procs = load_start(nodes, collector, recording, cores.load, per)
        began = time.monotonic()
        curve = wait_ready(procs, nodes, STORM_LIMIT_S, began)
        row["first_connect_s"] = curve[-1][0] if curve[-1][1] >= nodes else None
        log(f"  {nodes} nodes: first connect {curve[-1][0]} s ({curve[-1][1]} in); restarting")
        if curve[-1][1] < nodes:
            row["why"] = f"only {curve[-1][1]} of {nodes} nodes came in on the first start"
            row["reconnect_s"] = None
            return row
        time.sleep(3.0)
        for p in procs:
            p.send(op="record")
        time.sleep(STEADY_S)
        steady = probe_figures(ask(procs, "window"))
        row["steady"] = {k: v for k, v in steady.items() if not k.startswith("load_probe")}
        row.update(storm(collector, procs, nodes, cores, command, profile_s=profile_s))
        return row
    finally:
        for proc in procs:
            proc.stop()
        collector.stop()


def storm(  # noqa: PLR0913 - the running fleet and how to start its collector again
    collector: Collector,
    procs: list[FleetProcess],
    nodes: int,
    cores: Cores,
    command: list[str],
    *,
    profile_s: float = 0.0,
) -> dict[str, Any]:
    """SIGKILL the collector of a fleet whose every node is in, start it again, time the storm.

    The load ``procs`` must reconnect as agents do (``--reconnect``, or the ``reconnect`` op).
    The restarted collector is stopped before this returns; ``collector`` is dead by then.
    """
    row: dict[str, Any] = {}
    workdir = collector.workdir
    collector = restart(collector, cores.collector, command)
    try:
        t0 = first_accept(collector.listen, collector.proc)
        cpu0 = psutil.Process(collector.proc.pid).cpu_times()
        spy = (
            profile_start(collector, profile_s, workdir / "profile.txt", cores.load)
            if profile_s
            else None
        )
        for p in procs:
            p.send(op="record")
        curve = wait_ready(procs, nodes, STORM_LIMIT_S, t0)
        done = curve[-1][1] >= nodes
        cpu1 = psutil.Process(collector.proc.pid).cpu_times()
        row["reconnect_s"] = curve[-1][0] if done else None
        if not done:
            row["why"] = f"only {curve[-1][1]} of {nodes} nodes back in {STORM_LIMIT_S:g} s"
        busy = cpu1.user + cpu1.system - cpu0.user - cpu0.system
        row["collector_cpu_cores"] = round(busy / max(float(curve[-1][0]), 0.1), 2)
        row["ready_curve"] = [*curve[:: max(1, len(curve) // 20)], curve[-1]]
        windows = ask(procs, "window")
        row["reconnects"] = sum(w["reconnects"] for w in windows)
        errors: dict[str, int] = {}
        for w in windows:
            for name, n in w["errors"].items():
                errors[name] = errors.get(name, 0) + n
        row["stream_errors"] = errors
        row.update(probe_figures(windows))
        if not wait_healthy(collector.base, collector.proc):
            row["collector_log"] = tail(workdir / "collector-restarted.log")
        elif done:
            row["steady_rule_evaluations_per_node_s"] = evaluations_per_node_s(collector, nodes)
        if spy is not None:
            spy.wait(timeout=profile_s + 60)
            row["profile"] = profile_summary(workdir / "profile.txt", top=30)
        log(f"  {nodes} nodes back in {row['reconnect_s']} s after the restart")
        return row
    finally:
        collector.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--recording", type=Path, help="a recording to reuse")
    parser.add_argument("--profile", type=float, default=0.0, help="py-spy for this many s")
    parser.add_argument("--per", type=int, default=512, help="nodes per load process")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--code",
        type=Path,
        help="run the collector from another checkout (a tree of another commit) to compare",
    )
    args = parser.parse_args()
    cores = Cores.pick()
    with tempfile.TemporaryDirectory(prefix="fw-reconnect-") as tmp:
        workdir = Path(tmp)
        if args.keep:
            workdir = Path(tempfile.mkdtemp(prefix="fw-reconnect-keep-"))
        recording = args.recording or record(workdir, cores.load)
        command = [str(Path(sys.executable).parent / "fleetwatch")]
        if args.code is not None:
            boot = f"import sys; sys.path.insert(0, {str(args.code)!r}); "
            boot += "from cli.main import main; sys.exit(main())"
            command = [sys.executable, "-c", boot]
        row = measure(
            args.nodes,
            workdir / f"n{args.nodes}",
            recording,
            cores,
            command,
            per=args.per,
            profile_s=args.profile,
        )
        row["node_example"] = node_name(1)
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()


RECONNECT_TARGET: int = 4096


def reconnect_figures(
    nodes: int, workdir: Path, recording: Path, cores: Cores, command: list[str]
) -> dict[str, Any]:
    """The keys of ``bench/collector_ingest.py``'s last line for the reconnect storm.

    ``reconnect_s_at_4096`` (null with a why when another size ran or the fleet did not come
    back), the size run and its figures.
    """
    out: dict[str, Any] = {"reconnect_s_at_4096": None, "reconnect_nodes": nodes}
    if nodes <= 0:
        out["why_reconnect"] = "no reconnect run (--reconnect-nodes 0)"
        return out
    log(f"reconnect storm: {nodes} nodes, the collector killed and started again ...")
    try:
        row = measure(nodes, workdir / f"reconnect-{nodes}", recording, cores, command)
    except Exception as exc:  # noqa: BLE001 - the other figures of the run still count
        out["why_reconnect"] = f"the reconnect run at {nodes} nodes failed: {exc}"[:500]
        return out
    return storm_figures(nodes, row)


def storm_figures(nodes: int, row: dict[str, Any]) -> dict[str, Any]:
    """The last line's keys for a storm of ``nodes`` nodes measured as ``row``."""
    out: dict[str, Any] = {"reconnect_s_at_4096": None, "reconnect_nodes": nodes}
    out["reconnect"] = row
    out["reconnect_s"] = row.get("reconnect_s")
    if nodes == RECONNECT_TARGET and row.get("reconnect_s") is not None:
        out["reconnect_s_at_4096"] = row["reconnect_s"]
    elif nodes != RECONNECT_TARGET:
        out["why_reconnect"] = f"--reconnect-nodes {nodes}: the 4,096 run was not asked for"
    else:
        out["why_reconnect"] = row.get("why", "not every node came back")
    return out
