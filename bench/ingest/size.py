"""One fleet size of ``bench/collector_ingest.py``: start, connect, warm up, measure, judge.

Also the fault run (faults sent as recorded agent messages on loaded streams, webhooks
timed as ``bench/fault_to_action.py`` times them) and the collector's profile (py-spy).
"""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from bench.helpers.collector_api import api, http_get, journal_events
from bench.helpers.cpu import cpu_phase, cpu_since
from bench.helpers.faults import (
    FAULTS,
    PlannedFault,
    add_stages,
    first_arrivals,
    latency_ms,
    plan,
    stage_figures,
    summarise,
)
from bench.helpers.figures import figure, percentile
from bench.ingest.procs import Collector, Cores, Load, core_busy_s, log, pinned, wait_connected
from bench.ingest.prom import Prometheus
from bench.ingest.wire import node_name

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from bench.helpers.pipe import FleetProcess
    from cli.dev.webhook_receiver import WebhookReceiver

    # Kill a running fleet's collector, start it again, and time the fleet coming back.
    Storm = Callable[[Collector, list[FleetProcess]], dict[str, Any]]

LAG_LIMIT_MS = 1000.0
GROWTH_LIMIT_MS = 250.0
UNACKED_LIMIT_S = 2.0
LATE_LIMIT_MS = 250.0  # the load's own p99 lateness above which a size is not judged
CLEAR_FAIL_LAG_MS = 5 * LAG_LIMIT_MS  # past this (or not connecting), larger sizes are not run
GPUS_PER_NODE = 8
FAULT_SPACING_S = (0.1, 0.2)


def hist_percentile(hist: Counter[int], share: float) -> float | None:
    """Nearest-rank percentile of a histogram of whole milliseconds."""
    total = sum(hist.values())
    if total == 0:
        return None
    rank = max(1, math.ceil(total * share))
    seen = 0
    for ms in sorted(hist):
        seen += hist[ms]
        if seen >= rank:
            return float(ms)
    return float(max(hist))


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def judge(row: dict[str, Any]) -> list[str]:
    """Why a size was not kept up with (empty: it was)."""
    why = []
    p99 = row["lag_p99_ms"]
    if p99 is None:
        why.append("no probe event acked in the window")
    elif p99 >= LAG_LIMIT_MS:
        why.append(f"lag p99 {p99:.0f} ms >= {LAG_LIMIT_MS:.0f} ms")
    growth = row["lag_growth_ms"]
    if growth is not None and growth > GROWTH_LIMIT_MS:
        why.append(f"lag grew {growth:.0f} ms over the window")
    if row["reports_skipped"]:
        why.append(f"{row['reports_skipped']} report slots skipped (streams an interval behind)")
    if row["events_unacked_old"]:
        why.append(f"{row['events_unacked_old']} events unacked for over {UNACKED_LIMIT_S:g} s")
    late = row["load_late_p99_ms"]
    if late is not None and late > LATE_LIMIT_MS:
        why.append(f"the load itself ran late (p99 {late:.0f} ms): not judged")
    if row.get("scraped_by_prometheus"):
        up, total = row.get("prometheus_targets_up"), row.get("prometheus_targets")
        if not total or up != total:
            why.append(f"Prometheus: {up} of {total} targets up")
    return why


def window_figures(windows: list[dict[str, Any]], seconds: float, nodes: int) -> dict[str, Any]:
    """Merge the load processes' window figures into one row."""
    late: Counter[int] = Counter()
    behind: Counter[int] = Counter()
    lags: list[tuple[float, float]] = []
    for w in windows:
        late.update({int(k): v for k, v in w["late_ms_hist"].items()})
        behind.update({int(k): v for k, v in w["behind_ms_hist"].items()})
        lags.extend((float(t), float(ms)) for t, ms in w["event_lags"])
    lags.sort()
    values = [ms for _, ms in lags]
    third = seconds / 3
    early = [ms for t, ms in lags if t < third]
    late_third = [ms for t, ms in lags if t >= 2 * third]
    growth = (
        statistics.median(late_third) - statistics.median(early) if early and late_third else None
    )
    reports = sum(w["reports"] for w in windows)
    load_cpu = sum(w["cpu_s"] for w in windows)
    unacked_old = sum(
        w["events_unacked"] for w in windows if w["events_unacked_oldest_s"] > UNACKED_LIMIT_S
    )
    return {
        "reports_per_s": round(reports / seconds, 1),
        "reports_per_s_offered": nodes,
        "report_bytes_per_s": round(sum(w["bytes"] for w in windows) / seconds),
        "reports_skipped": sum(w["skipped"] for w in windows),
        "events_in_window": sum(w["events"] for w in windows),
        "events_acked": len(values),
        "events_unacked_at_end": sum(w["events_unacked"] for w in windows),
        "events_unacked_old": unacked_old,
        "lag_p50_ms": rounded(percentile(values, 0.5)),
        "lag_p99_ms": rounded(percentile(values, 0.99)),
        "lag_max_ms": rounded(max(values, default=None)),
        "lag_growth_ms": rounded(growth),
        "load_late_p50_ms": hist_percentile(late, 0.5),
        "load_late_p99_ms": hist_percentile(late, 0.99),
        "load_behind_p99_ms": hist_percentile(behind, 0.99),
        "load_write_max_ms": max((w["write_max_ms"] for w in windows), default=None),
        "load_cpu_cores": round(load_cpu / seconds, 3),
        "load_processes": len(windows),
    }


def scrape(collector: Collector) -> dict[str, Any]:
    """One /metrics scrape: how long, how big, how many series, the collector's CPU for it."""
    proc = psutil.Process(collector.proc.pid)
    t0 = proc.cpu_times()
    began = time.monotonic()
    body = http_get(collector.base + "/metrics", timeout_s=300)
    wall = time.monotonic() - began
    t1 = proc.cpu_times()
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {
        "scrape_s": round(wall, 2),
        "scrape_collector_cpu_s": round(t1.user + t1.system - t0.user - t0.system, 2),
        "scrape_bytes": len(body),
        "scrape_series": series,
    }


def profile_start(
    collector: Collector, seconds: float, out: Path, core: int
) -> subprocess.Popen[bytes] | None:
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        log("  py-spy is not in the venv: no profile")
        return None
    return subprocess.Popen(  # noqa: S603 - the venv's own tool
        [
            str(spy),
            "record",
            "--pid",
            str(collector.proc.pid),
            "--duration",
            str(max(1, int(seconds))),
            "--rate",
            "100",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=pinned({core}),  # noqa: PLW1509 - no locks are taken before exec
    )


def profile_summary(path: Path, top: int = 25) -> dict[str, Any]:
    """Top functions by own and by total samples from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        samples += count
        frames = [frame_name(f) for f in stack.split(";")]
        own[frames[-1]] += count
        for name in set(frames):
            total[name] += count

    def share(c: Counter[str]) -> list[list[Any]]:
        return [[name, round(n / samples, 4)] for name, n in c.most_common(top)] if samples else []

    return {"samples": samples, "own": share(own), "total": share(total)}


def frame_name(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py)``: one entry per function."""
    name, _, where = frame.partition(" (")
    file = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(file).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else file  # noqa: PLR2004
    return f"{name} ({short})"


@dataclass
class Context:
    """What every size shares."""

    args: argparse.Namespace
    cores: Cores
    receiver: WebhookReceiver
    recording: Path
    workdir: Path
    collector_command: list[str]


def start_prometheus(
    ctx: Context, collector: Collector, workdir: Path, row: dict[str, Any]
) -> Prometheus:
    """Debian's Prometheus on the load's CPU, scraping every target of the collector.

    Return once it scraped each (the time that took is in ``row``).
    """
    interval = ctx.args.scrape_interval
    prometheus = Prometheus.start(workdir / "prometheus", collector.base, ctx.cores.load, interval)
    targets = http_get(collector.base + "/api/v1/scrape_targets", timeout_s=60)
    shards = len(json.loads(targets)) - 1
    row["prometheus_scrape_interval_s"] = interval
    # Its first round creates every series (2.2 million in 821 targets at 4,096 nodes) on the
    # load's CPU: that took Debian's Prometheus about 130 s at 4,096 nodes, later rounds less.
    wait_s = 4 * interval + 60 + shards / 4
    row["prometheus_first_round_s"] = round(prometheus.wait_scraped(shards, wait_s), 1)
    return prometheus


def run_size(  # noqa: C901, PLR0912, PLR0913, PLR0915 - one size, start to end
    ctx: Context,
    nodes: int,
    *,
    faults: bool = False,
    scraped: bool = False,
    then_scraped: bool = False,
    storm: Storm | None = None,
) -> dict[str, Any]:
    """Run and judge one size; ``scraped``: Prometheus scrapes every series meanwhile.

    ``storm``: at the end, the collector is killed and started again under this fleet, now
    reconnecting as agents do (``bench/ingest/reconnect.py``): ``row["reconnect"]``.
    ``then_scraped``: after this size's window, Prometheus starts on the same fleet and a second
    window is measured and judged with it scraping (then the faults, if ``faults``): that row is
    ``row["scraped"]``. One connect of a large fleet serves both (it took about 3 minutes of
    the benchmark's 10 at 4,096 nodes).
    """
    args = ctx.args
    row: dict[str, Any] = {"nodes": nodes, "gpus": nodes * GPUS_PER_NODE}
    if scraped:
        row["scraped_by_prometheus"] = True
    suffix = "-faults" if faults and not then_scraped else "-scraped" if scraped else ""
    workdir = ctx.workdir / f"nodes-{nodes}{suffix}"
    collector = Collector.start(
        workdir, ctx.receiver.url, nodes, ctx.cores.collector, ctx.collector_command
    )
    load: Load | None = None
    prometheus: Prometheus | None = None
    try:
        time.sleep(2.0)
        rss_idle = collector.rss_mb()
        row["collector_rss_idle_mb"] = round(rss_idle, 1)
        began = time.monotonic()
        load = Load.start(args, nodes, collector, ctx.recording, ctx.cores.load)
        children = {"collector": psutil.Process(collector.proc.pid)}
        children |= {f"load{i}": psutil.Process(p.proc.pid) for i, p in enumerate(load.procs)}
        connect = cpu_phase(children)
        row["connect_s"] = round(wait_connected(load, collector, nodes, args.connect_timeout), 1)
        row["connect_collector_cpu_cores"] = cpu_since(connect, children, "c")[
            "cpu_cores_collector_c"
        ]
        log(f"  {nodes} nodes in after {row['connect_s']} s; warming up {args.warmup:g} s")
        if scraped:
            prometheus = start_prometheus(ctx, collector, workdir, row)
            children["prometheus"] = psutil.Process(prometheus.proc.pid)
            log(f"  Prometheus scraped every target once after {row['prometheus_first_round_s']} s")
        profiling = args.profile and nodes == args.profile_nodes and not faults
        measure_window(ctx, collector, load, children, row, profiling=profiling)
        if prometheus is not None:
            row.update(prometheus.figures())
        if not faults and not scraped and nodes <= args.scrape_max_nodes:
            row.update(scrape(collector))
        if faults and not then_scraped:
            row.update(run_faults(ctx, load, collector, nodes))
        judge_row(row)
        if then_scraped and not row["clear_fail"]:
            row["scraped"] = scraped_window(ctx, collector, load, children, row, faults=faults)
        if storm is not None and not row["clear_fail"]:
            for proc in load.procs:
                proc.send(op="reconnect")
            for proc in load.procs:
                proc.wait_for("reconnect", 60)
            log(f"reconnect storm: {nodes} nodes, the collector killed and started again ...")
            row["reconnect"] = storm(collector, load.procs)
    except (RuntimeError, TimeoutError) as exc:
        row["kept_up"] = False
        row["why_not"] = f"{type(exc).__name__}: {exc}"
        row["clear_fail"] = True
    finally:
        if prometheus is not None:
            prometheus.stop()
        if load is not None:
            load.stop()
        collector.stop()
        row["run_s"] = round(time.monotonic() - began, 1) if "connect_s" in row else None
    return row


def judge_row(row: dict[str, Any]) -> None:
    """Set ``kept_up``, ``why_not`` and ``clear_fail`` from a measured row."""
    why = judge(row)
    row["kept_up"] = not why
    if why:
        row["why_not"] = "; ".join(why)
    p99 = row.get("lag_p99_ms")
    row["clear_fail"] = p99 is None or p99 >= CLEAR_FAIL_LAG_MS


def scraped_window(  # noqa: PLR0913 - the size's running parts
    ctx: Context,
    collector: Collector,
    load: Load,
    children: dict[str, psutil.Process],
    plain: dict[str, Any],
    *,
    faults: bool,
) -> dict[str, Any]:
    """After ``plain``'s window: Prometheus on, another window (then the faults); its row."""
    nodes = plain["nodes"]
    log(f"  {nodes} nodes: now with Prometheus scraping every {ctx.args.scrape_interval:g} s")
    row: dict[str, Any] = {
        "nodes": nodes,
        "gpus": plain["gpus"],
        "scraped_by_prometheus": True,
        "same_fleet_as_unscraped_run": True,
        "connect_s": plain["connect_s"],
        "collector_rss_idle_mb": plain["collector_rss_idle_mb"],
    }
    prometheus = start_prometheus(ctx, collector, collector.workdir, row)
    try:
        log(f"  Prometheus scraped every target once after {row['prometheus_first_round_s']} s")
        with_prometheus = {**children, "prometheus": psutil.Process(prometheus.proc.pid)}
        measure_window(ctx, collector, load, with_prometheus, row, profiling=False)
        row.update(prometheus.figures())
        if faults:
            row.update(run_faults(ctx, load, collector, nodes))
    finally:
        prometheus.stop()
    judge_row(row)
    return row


def measure_window(  # noqa: PLR0913 - the size's running parts
    ctx: Context,
    collector: Collector,
    load: Load,
    children: dict[str, psutil.Process],
    row: dict[str, Any],
    *,
    profiling: bool,
) -> None:
    """Warm up, then measure one window into ``row`` (py-spy on the collector if ``profiling``).

    ``row`` has the size's ``nodes`` and ``collector_rss_idle_mb``.
    """
    args = ctx.args
    nodes = row["nodes"]
    rss_idle = row["collector_rss_idle_mb"]
    workdir = collector.workdir
    time.sleep(args.warmup)
    spy: subprocess.Popen[bytes] | None = None
    if profiling:
        spy = profile_start(collector, args.window, workdir / "profile.txt", ctx.cores.load)
    try:
        phase = cpu_phase(children)
        core0 = core_busy_s(ctx.cores.collector)
        load.tell_all("record")
        time.sleep(args.window)
        windows = load.ask_all("window")
        core_busy = core_busy_s(ctx.cores.collector) - core0
        cpu = cpu_since(phase, children, "w")
        seconds = statistics.median(w["seconds"] for w in windows)
        row["window_s"] = round(seconds, 1)
        row["collector_cpu_cores"] = cpu["cpu_cores_collector_w"]
        wall = time.monotonic() - phase.mono
        row["collector_core_other_cores"] = round(
            max(0.0, core_busy / wall - (row["collector_cpu_cores"] or 0.0)), 3
        )
        row["machine_cpu_busy_share"] = cpu["machine_cpu_busy_share_w"]
        rss = collector.rss_mb()
        row["collector_rss_mb"] = round(rss, 1)
        row["rss_mb_per_1000_nodes"] = round((rss - rss_idle) / nodes * 1000, 1)
        row.update(window_figures(windows, seconds, nodes))
        row["load_cpu_cores_measured_by_psutil"] = round(
            sum(v for k, v in cpu.items() if k.startswith("cpu_cores_load") and v is not None), 3
        )
        if "prometheus" in children:
            row["prometheus_cpu_cores"] = cpu.get("cpu_cores_prometheus_w")
        if spy is not None:
            spy.wait(timeout=args.window + 60)
            row["profile"] = profile_summary(workdir / "profile.txt")
            row["profile_file"] = str(workdir / "profile.txt")
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()


# ---- faults at 2,048 nodes ------------------------------------------------------------------


def run_faults(ctx: Context, load: Load, collector: Collector, nodes: int) -> dict[str, Any]:
    args = ctx.args
    names = [node_name(i) for i in range(1, nodes + 1)]
    faults = plan(names, args.faults, 1, args.seed)
    rng_spacing = (0.1, 0.2)
    before = len(ctx.receiver.deliveries())
    log(f"  faults: {len(faults)}, one every 100-200 ms, on {nodes} loaded nodes")

    rng = random.Random(args.seed + 1)
    next_at = time.monotonic()
    started = time.time()
    for f in faults:
        time.sleep(max(0.0, next_at - time.monotonic()))
        load.owner[f.node].send(op="fault", id=f.id, node=f.node, kind=f.kind)
        next_at += rng.uniform(*rng_spacing)
    deadline = time.monotonic() + args.fault_timeout
    while True:
        # only this run's webhooks: an earlier run's fault on a node of the same name came first
        # and, being older than this fault, counted this one as never answered
        first = first_arrivals(ctx.receiver, before)
        injected = {k: v for p in load.procs for k, v in p.injected.items()}
        for f in faults:
            f.arrival = first.get(f.node)
            msg = injected.get(f.id)
            f.injected_at = None if msg is None or msg.get("t") is None else float(msg["t"])
            if msg is not None and msg.get("gpu") is not None:
                f.gpu = int(msg["gpu"])
        if all(f.arrival is not None and f.injected_at is not None for f in faults):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for f in faults:
        if f.arrival and f.injected_at and f.arrival.received_at < f.injected_at:
            f.arrival = None
    out = summarise(faults, args.fault_timeout)
    events = [e for e in journal_events(collector.base) if e.get("kind") != "pcie_aer"]
    incidents = api(collector.base, "/api/v1/incidents?limit=1000")["incidents"]
    add_stages(faults, events, incidents)
    deliveries = ctx.receiver.deliveries()[before:]
    faulted = {f.node for f in faults}
    return {
        "fault_count": out["faults"],
        "fault_p50_ms": out["p50_ms"],
        "fault_p99_ms": out["p99_ms"],
        "fault_max_ms": out["max_ms"],
        "faults_without_webhook": out["faults_without_webhook"],
        **({"fault_why": out["why"]} if "why" in out else {}),
        "fault_by_kind_p50_ms": by_kind(faults),
        "fault_stages_p50_ms": stage_figures(faults, 0.5),
        "fault_stages_p99_ms": stage_figures(faults, 0.99),
        "faults_slowest": slowest(faults, started),
        "webhooks_for_nodes_without_fault": sum(
            1 for d in deliveries if str(d.body.get("payload", {}).get("node", "")) not in faulted
        ),
    }


def slowest(faults: list[PlannedFault], started: float, count: int = 5) -> list[dict[str, Any]]:
    """The ``count`` slowest faults: kind, when (s into the fault run), latency and stages."""
    answered = sorted(
        (f for f in faults if not math.isinf(latency_ms(f))), key=latency_ms, reverse=True
    )
    return [
        {
            "kind": f.kind,
            "at_s": None if f.injected_at is None else round(f.injected_at - started, 2),
            "latency_ms": round(latency_ms(f), 1),
            "stages_ms": f.stages,
        }
        for f in answered[:count]
    ]


def by_kind(faults: list[PlannedFault]) -> dict[str, float | None]:

    return {kind: figure([latency_ms(f) for f in faults if f.kind == kind], 0.5) for kind in FAULTS}
