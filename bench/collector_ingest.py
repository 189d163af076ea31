"""Collector capacity: the largest fleet one collector process keeps up with at one report a second.

Run from the repository root: ``.venv/bin/python bench/collector_ingest.py [--quick] ...``.
The last line of output is one JSON object (see the project's benchmark contract). It needs two
CPUs: the collector is pinned to one, everything else (the load, this process, the webhook
receiver, py-spy) to the other.

What runs, all on loopback:

* ``bench/ingest/record.py`` once, first: real agents on simulated nodes, recorded against a
  stand-in collector (a busy node's Hello, first Report and one counter interval of steady
  Reports at a 1 s poll, its corrected-AER event, and what agents sent after each fault of
  ``bench/fault_to_action.py``);
* for each fleet size, a fresh real collector process (``fleetwatch collector --config``: a
  SQLite journal, the built-in rules, every setting its default but the actions, which are
  ``bench/fault_to_action.py``'s signed webhooks, ``bench/helpers/collector_config.py``), pinned
  to one CPU;
* ``bench/ingest/load.py`` processes on the other CPU (one per ``--nodes-per-process`` nodes):
  each node its own gRPC channel and stream, replaying the recording as raw bytes prepared
  once (``bench/ingest/wire.py``): Hello, first Report, then one Report a second (``--interval``)
  at a random phase; ``--events-per-s`` times a second (5), a random node sends the AER event.

Ingest lag: an event's ack comes once the event is journaled (committed), and a stream is
handled in order, so the time from a node's write of an event to the ack that covers it bounds
how long everything that node sent before it took to reach the collector's model. The lag of a
size is that time for every probe event written in the measurement window (``--window``
seconds, after ``--warmup`` seconds once every node is connected and its first Report is in).
The collector keeps up with a size when, in the window: the lag's p99 is under 1 s; it is not
growing (the median of the window's last third is within ``GROWTH_LIMIT_MS`` of its first
third's); no stream fell a whole interval behind (gRPC flow control holding the load back); no
event was left without its ack for more than 2 s; every node connected. The load's own
lateness (how late its tasks woke for their slots, a busy load process) and CPU are reported
apart: a size where the load could not keep its schedule is not counted as kept up.

Sizes: 256, 2,048 and 4,096 nodes (``--sizes``; ``--sizes 256 1024 4096 8192`` searches further,
about 4 minutes more: 8,192 nodes do not all get in), then ``--bisect`` more between the largest
kept up and the smallest not; a size above one that failed clearly (not all connected, or lag p99
over 5 s) is not run unless ``--all-sizes``. ``max_nodes_at_1hz`` is the largest size kept up (at
``--interval``, 1 s unless told); ``cpu_cores_at_max`` the collector's CPU seconds per second in
that size's window; ``rss_mb_per_1000_nodes`` its RSS at the end of the window less its RSS idle
(started, no node), per 1,000 nodes. Then ``fault_to_action_p99_ms_at_2048``: the 2,048-node size
after its window (a run of its own when 2,048 is not among ``--sizes``, or at the largest size kept
up with, if smaller: the JSON then has ``fault_to_action_p99_ms`` and ``fault_nodes``, and the 2,048
figure is null with a ``why``), ``--faults`` faults (``bench/fault_to_action.py``'s kinds), each
on its own node, one every 100 to 200 ms: the recorded messages of that fault sent on the node's
stream; latency is the arrival of the first webhook naming the node minus the write of the fault's
first message (so, unlike ``fault_to_action.py``, without the agent's own detection). A fault
run's row has the p50 of each kind, the p50 and p99 of each stage, and ``faults_slowest``: the
five slowest faults with their kind, time into the run and stages, to tell a tail's cause.

``--floor`` runs every size again against ``bench/ingest/floor.py``, a server that only reads,
parses and acks (grpcio and protobuf, nothing of the collector), and reports its CPU beside the
collector's (``floor``, ``cpu_vs_floor``): the peer the collector's cost is compared with.

With Prometheus: ``--scrape-sizes`` (4,096 nodes; 1,024 with ``--quick``) measured again on the
same fleet after their plain window (a size not among ``--sizes`` is run on its own), judged the
same way, while Debian's real Prometheus (``bench/ingest/prom.py``, on the load's CPU) scrapes
every series through the collector's shard targets (found by HTTP service discovery) every
``--scrape-interval`` seconds (15) through warm-up and window: ``max_nodes_at_1hz_with_scrape`` is
the largest of them kept up with (a lower bound: only these sizes run, to stay near the 10-minute
budget; ``--scrape-sizes 4096 5120 6144 8192`` searches further). ``scrape_cpu_s_per_1000_nodes``
and ``scrape_cpu_ratio_vs_prometheus_client`` come from ``bench/ingest/scrape.py``, in this
process: a fleet model of ``--scrape-cpu-nodes`` nodes (1,024) filled from the recording, one full
pass over every shard (OpenMetrics, gzip) right after every node sent a Report, against
prometheus_client's ``generate_latest`` rendering the same series, medians of
``--scrape-cpu-rounds`` (3).

The reconnect storm (``bench/ingest/reconnect.py``, ``--reconnect-nodes``, 4,096; 0: none):
the collector killed and started again under a fleet that reconnects with the agent's backoff
(at the end of that size's run, its load switched to reconnecting; a run of its own when the size
is not among ``--sizes``);
``reconnect_s_at_4096`` from its first accepted connection to every node's first Report in the
model (null with ``why_reconnect`` when that size was not run or not every node came back).
``fault_to_action_p99_ms_at_4096``: the same faults as the fault run, sent after the window of
the 4,096-node size with Prometheus scraping (a ``why`` says when that size was not kept up with).

``--profile`` runs py-spy on the collector during the window of ``--profile-nodes`` nodes and
prints the top functions. ``--quick``: 256 and 1,024 nodes, short windows, no fault run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from cli.dev.webhook_receiver import WebhookReceiver
from fleetwatch.clock import SystemClock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for bench.*
from bench.helpers.collector_config import SECRET
from bench.ingest.procs import Cores, log, record
from bench.ingest.reconnect import RECONNECT_TARGET, reconnect_figures, storm, storm_figures
from bench.ingest.scrape import measure as measure_scrape
from bench.ingest.scrape import measure_http
from bench.ingest.size import (
    GPUS_PER_NODE,
    GROWTH_LIMIT_MS,
    LAG_LIMIT_MS,
    LATE_LIMIT_MS,
    UNACKED_LIMIT_S,
    Context,
    run_size,
)
from bench.ingest.wire import Recording

SIZES = (256, 2048, 4096)
QUICK_SIZES = (256, 1024)
SCRAPE_SIZES = (4096,)
QUICK_SCRAPE_SIZES = (1024,)
FAULT_NODES = 2048
BISECT_STEP = 128
TARGET_NODES = 4096
SCRAPED_FAULT_NODES = 4096  # the faults also run at this scraped size
TARGET_P99_MS = 250.0


def bisect_sizes(rows: list[dict[str, Any]], steps: int, ctx: Context) -> None:
    for _ in range(steps):
        good = [r["nodes"] for r in rows if r["kept_up"]]
        bad = [r["nodes"] for r in rows if not r["kept_up"]]
        if not good or not bad:
            return
        low = max(good)
        high = min(n for n in bad if n > low) if any(n > low for n in bad) else None
        if high is None or high - low <= BISECT_STEP:
            return
        mid = (low + high) // 2 // BISECT_STEP * BISECT_STEP
        if mid in (low, high):
            return
        log(f"size {mid} (between {low} kept up and {high} not) ...")
        row = run_size(ctx, mid)
        show_row(row)
        rows.append(row)


def show_row(row: dict[str, Any]) -> None:
    verdict = "kept up" if row["kept_up"] else f"NOT kept up: {row.get('why_not')}"
    log(
        f"  {row['nodes']} nodes: {verdict}; lag p50/p99/max "
        f"{row.get('lag_p50_ms')}/{row.get('lag_p99_ms')}/{row.get('lag_max_ms')} ms, "
        f"collector {row.get('collector_cpu_cores')} cores, "
        f"RSS {row.get('collector_rss_mb')} MB, load {row.get('load_cpu_cores')} cores "
        f"(late p99 {row.get('load_late_p99_ms')} ms)"
    )


def table(rows: list[dict[str, Any]]) -> None:
    cols = (
        ("nodes", "nodes"),
        ("kept", "kept_up"),
        ("rep/s", "reports_per_s"),
        ("lag p50", "lag_p50_ms"),
        ("lag p99", "lag_p99_ms"),
        ("lag max", "lag_max_ms"),
        ("growth", "lag_growth_ms"),
        ("skipped", "reports_skipped"),
        ("coll cores", "collector_cpu_cores"),
        ("RSS MB", "collector_rss_mb"),
        ("MB/1k", "rss_mb_per_1000_nodes"),
        ("connect s", "connect_s"),
        ("load cores", "load_cpu_cores"),
        ("late p99", "load_late_p99_ms"),
        ("busy", "machine_cpu_busy_share"),
    )
    log(" | ".join(f"{name:>10}" for name, _ in cols))
    for row in sorted(rows, key=lambda r: r["nodes"]):
        log(" | ".join(f"{fmt(row.get(key)):>10}" for _, key in cols))


def fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def result_of(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    fault_row: dict[str, Any] | None,
    cores: Cores,
) -> dict[str, Any]:
    kept = [r for r in rows if r["kept_up"]]
    best = max(kept, key=lambda r: r["nodes"]) if kept else None
    out: dict[str, Any] = {
        "max_nodes_at_1hz": best["nodes"] if best else None,
        "cpu_cores_at_max": best["collector_cpu_cores"] if best else None,
        "rss_mb_per_1000_nodes": best["rss_mb_per_1000_nodes"] if best else None,
        "fault_to_action_p99_ms_at_2048": None,
    }
    whys = []
    if best is None:
        whys.append("no size was kept up with")
    if fault_row is None:
        whys.append(
            "no fault run (--faults 0, or no size kept up with)"
            if args.faults <= 0 or best is None
            else "no fault run"
        )
    elif fault_row["nodes"] != args.fault_nodes:
        whys.append(
            f"the collector did not keep up with {args.fault_nodes} nodes: faults ran at "
            f"{fault_row['nodes']} (fault_to_action_p99_ms)"
        )
    elif fault_row.get("fault_p99_ms") is None:
        whys.append(f"fault run: {fault_row.get('fault_why') or fault_row.get('why_not')}")
    else:
        out["fault_to_action_p99_ms_at_2048"] = fault_row["fault_p99_ms"]
    if whys:
        out["why"] = "; ".join(whys)
    out |= {
        "max_gpus_at_1hz": best["nodes"] * GPUS_PER_NODE if best else None,
        "target_nodes": TARGET_NODES,
        "meets_target_nodes": bool(best and best["nodes"] >= TARGET_NODES),
        "target_fault_p99_ms": TARGET_P99_MS,
        "report_interval_s": 1.0,
        "lag_definition": (
            "probe event written by the load -> the collector's ack (after the journal commit);"
            " a stream is handled in order, so it bounds the lag of every report before it"
        ),
        "kept_up_definition": (
            f"in a {args.window:g} s window after {args.warmup:g} s of warm-up: lag p99 < "
            f"{LAG_LIMIT_MS:g} ms, lag median growth first to last third <= {GROWTH_LIMIT_MS:g} ms,"
            f" no report slot skipped, no event unacked > {UNACKED_LIMIT_S:g} s, the load's own"
            f" lateness p99 <= {LATE_LIMIT_MS:g} ms"
        ),
        "pinning": (
            f"collector on CPU {cores.collector}; load processes, this process, the webhook "
            f"receiver and py-spy on CPU {cores.load}"
        ),
        "sizes": sorted(rows, key=lambda r: r["nodes"]),
        "fault_run": fault_row,
        "fault_nodes": None if fault_row is None else fault_row["nodes"],
        "fault_to_action_p99_ms": None if fault_row is None else fault_row.get("fault_p99_ms"),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "machine": f"{os.cpu_count()} cpus, python {sys.version.split()[0]}",
    }
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="256 and 1,024 nodes, short windows, no faults")
    add("--sizes", type=int, nargs="+", help="fleet sizes to run (default 256 1024 4096 8192)")
    add("--all-sizes", action="store_true", help="run larger sizes after one failed clearly")
    add("--bisect", type=int, default=1, help="extra sizes between kept up and not")
    add("--interval", type=float, default=1.0, help="s between a node's reports")
    add("--warmup", type=float, default=10.0, help="s between connected and the window")
    add("--window", type=float, default=30.0, help="s measured")
    add("--events-per-s", type=float, default=5.0, help="probe events a second, whole fleet")
    add("--nodes-per-process", type=int, default=2048, help="nodes per load process")
    add("--connecting", type=int, default=32, help="nodes connecting at once")
    add("--connect-timeout", type=float, default=240.0, help="s for every node to get in")
    add("--faults", type=int, default=120, help="faults in the fault run (0: no fault run)")
    add("--fault-nodes", type=int, default=FAULT_NODES, help="nodes of load in the fault run")
    add("--fault-timeout", type=float, default=30.0, help="s to wait for a fault's webhook")
    add("--scrape-max-nodes", type=int, default=1024, help="time a /metrics scrape up to")
    add(
        "--scrape-sizes",
        type=int,
        nargs="*",
        help="sizes run again with Prometheus scraping (default 4096; none: no such run)",
    )
    add("--scrape-interval", type=float, default=15.0, help="Prometheus' scrape interval, s")
    add("--scrape-cpu-nodes", type=int, default=1024, help="nodes of the exposition CPU pass")
    add("--scrape-cpu-rounds", type=int, default=3, help="rounds of the exposition CPU pass")
    add(
        "--floor",
        action="store_true",
        help="run each size again against bench/ingest/floor.py (gRPC and parsing only)",
    )
    add("--profile", action="store_true", help="py-spy the collector in one size's window")
    add("--profile-nodes", type=int, default=1024, help="the size --profile profiles")
    add(
        "--reconnect-nodes",
        type=int,
        help="nodes of the reconnect storm (bench/ingest/reconnect.py; default 4096, "
        "1024 with --quick; 0: none)",
    )
    add("--recording", type=Path, help="reuse a recording (bench/ingest/record.py --out)")
    add("--workdir", type=Path, help="keep journals, logs, profiles and the recording here")
    add("--seed", type=int, default=1)
    add(
        "--collector-command",
        nargs="+",
        help="run this instead of the venv's fleetwatch, e.g. another checkout's, to compare "
        "(it gets 'collector --config FILE')",
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes = args.sizes or list(QUICK_SIZES)
        args.warmup, args.window = min(args.warmup, 5.0), min(args.window, 10.0)
        args.bisect, args.faults = 0, 0
        if args.scrape_sizes is None:
            args.scrape_sizes = list(QUICK_SCRAPE_SIZES)
        args.scrape_cpu_nodes, args.scrape_cpu_rounds = min(args.scrape_cpu_nodes, 256), 3
    args.sizes = args.sizes or list(SIZES)
    if args.reconnect_nodes is None:
        args.reconnect_nodes = 1024 if args.quick else RECONNECT_TARGET
    if args.scrape_sizes is None:
        args.scrape_sizes = list(SCRAPE_SIZES)
    return args


def run_sizes(ctx: Context) -> tuple[list[dict[str, Any]], list[int]]:
    """Every size asked for (but those above one that failed clearly), then the bisection."""
    rows: list[dict[str, Any]] = []
    not_run: list[int] = []
    for nodes in ctx.args.sizes:
        failed = [r["nodes"] for r in rows if r.get("clear_fail")]
        if failed and nodes > min(failed) and not ctx.args.all_sizes:
            log(f"size {nodes}: not run ({min(failed)} nodes already failed clearly)")
            not_run.append(nodes)
            continue
        log(f"size {nodes} ...")
        # A size Prometheus is to scrape gets its scraped window on the same fleet, after the
        # plain one (and at 4,096 nodes the faults after that, the scrape still on).
        then_scraped = nodes in ctx.args.scrape_sizes
        # The fault run's size takes its faults after its window (at 4,096 nodes, scraped).
        fault_size = SCRAPED_FAULT_NODES if then_scraped else ctx.args.fault_nodes
        faults = nodes == fault_size and ctx.args.faults > 0
        # The reconnect storm's size ends with its collector killed and started again.
        restart = None
        if nodes == ctx.args.reconnect_nodes:
            restart = partial(storm, nodes=nodes, cores=ctx.cores, command=ctx.collector_command)
        row = run_size(ctx, nodes, then_scraped=then_scraped, faults=faults, storm=restart)
        show_row(row)
        rows.append(row)
    bisect_sizes(rows, ctx.args.bisect, ctx)
    return rows, not_run


def failed_clearly_below(rows: list[dict[str, Any]], nodes: int, args: argparse.Namespace) -> int:
    """The smallest size at or below ``nodes`` that failed clearly (0: none, or --all-sizes).

    A storm or a scraped run at a size the collector could not even take in without them would
    only time out (the load's 240 s), so it is not run: the budget goes to what can be measured.
    """
    if args.all_sizes:
        return 0
    failed = [r["nodes"] for r in rows if r.get("clear_fail") and r["nodes"] <= nodes]
    return min(failed, default=0)


def run_scraped_sizes(ctx: Context, plain: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``--scrape-sizes`` again, Prometheus scraping every series meanwhile."""
    rows: list[dict[str, Any]] = []
    for nodes in ctx.args.scrape_sizes:
        same = next((r for r in plain if r["nodes"] == nodes), None)
        if same is not None and "scraped" in same:  # measured on the plain run's fleet
            row = same.pop("scraped")
            show_scraped(row)
            rows.append(row)
            continue
        failed = failed_clearly_below(plain, nodes, ctx.args)
        if failed:
            why = f"not run: {failed} nodes failed clearly without Prometheus"
            log(f"size {nodes} with Prometheus: {why}")
            rows.append({"nodes": nodes, "kept_up": False, "not_run": True, "why_not": why})
            continue
        log(f"size {nodes} with Prometheus scraping every {ctx.args.scrape_interval:g} s ...")
        # At 4,096 nodes the faults run after the window, the scrape still on.
        faults = nodes == SCRAPED_FAULT_NODES and ctx.args.faults > 0
        row = run_size(ctx, nodes, scraped=True, faults=faults)
        show_scraped(row)
        rows.append(row)
    return rows


def show_scraped(row: dict[str, Any]) -> None:
    """Log a size run with Prometheus scraping."""
    show_row(row)
    if "fault_p99_ms" in row:
        log(
            f"  faults while scraped: p50 {row.get('fault_p50_ms')} ms, p99 "
            f"{row.get('fault_p99_ms')} ms, {row.get('faults_without_webhook')} without a "
            "webhook"
        )
    log(
        f"  Prometheus: {row.get('prometheus_targets_up')} of "
        f"{row.get('prometheus_targets')} targets up, {row.get('prometheus_samples_per_round')}"
        f" samples a round, largest target {row.get('prometheus_largest_target_samples')},"
        f" slowest scrape {row.get('prometheus_scrape_duration_max_s')} s"
    )


def with_scrape(
    result: dict[str, Any],
    args: argparse.Namespace,
    scraped: list[dict[str, Any]],
    scrape_cpu: dict[str, Any],
) -> None:
    """The figures with Prometheus attached, and the exposition's CPU against prometheus_client."""
    kept = [r for r in scraped if r["kept_up"]]
    best = max(kept, key=lambda r: r["nodes"]) if kept else None
    result["max_nodes_at_1hz_with_scrape"] = best["nodes"] if best else None
    result["cpu_cores_at_max_with_scrape"] = best["collector_cpu_cores"] if best else None
    result["scrape_sizes"] = scraped
    result["scrape_interval_s"] = args.scrape_interval
    if best is None:
        why = (
            "no --scrape-sizes run"
            if not scraped
            else "no size of --scrape-sizes was kept up with while Prometheus scraped: "
            + "; ".join(f"{r['nodes']}: {r.get('why_not')}" for r in scraped)
        )
        result["why"] = "; ".join(filter(None, [result.get("why"), why]))
    result |= scrape_cpu


def with_reconnect(
    result: dict[str, Any], reconnect: dict[str, Any], scraped: list[dict[str, Any]]
) -> None:
    """The reconnect storm's keys, and the faults at 4,096 nodes with the scrape on."""
    result |= reconnect
    row = next((r for r in scraped if r["nodes"] == SCRAPED_FAULT_NODES), None)
    p99 = None if row is None else row.get("fault_p99_ms")
    result["fault_to_action_p99_ms_at_4096"] = p99
    if row is None:
        result["why_fault_to_action_at_4096"] = "4,096 was not among --scrape-sizes (or --faults 0)"
    elif p99 is None:
        result["why_fault_to_action_at_4096"] = f"no fault figure: {row.get('why_not')}"
    elif not row["kept_up"]:
        result["why_fault_to_action_at_4096"] = (
            f"measured, but the collector did not keep up with 4,096 nodes: {row.get('why_not')}"
        )


def run_fault_size(ctx: Context, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fault run at ``--fault-nodes``, or at the largest size kept up with if smaller."""
    kept = [r["nodes"] for r in rows if r["kept_up"]]
    if ctx.args.faults <= 0 or not kept:
        return None
    nodes = min(ctx.args.fault_nodes, max(kept))
    done = next((r for r in rows if r["nodes"] == nodes and "fault_p99_ms" in r), None)
    if done is not None:  # taken after that size's window
        return done
    log(f"fault to action at {nodes} nodes ...")
    row = run_size(ctx, nodes, faults=True)
    show_row(row)
    log(
        f"  faults: p50 {row.get('fault_p50_ms')} ms, p99 {row.get('fault_p99_ms')} ms, "
        f"max {row.get('fault_max_ms')} ms, {row.get('faults_without_webhook')} without a webhook"
    )
    return row


FLOOR_KEYS = (
    "nodes",
    "kept_up",
    "collector_cpu_cores",
    "collector_rss_mb",
    "lag_p99_ms",
    "connect_s",
    "machine_cpu_busy_share",
    "why_not",
)


def run_floor(ctx: Context, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same load against ``bench/ingest/floor.py`` at each size the collector ran."""
    floor_ctx = dataclasses.replace(
        ctx,
        collector_command=[
            sys.executable,
            str(Path(__file__).resolve().parent / "ingest" / "floor.py"),
        ],
        workdir=ctx.workdir / "floor",
    )
    out = []
    for nodes in sorted({r["nodes"] for r in rows} | set(ctx.args.sizes)):
        log(f"floor (a collector that only reads) at {nodes} nodes ...")
        row = run_size(floor_ctx, nodes)
        show_row(row)
        out.append({key: row.get(key) for key in FLOOR_KEYS})
    return out


def with_floor(
    result: dict[str, Any], rows: list[dict[str, Any]], floor: list[dict[str, Any]]
) -> None:
    """The floor's figures, and the collector's CPU as a multiple of the floor's, per size."""
    result["floor"] = floor
    by_nodes = {f["nodes"]: f for f in floor}
    ratios = {}
    for row in rows:
        base = by_nodes.get(row["nodes"], {}).get("collector_cpu_cores")
        if base and row.get("collector_cpu_cores"):
            ratios[str(row["nodes"])] = round(row["collector_cpu_cores"] / base, 2)
    result["cpu_vs_floor"] = ratios
    best = result["max_nodes_at_1hz"]
    result["floor_cpu_cores_at_max"] = by_nodes.get(best, {}).get("collector_cpu_cores")
    result["cpu_vs_floor_at_max"] = ratios.get(str(best))
    result["floor_cpu_cores_at_target"] = by_nodes.get(TARGET_NODES, {}).get("collector_cpu_cores")


def show_profiles(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        if "profile" not in row:
            continue
        prof = row["profile"]
        log(f"profile of the collector at {row['nodes']} nodes ({prof['samples']} samples):")
        for name, share in prof["total"][:20]:
            log(f"  total {share:6.1%}  {name}")
        for name, share in prof["own"][:20]:
            log(f"  own   {share:6.1%}  {name}")


def main() -> None:  # noqa: PLR0915 - the benchmark's steps, in order
    args = parse_args()

    def on_term(*_: object) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, on_term)
    began = time.monotonic()
    try:
        cores = Cores.pick()
    except RuntimeError as exc:
        keys = ("max_nodes_at_1hz", "cpu_cores_at_max", "rss_mb_per_1000_nodes")
        scrape_keys = (
            "max_nodes_at_1hz_with_scrape",
            "scrape_cpu_s_per_1000_nodes",
            "scrape_cpu_ratio_vs_prometheus_client",
        )
        later = ("reconnect_s_at_4096", "fault_to_action_p99_ms_at_4096")
        failed = dict.fromkeys((*keys, "fault_to_action_p99_ms_at_2048", *scrape_keys, *later))
        print(json.dumps(failed | {"why": str(exc)}, sort_keys=True), flush=True)
        raise SystemExit(1) from exc
    os.sched_setaffinity(0, {cores.load})  # before any thread starts: they inherit it
    tmp = tempfile.mkdtemp(prefix="fleetwatch-ingest-")
    workdir = args.workdir or Path(tmp)
    workdir.mkdir(parents=True, exist_ok=True)
    receiver = WebhookReceiver(clock=SystemClock(), secret=SECRET)
    receiver.start()
    try:
        recording = args.recording or record(workdir, cores.load)
        command = args.collector_command or [str(Path(sys.executable).parent / "fleetwatch")]
        ctx = Context(args, cores, receiver, recording, workdir, command)
        log(
            f"collector_ingest: sizes {args.sizes}, a report every {args.interval:g} s, "
            f"{args.warmup:g} s warm-up, {args.window:g} s window, {args.events_per_s:g} probe "
            f"events a second; collector on CPU {cores.collector}, load on CPU {cores.load}"
        )
        rows, not_run = run_sizes(ctx)
        fault_row = run_fault_size(ctx, rows)
        floor = run_floor(ctx, rows) if args.floor else None
        scraped = run_scraped_sizes(ctx, rows)
        storm_failed = failed_clearly_below(rows, args.reconnect_nodes, args)
        stormed = next((r for r in rows if "reconnect" in r), None)
        if stormed is not None:  # measured on that size's fleet
            reconnect = storm_figures(stormed["nodes"], stormed.pop("reconnect"))
        elif storm_failed and args.reconnect_nodes > 0:
            reconnect = {
                "reconnect_s_at_4096": None,
                "reconnect_nodes": args.reconnect_nodes,
                "why_reconnect": (
                    f"not run: {storm_failed} nodes failed clearly without a restart (a fleet "
                    "the collector cannot take in cannot be measured coming back)"
                ),
            }
            log(f"reconnect storm: {reconnect['why_reconnect']}")
        else:
            reconnect = reconnect_figures(args.reconnect_nodes, workdir, recording, cores, command)
        log(f"exposition CPU: {args.scrape_cpu_nodes} nodes, {args.scrape_cpu_rounds} rounds ...")
        scrape_cpu = measure_scrape(
            Recording.load(recording), args.scrape_cpu_nodes, args.scrape_cpu_rounds
        )
        log(
            f"  a full pass: {scrape_cpu['scrape_cpu_s_per_1000_nodes']} s per 1,000 nodes, "
            f"ratio {scrape_cpu['scrape_cpu_ratio_vs_prometheus_client']} against "
            "prometheus_client's generate_latest"
        )
        http_nodes = min(args.scrape_cpu_nodes, 512)
        log(f"a shard request over HTTP against the render alone: {http_nodes} nodes ...")
        scrape_cpu |= measure_http(Recording.load(recording), http_nodes, args.scrape_cpu_rounds)
        log(f"  HTTP costs {scrape_cpu['http_overhead_cpu_ms_per_request']} ms of CPU a request")
    finally:
        receiver.stop()
        if args.workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    show_profiles(rows)
    table(rows)
    result = result_of(args, rows, fault_row, cores)
    result["sizes_not_run"] = not_run
    if floor is not None:
        with_floor(result, rows, floor)
    with_scrape(result, args, scraped, scrape_cpu)
    with_reconnect(result, reconnect, scraped)
    result["wall_s"] = round(time.monotonic() - began, 1)
    print(json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
