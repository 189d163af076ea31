"""The processes of ``bench/collector_ingest.py``: the collector and the load, each on its CPU.

The collector (``fleetwatch collector --config``, the config
``bench/helpers/collector_config.py`` writes) runs on one CPU; the load processes
(``bench/ingest/load.py``, spoken to over ``bench/helpers/pipe.py``'s :class:`FleetProcess`
pipe), the recording and everything else on the other. A child is pinned before it execs, so
every thread it starts is pinned too.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import psutil

from bench.helpers.children import die_with_parent, stop_process, tail
from bench.helpers.collector_api import wait_healthy
from bench.helpers.collector_config import write_collector_config as write_config
from bench.helpers.pipe import FleetProcess
from bench.ingest.wire import node_name
from collector.config import load_collector_config

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path(__file__).resolve().parents[1]
LOAD = BENCH / "ingest" / "load.py"
RECORD = BENCH / "ingest" / "record.py"
PACE_S = 20.0  # connecting gives up when this long's pace would not get every node in in time


def log(*parts: object) -> None:
    print(*parts, flush=True)


def pinned(cores: set[int]) -> Callable[[], None]:
    """A ``preexec_fn``: die with this process, run on ``cores`` (threads inherit it)."""

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        die_with_parent()
        os.sched_setaffinity(0, cores)

    return preexec


def core_busy_s(core: int) -> float:
    """CPU seconds ``core`` has been busy (all processes, the kernel's work too)."""
    t = psutil.cpu_times(percpu=True)[core]
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


@dataclass
class Cores:
    """Which CPU runs the collector, and which runs everything else."""

    collector: int
    load: int

    @classmethod
    def pick(cls) -> Cores:
        """The first two CPUs this process may run on (RuntimeError: fewer than two)."""
        mine = sorted(os.sched_getaffinity(0))
        if len(mine) < 2:  # noqa: PLR2004
            msg = f"needs two CPUs (one for the collector, one for the load); has {mine}"
            raise RuntimeError(msg)
        return cls(collector=mine[0], load=mine[1])


@dataclass
class Collector:
    """One collector process with its config, pinned to a CPU."""

    proc: subprocess.Popen[bytes]
    base: str
    listen: str
    workdir: Path
    log_file: IO[bytes]

    @classmethod
    def start(
        cls, workdir: Path, receiver_url: str, nodes: int, core: int, command: list[str]
    ) -> Collector:
        """Write the config, start ``command collector --config``, wait for /healthz."""
        workdir.mkdir(parents=True, exist_ok=True)
        cfg_path = write_config(workdir, receiver_url, nodes)
        cfg = load_collector_config(cfg_path, {})
        out = (workdir / "collector.log").open("wb")
        proc = subprocess.Popen(  # noqa: S603 - the venv's own command, or the one asked for
            [*command, "collector", "--config", str(cfg_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            preexec_fn=pinned({core}),  # noqa: PLW1509 - no locks are taken before exec
        )
        base = "http://" + cfg.http
        if not wait_healthy(base, proc):
            out.close()
            msg = f"the collector did not come up:\n{tail(workdir / 'collector.log')}"
            raise RuntimeError(msg)
        return cls(proc, base, cfg.listen, workdir, out)

    def rss_mb(self) -> float:
        """The collector's resident memory now."""
        return float(psutil.Process(self.proc.pid).memory_info().rss) / 2**20

    def stop(self) -> None:
        """Terminate it (kill if it will not go) and close its log."""
        stop_process(self.proc)
        self.log_file.close()


@dataclass
class Load:
    """The load processes of one size."""

    procs: list[FleetProcess]
    owner: dict[str, FleetProcess]  # node -> the process that runs it
    logs: list[IO[bytes]] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        args: argparse.Namespace,
        nodes: int,
        collector: Collector,
        recording: Path,
        core: int,
    ) -> Load:
        """Start ``nodes`` nodes in processes of ``--nodes-per-process``; wait for them."""
        per = args.nodes_per_process
        procs: list[FleetProcess] = []
        owner: dict[str, FleetProcess] = {}
        logs: list[IO[bytes]] = []
        parts = math.ceil(nodes / per)
        connecting = max(1, args.connecting // parts)
        for i in range(parts):
            first = 1 + i * per
            count = min(per, nodes - i * per)
            err = (collector.workdir / f"load-{i}.log").open("wb")
            logs.append(err)
            proc = FleetProcess(
                [
                    f"--collector={collector.listen}",
                    f"--recording={recording}",
                    f"--first={first}",
                    f"--count={count}",
                    f"--nodes={nodes}",
                    f"--interval={args.interval}",
                    f"--events-per-s={args.events_per_s}",
                    f"--connecting={connecting}",
                    f"--seed={args.seed}",
                ],
                err,
                script=LOAD,
                preexec=pinned({core}),
            )
            procs.append(proc)
            for index in range(first, first + count):
                owner[node_name(index)] = proc
        for proc in procs:
            proc.wait_for("started", 60)
        return cls(procs, owner, logs)

    def ask_all(self, op: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Send ``op`` to every load process and return each one's answer."""
        for proc in self.procs:
            proc.send(op=op)
        return [proc.wait_for(op, timeout_s) for proc in self.procs]

    def tell_all(self, op: str) -> None:
        """Send ``op`` to every load process (no answer)."""
        for proc in self.procs:
            proc.send(op=op)

    def stop(self) -> None:
        """Stop every load process and close their logs."""
        for proc in self.procs:
            proc.stop()
        for f in self.logs:
            f.close()


def wait_connected(load: Load, collector: Collector, nodes: int, timeout_s: float) -> float:
    """Wait until every node's first Report is in; return how long it took.

    Gives up after ``timeout_s``, or sooner when the pace of the last ``PACE_S`` seconds would
    not get every node in by then (the collector is too far behind to take more).
    """
    began = time.monotonic()
    last_print = 0.0
    seen: list[tuple[float, int]] = []
    while True:
        states = load.ask_all("status")
        ready = sum(s["ready"] for s in states)
        failed = sum(s["failed"] for s in states)
        now = time.monotonic()
        waited = now - began
        if failed:
            first = next(s["first_error"] for s in states if s["failed"])
            msg = f"{failed} streams failed while connecting (first: {first})"
            raise RuntimeError(msg)
        if ready >= nodes:
            return waited
        if collector.proc.poll() is not None:
            msg = f"the collector exited:\n{tail(collector.workdir / 'collector.log')}"
            raise RuntimeError(msg)
        seen.append((now, ready))
        then, before = next(((t, r) for t, r in seen if t >= now - PACE_S), seen[0])
        pace = (ready - before) / (now - then) if now - then >= PACE_S / 2 else math.inf
        if waited > timeout_s or (waited > PACE_S and pace * (timeout_s - waited) < nodes - ready):
            msg = (
                f"only {ready} of {nodes} nodes connected and reported in {waited:.0f} s "
                f"({pace:.1f} a second lately; the limit is {timeout_s:g} s)"
            )
            raise TimeoutError(msg)
        if waited - last_print >= 10:  # noqa: PLR2004
            log(f"    {ready}/{nodes} nodes in after {waited:.0f} s")
            last_print = waited
        time.sleep(0.5)


def record(ctx_dir: Path, core: int) -> Path:
    out = ctx_dir / "recording.json"
    log("recording real agents on simulated nodes (bench/ingest/record.py) ...")
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, str(RECORD), f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=pinned({core}),
        timeout=300,
    )
    if done.returncode != 0:
        msg = f"recording failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        raise RuntimeError(msg)
    log(done.stdout.strip())
    return out
