"""What the agent's on-disk spool costs: one fsync per poll, and replaying a full spool at start.

Run from the repository root: ``.venv/bin/python bench/spool_fsync.py [--polls N] [--dir PATH]``.
The last line of output is one JSON object (see the project's benchmark contract).

One measured poll is what the agent does with the events a poll found: ``Outbox.add`` for each
(numbering, encoding, handing the appended write to the outbox's disk thread) and then awaiting
``Outbox.sync`` (one ``fsync`` of the active segment on that thread; no hand-off when the poll
found no event). Polls with 0, 1, 10 and 100 events are
timed (wall clock and process CPU) against a peer that is the same code on the same filesystem
with the spool's injected ``fsync`` replaced by nothing, interleaved poll by poll so both see the
same disk. After each poll the collector's ack is applied, outside the measurement, as it would
arrive a moment later: acknowledged segments are deleted and the spool stays small.

Replay: a spool filled to the outbox's byte bound (``spool_max_bytes``, 64 MiB) with unacked
events, then opened by a new ``Outbox`` as an agent restart does (every segment read, every
record's CRC checked and event decoded). Timed twice: with the segments evicted from the page
cache first (``posix_fadvise(DONTNEED)``, as after a reboot; no effect on tmpfs) and warm.

The spool lives in a temporary directory under ``--dir`` (default: the system temp dir); the
JSON names it and its filesystem.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.exceptions import OutboxFullError
from agent.outbox.budget import DEFAULT_MAX_BYTES, ByteBudget
from agent.outbox.queue import Outbox
from agent.outbox.spool import Spool
from agent.poll.findings import PendingEvent
from fleetwatch.logs import configure_logging
from fleetwatch.model import EventKind, Target

BOOT_ID = "5f0c9d7e-3c1a-4b8e-9f7d-2a6b1c0e4d3f"
SIZES = (0, 1, 10, 100)
# An Xid event as the kernel log source makes it: the NVRM line is the detail.
DETAIL = "NVRM: Xid (PCI:0000:18:00): 79, pid=2419, name=python3, GPU has fallen off the bus."


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def event(i: int) -> PendingEvent:
    uuid = f"GPU-0b44e103-1061-24fa-dc5b-e476eb1624{i % 8:02x}"
    return PendingEvent(
        kind=EventKind.XID,
        target=Target.gpu(uuid),
        time_unix_ms=1_767_225_600_000 + i,
        xid=79,
        xid_class="gpu_lost",
        detail=DETAIL,
    )


def filesystem_of(path: Path) -> str:
    """The type of the filesystem ``path`` is on, from /proc/self/mounts (longest mount point)."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return kind
    resolved = str(path.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:  # noqa: PLR2004 - device, mount point, type
            continue
        point = fields[1]
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def no_fsync(fd: int) -> None:  # noqa: ARG001 - the peer: the same code, no fsync
    return


def open_outbox(directory: Path, *, fsync: bool, max_bytes: int = DEFAULT_MAX_BYTES) -> Outbox:
    spool = Spool(directory, BOOT_ID, fsync=os.fsync if fsync else no_fsync)
    return Outbox(BOOT_ID, spool=spool, budget=ByteBudget(max_bytes))


async def one_poll(outbox: Outbox, batch: list[PendingEvent]) -> tuple[float, float]:
    """(wall s, CPU s) of adding ``batch`` and syncing; the ack follows, not measured."""
    wall, cpu = time.perf_counter(), time.process_time()
    for pending in batch:
        outbox.add(pending)
    await outbox.sync()
    timings = time.perf_counter() - wall, time.process_time() - cpu
    outbox.ack(outbox.last_seq)
    return timings


async def polls(root: Path, size: int, count: int) -> dict[str, Any]:
    """``count`` polls of ``size`` events with fsync and without, interleaved."""
    runs = {True: open_outbox(root / f"fsync-{size}", fsync=True)}
    runs[False] = open_outbox(root / f"nofsync-{size}", fsync=False)
    batches = [[event(i * size + j) for j in range(size)] for i in range(count)]
    wall: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    for i, batch in enumerate(batches):
        order = (True, False) if i % 2 == 0 else (False, True)
        for synced in order:
            w, c = await one_poll(runs[synced], batch)
            wall[synced].append(w)
            cpu[synced].append(c)
    for outbox in runs.values():
        await outbox.close()
    fsync_ms = statistics.median(wall[True]) * 1000
    nofsync_ms = statistics.median(wall[False]) * 1000
    return {
        "fsync_ms_per_poll_median": round(fsync_ms, 4),
        "fsync_ms_per_poll_p90": round(statistics.quantiles(wall[True], n=10)[-1] * 1000, 4),
        "nofsync_ms_per_poll_median": round(nofsync_ms, 4),
        "fsync_cpu_ms_per_poll_median": round(statistics.median(cpu[True]) * 1000, 4),
        "nofsync_cpu_ms_per_poll_median": round(statistics.median(cpu[False]) * 1000, 4),
        "fsync_cost_ratio": round(fsync_ms / nofsync_ms, 2) if nofsync_ms > 0 else None,
        "events_per_s_with_fsync": round(size / (fsync_ms / 1000)) if size else 0,
    }


async def fill(directory: Path, max_bytes: int) -> tuple[int, int]:
    """Fill a spool to the byte bound with unacknowledged events; return (events, bytes)."""
    outbox = open_outbox(directory, fsync=True, max_bytes=max_bytes)
    added, i = 0, 0
    try:
        while True:
            for _ in range(1000):
                outbox.add(event(i))
                i += 1
                added += 1
            await outbox.sync()
    except OutboxFullError:
        await outbox.sync()
    held = outbox.spool_state.held_bytes
    await outbox.close()
    return added, held


def evict(directory: Path) -> None:
    """Drop the segments' pages from the page cache (they are clean: every one was fsynced)."""
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


async def replay(directory: Path, max_bytes: int, *, cold: bool) -> tuple[float, float, int]:
    """(wall s, CPU s, events restored) of opening the spool as a restarted agent does.

    Each open adds one empty segment (the new process's); nothing is acknowledged, so every
    replay restores the same events.
    """
    if cold:
        evict(directory)
    wall, cpu = time.perf_counter(), time.process_time()
    outbox = open_outbox(directory, fsync=True, max_bytes=max_bytes)
    timings = time.perf_counter() - wall, time.process_time() - cpu
    restored = outbox.restored
    await outbox.close()
    return *timings, restored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--polls", type=int, default=300, help="polls per batch size")
    parser.add_argument("--dir", type=Path, default=None, help="where the spools go")
    parser.add_argument("--replays", type=int, default=3, help="replays of the full spool")
    parser.add_argument("--spool-mib", type=int, default=DEFAULT_MAX_BYTES >> 20)
    args = parser.parse_args()
    configure_logging("warning", "console")  # the spool logs every segment at debug
    asyncio.run(run(args))


async def run(args: argparse.Namespace) -> None:
    """Every measurement, in order; print the JSON line."""
    started = time.perf_counter()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="fleetwatch-spool-", dir=args.dir) as tmp:
        root = Path(tmp)
        result["dir"] = str(root.parent)
        result["fs_type"] = filesystem_of(root)
        by_size: dict[str, dict[str, Any]] = {}
        for size in SIZES:
            log(f"{args.polls} polls of {size} events, with and without fsync ...")
            by_size[str(size)] = await polls(root, size, args.polls)
            log(f"  {by_size[str(size)]}")
        result["by_events_per_poll"] = by_size
        one = by_size["1"]
        for key in (
            "fsync_ms_per_poll_median",
            "nofsync_ms_per_poll_median",
            "fsync_cpu_ms_per_poll_median",
            "nofsync_cpu_ms_per_poll_median",
            "fsync_cost_ratio",
        ):
            result[key] = one[key]  # the headline: a poll that found one event
        result["events_per_s_max_with_fsync"] = max(
            s["events_per_s_with_fsync"] for s in by_size.values()
        )
        max_bytes = args.spool_mib << 20
        log(f"filling a {args.spool_mib} MiB spool ...")
        events, held = await fill(root / "full", max_bytes)
        result["replay_spool_bytes"] = held
        result["replay_events"] = events
        log(f"  {events} events, {held} bytes; replays, evicted from the page cache ...")
        cold = [await replay(root / "full", max_bytes, cold=True) for _ in range(args.replays)]
        log("replays, warm page cache ...")
        warm = [await replay(root / "full", max_bytes, cold=False) for _ in range(args.replays)]
        restored = {r for _, _, r in cold + warm}
        if restored != {events}:
            msg = f"replays restored {sorted(restored)} events, not {events}"
            raise SystemExit(msg)
        result["replay_s_for_64mib"] = round(statistics.median(w for w, _, _ in cold), 3)
        result["replay_cpu_s_for_64mib"] = round(statistics.median(c for _, c, _ in cold), 3)
        result["replay_warm_s_for_64mib"] = round(statistics.median(w for w, _, _ in warm), 3)
    result["polls_per_size"] = args.polls
    result["machine"] = f"{os.cpu_count()} cpus, python {sys.version.split()[0]}"
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    log("\n".join(f"  {k}: {v}" for k, v in result.items() if k != "by_events_per_poll"))
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
