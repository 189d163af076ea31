"""Flood: one node offering 100,000 events a second, and what the other nodes notice of it.

Run from the repository root: ``.venv/bin/python bench/flood.py [--seconds S] [--rate R] ...``.
The last line of output is one JSON object (see the project's benchmark contract).

What runs, all on loopback:

* a real collector process, ``fleetwatch collector --config FILE``, with a SQLite journal and
  every ingest limit at its default (``collector/ingest/throttle.py``: 1,000 events a second per
  node after a burst of 10,000; alike events past 200 a second coalesced);
* the flooder, this script again in a process of its own (``--role flooder``): one raw gRPC
  client that says Hello as node ``flooder`` and then offers events open-loop at ``--rate``
  a second, numbered without gaps: a share (``--alike-share``, default 0.99) one Xid on one GPU,
  the rest every other (GPU, Xid) pair in turn (``--alike-share 0``: nothing to coalesce).
  What it cannot write yet waits in its own backlog, as an agent's would wait in its spool;
* in this process, ``--nodes`` ordinary nodes (raw gRPC clients too, so their timing is not the
  simulator's): each sends one event every ``--interval`` seconds, never two alike, and times
  each from its write to the ack that covers it (the ack comes only after the commit).

First ``--baseline`` seconds without the flooder, then ``--seconds`` with it; then the flooder
stops and the ordinary nodes get ``--settle`` seconds for their last acks. Finally the journal is
read: the ordinary nodes' events must each be there once; the flooder's rows must cover its
event numbers from 1 without a gap or a repeat (a coalesced row covers the numbers its marker
names).

Figures: ``flood_events_per_s_offered`` (the open-loop rate), ``flood_events_per_s_written``
(what its gRPC writes took: flow control holds it back), ``flood_events_per_s_accepted``
(events journaled), ``flood_journal_rows_per_s``, ``flood_events_lost`` and
``flood_events_duplicated`` (journal against numbers), ``others_event_latency_p50_ms`` /
``_p99_ms`` during the flood and ``others_baseline_latency_p99_ms`` before it,
``others_events_lost`` (sent but never acked or never journaled), and the collector's CPU use.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil

from collector.store.sqlite import JournalReader
from fleetwatch.testing import free_port, made_up_hello, made_up_uuid
from fleetwatch.wire import settings
from fleetwatch.wire.repeats import seqs_covered
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
PR_SET_PDEATHSIG = 1
FLOODER = "flooder"
GPUS = 8
XIDS = (13, 31, 43, 45, 48, 63, 64, 68, 69, 74, 92, 94, 95)
# The flood's events that are not its one repeated Xid: every other (GPU, Xid) pair in turn.
OTHER_KEYS = [(gpu, xid) for gpu in range(1, GPUS) for xid in XIDS]


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def event(node: str, seq: int, *, gpu_xid: tuple[int, int], now_ms: int, detail: str) -> bytes:
    gpu, xid = gpu_xid
    target = pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=made_up_uuid(node, gpu))
    msg = pb.Event(
        seq=seq,
        time_unix_ms=now_ms,
        kind=pb.EVENT_KIND_XID,
        target=target,
        xid=xid,
        detail=detail,
    )
    return pb.AgentMessage(event=msg).SerializeToString()


async def open_stream(
    channel: grpc.aio.Channel, node: str, boot_id: str
) -> grpc.aio.StreamStreamCall[bytes, bytes]:
    call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(settings.STREAM_METHOD)()
    hello = made_up_hello(node, gpus=GPUS, nvlinks=0, ib_ports=0, boot_id=boot_id)
    await call.write(pb.AgentMessage(hello=hello).SerializeToString())
    raw = await call.read()
    if not isinstance(raw, bytes) or not pb.CollectorMessage.FromString(raw).HasField("welcome"):
        msg = f"{node}: no Welcome"
        raise RuntimeError(msg)
    return call


# ---- the flooder (a process of its own) -------------------------------------------------------


async def flood(args: argparse.Namespace) -> dict[str, Any]:
    """Connect, say ready, flood from SIGUSR1 to SIGTERM; return what was offered and taken."""
    go, stop = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, go.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    acked = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{args.port}") as channel:
        call = await open_stream(channel, FLOODER, "flood-boot")
        print("ready", flush=True)
        await go.wait()

        async def acks() -> None:
            nonlocal acked
            while isinstance(raw := await call.read(), bytes):
                msg = pb.CollectorMessage.FromString(raw)
                if msg.WhichOneof("body") == "ack":
                    acked = max(acked, msg.ack.seq)

        reader = asyncio.create_task(acks())
        share = args.alike_share
        start = time.monotonic()
        written = 0

        async def write_all() -> None:
            nonlocal written
            now_ms = int(time.time() * 1000)
            while not stop.is_set():
                due = int((time.monotonic() - start) * args.rate)
                if written >= due:
                    await asyncio.sleep(0.001)
                    continue
                seq = written + 1
                alike = int(seq * share) != int((seq - 1) * share)  # that share, spread evenly
                payload = event(
                    FLOODER,
                    seq,
                    gpu_xid=(0, 13) if alike else OTHER_KEYS[seq % len(OTHER_KEYS)],
                    now_ms=now_ms,
                    detail=f"flood {seq}",
                )
                await call.write(payload)  # waits while flow control holds the flooder back
                written = seq

        writer = asyncio.create_task(write_all())
        await stop.wait()
        offered = int((time.monotonic() - start) * args.rate)
        elapsed = time.monotonic() - start
        writer.cancel()
        reader.cancel()
        call.cancel()
    return {"offered": offered, "written": written, "acked": acked, "elapsed_s": elapsed}


# ---- the ordinary nodes -----------------------------------------------------------------------


@dataclass
class Other:
    """One ordinary node: its events' write times, and their latencies once acked."""

    node: str
    sent: dict[int, float] = field(default_factory=dict)
    acked: int = 0
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (sent at, ms)
    news: asyncio.Event = field(default_factory=asyncio.Event)  # set on every ack


async def run_other(other: Other, port: int, interval_s: float, stop: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = await open_stream(channel, other.node, f"boot-{other.node}")

        async def acks() -> None:
            while isinstance(raw := await call.read(), bytes):
                msg = pb.CollectorMessage.FromString(raw)
                if msg.WhichOneof("body") != "ack":
                    continue
                now = time.monotonic()
                for seq in range(other.acked + 1, msg.ack.seq + 1):
                    at = other.sent.get(seq)
                    if at is not None:
                        other.latencies.append((at, (now - at) * 1000))
                other.acked = max(other.acked, msg.ack.seq)
                other.news.set()

        reader = asyncio.create_task(acks())
        seq = 0
        try:
            while not stop.is_set():
                seq += 1
                gpu, xid = seq % GPUS, XIDS[(seq // GPUS) % len(XIDS)]
                now_ms = int(time.time() * 1000) + seq  # never two alike in one window
                detail = f"{other.node} event {seq}"
                payload = event(other.node, seq, gpu_xid=(gpu, xid), now_ms=now_ms, detail=detail)
                other.sent[seq] = time.monotonic()
                await call.write(payload)
                await asyncio.sleep(interval_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    while other.acked < seq:
                        other.news.clear()
                        await other.news.wait()
        finally:
            reader.cancel()
            call.cancel()


def busy_share(start: tuple[float, ...], end: tuple[float, ...]) -> float:
    """Share of the machine's CPU time between two ``psutil.cpu_times()`` that was busy."""

    def busy(t: tuple[float, ...]) -> float:
        return sum(t) - float(getattr(t, "idle", 0.0)) - float(getattr(t, "iowait", 0.0))

    total = sum(end) - sum(start)
    return round((busy(end) - busy(start)) / total, 3) if total > 0 else 0.0


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


# ---- orchestration ----------------------------------------------------------------------------


def start_collector(workdir: Path, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    journal = workdir / "journal.db"
    cfg = workdir / "collector.toml"
    cfg.write_text(
        f'[collector]\nlisten = "127.0.0.1:{port}"\nhttp = "127.0.0.1:{free_port()}"\n'
        f'journal = "{journal}"\n'
    )
    out = (workdir / "collector.log").open("wb")
    proc = subprocess.Popen(  # noqa: S603 - the venv's own command
        [str(Path(sys.executable).parent / "fleetwatch"), "collector", "--config", str(cfg)],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - no locks are taken before exec
    )
    return proc, journal


async def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = "the collector exited; see collector.log"
            raise RuntimeError(msg)
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.1)
    msg = "the collector did not listen"
    raise RuntimeError(msg)


def journal_figures(journal: Path, others: list[Other]) -> dict[str, Any]:
    reader = JournalReader(journal)
    rows = reader.events(node=FLOODER, limit=10_000_000)
    seqs = [s for r in rows if r.seq is not None for s in seqs_covered(r.seq, r.detail)]
    top = max(seqs, default=0)
    lost_others = 0
    for other in others:
        mine = {r.seq for r in reader.events(node=other.node, limit=10_000_000)}
        lost_others += sum(1 for seq in other.sent if seq not in mine)
    return {
        "flood_journal_rows": len(rows),
        "flood_events_journaled": len(seqs),
        "flood_events_lost": top - len(set(seqs)),
        "flood_events_duplicated": len(seqs) - len(set(seqs)),
        "others_events_not_journaled": lost_others,
    }


async def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="fleetwatch-flood-"))
    port = free_port()
    collector, journal = start_collector(workdir, port)
    flooder: asyncio.subprocess.Process | None = None
    try:
        await wait_port(port, collector)
        cproc = psutil.Process(collector.pid)
        others = [Other(f"node-{i:02d}") for i in range(1, args.nodes + 1)]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(run_other(o, port, args.interval, stop)) for o in others]
        flooder = await start_flooder(args, port, workdir)
        fproc = psutil.Process(flooder.pid)
        log(f"flood: baseline {args.baseline:g} s with {args.nodes} ordinary nodes")
        await asyncio.sleep(args.baseline)
        flood_began = time.monotonic()
        cpu0 = cproc.cpu_times()
        machine0 = psutil.cpu_times()
        fcpu0 = fproc.cpu_times()
        flooder.send_signal(signal.SIGUSR1)
        log(f"flood: {args.rate:,.0f} events/s offered for {args.seconds:g} s")
        await asyncio.sleep(args.seconds)
        cpu1 = cproc.cpu_times()
        machine1 = psutil.cpu_times()
        try:
            fcpu = fproc.cpu_times()
        except psutil.Error as exc:
            msg = f"the flooder is gone ({exc}); see {workdir}/flooder.log"
            raise RuntimeError(msg) from exc
        flood_wall = time.monotonic() - flood_began
        cpu = {
            "collector_cpu_cores_during_flood": round(
                (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / flood_wall, 3
            ),
            "flooder_cpu_cores": round(
                (fcpu.user + fcpu.system - fcpu0.user - fcpu0.system) / flood_wall, 3
            ),
            "machine_cpu_busy_share_during_flood": busy_share(machine0, machine1),
        }
        flooder.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(flooder.communicate(), 30)
        flood = json.loads(out.decode().strip().splitlines()[-1])
        await asyncio.sleep(args.settle)
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        if flooder is not None and flooder.returncode is None:
            flooder.kill()
        collector.send_signal(signal.SIGTERM)
        try:
            collector.wait(timeout=30)
        except subprocess.TimeoutExpired:
            collector.kill()
    return figures_of(args, journal, others, flood, flood_began) | cpu


async def start_flooder(
    args: argparse.Namespace, port: int, workdir: Path
) -> asyncio.subprocess.Process:
    """The flooder's process, connected and waiting for SIGUSR1."""
    flooder = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--role",
        "flooder",
        "--port",
        str(port),
        "--rate",
        str(args.rate),
        "--alike-share",
        str(args.alike_share),
        stdout=subprocess.PIPE,
        stderr=(workdir / "flooder.log").open("wb"),
        cwd=ROOT,
        preexec_fn=_die_with_parent,
    )
    line = b"" if flooder.stdout is None else await asyncio.wait_for(flooder.stdout.readline(), 60)
    if line.strip() != b"ready":
        msg = f"the flooder did not connect; see {workdir}/flooder.log"
        raise RuntimeError(msg)
    return flooder


def figures_of(
    args: argparse.Namespace,
    journal: Path,
    others: list[Other],
    flood: dict[str, Any],
    flood_began: float,
) -> dict[str, Any]:
    figures = journal_figures(journal, others)
    during = [ms for o in others for at, ms in o.latencies if at >= flood_began]
    before = [ms for o in others for at, ms in o.latencies if at < flood_began]
    sent = sum(len(o.sent) for o in others)
    unacked = sum(sum(1 for seq in o.sent if seq > o.acked) for o in others)
    seconds = flood["elapsed_s"]
    return {
        "flood_seconds": round(seconds, 2),
        "flood_events_per_s_offered": round(flood["offered"] / seconds),
        "flood_events_per_s_written": round(flood["written"] / seconds),
        "flood_events_per_s_accepted": round(figures["flood_events_journaled"] / seconds),
        "flood_journal_rows_per_s": round(figures["flood_journal_rows"] / seconds, 1),
        "flood_events_acked": flood["acked"],
        "flood_events_lost": figures["flood_events_lost"],
        "flood_events_duplicated": figures["flood_events_duplicated"],
        "others_nodes": args.nodes,
        "others_events_sent": sent,
        "others_events_lost": unacked + figures["others_events_not_journaled"],
        "others_event_latency_p50_ms": percentile(during, 0.5),
        "others_event_latency_p99_ms": percentile(during, 0.99),
        "others_event_latency_max_ms": percentile(during, 1.0),
        "others_baseline_latency_p99_ms": percentile(before, 0.99),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--role", choices=("orchestrator", "flooder"), default="orchestrator")
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=100_000.0, help="events/s offered")
    parser.add_argument("--alike-share", type=float, default=0.99)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the flood lasts")
    parser.add_argument("--baseline", type=float, default=5.0)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--nodes", type=int, default=4, help="ordinary nodes")
    parser.add_argument("--interval", type=float, default=0.05, help="s between their events")
    args = parser.parse_args()
    if args.role == "flooder":
        print(json.dumps(asyncio.run(flood(args))), flush=True)
        return
    result = asyncio.run(orchestrate(args))
    print(json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
