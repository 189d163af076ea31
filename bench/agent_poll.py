"""Agent CPU per poll and RSS on a simulated 8-GPU H100 node; its IB reading vs node_exporter.

The InfiniBand part is compared with Debian's prometheus-node-exporter (infiniband collector
only) reading the same sysfs tree.

Run from the repository root: ``.venv/bin/python bench/agent_poll.py [--polls N] [--rounds R]``.
The last line of output is one JSON object (see the project's benchmark contract).

What one measured poll is: the agent's whole cycle for one poll interval (NVML through the
simulated library, kmsg, udev, every IB port's state, and, when due, every IB counter and every
GPU's PCIe sysfs files read from a copy of ``tests/fixtures/sysfs/h100-cx7``), then change
detection and building the wire Report. The headline figure is the mean over polls at the
shipped cadence (a fake clock moves one poll interval per poll); the figures for a poll with all
counters due and with none due are reported too. Between polls, outside the measurement, the
simulated hardware moves: IB traffic counters grow and GPU temperature and power change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from agent.config import AgentConfig
from agent.main import Hardware, build_agent, fd_budget_for_process
from agent.poll.ib import IbPoller
from agent.probes.pci import normalize_bus_id
from agent.sim.hardware import SimNode
from agent.sim.sysfs_tree import SimSysfsTree
from agent.sources.nvml import load_pynvml
from agent.sources.sysfs import SysfsReader
from fleetwatch.clock import SystemClock, unix_ms
from fleetwatch.model import sample_to_pb
from fleetwatch.testing import FakeClock
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for bench.*
from bench.helpers.sim_nodes import move_hardware

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "sysfs" / "h100-cx7"
NODE_EXPORTER_NAMES = ("prometheus-node-exporter", "node_exporter")


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def link_real_gpus(sysfs_root: Path) -> None:
    """Give this machine's GPUs PCI functions in the fixture tree (the first fixture GPU's files).

    The PCIe sysfs part of a poll then costs what it costs with simulated GPUs; NVML is real.
    """
    lib = load_pynvml()
    lib.nvmlInit()
    try:
        buses = [
            normalize_bus_id(lib.nvmlDeviceGetPciInfo(lib.nvmlDeviceGetHandleByIndex(i)).busId)
            for i in range(lib.nvmlDeviceGetCount())
        ]
    finally:
        lib.nvmlShutdown()
    devices = sysfs_root / "bus" / "pci" / "devices"
    template = (devices / "0000:18:00.0").readlink()
    for bus in buses:
        if not (devices / bus).exists():
            (devices / bus).symlink_to(template)


async def agent_polls(
    workdir: Path, polls: int, rounds: int, *, real_nvml: bool = False
) -> dict[str, Any]:
    """Polls at the shipped cadence (fake clock), then with every signal due, then none.

    ``real_nvml``: the GPUs are the machine's own, through pynvml (the rest stays simulated).
    """
    clock = FakeClock()
    sysfs_root = workdir / "sys"
    shutil.copytree(FIXTURE, sysfs_root, symlinks=True)
    node = SimNode("bench-node", workdir / "sim", clock)
    if real_nvml:
        link_real_gpus(sysfs_root)
    hardware = Hardware(
        nvml=load_pynvml() if real_nvml else node.nvml,
        sysfs_root=sysfs_root,
        kmsg=node.kmsg,
        udev=node.udev,
        boot_id=node.boot_id,
    )
    defaults = AgentConfig(node="bench-node", state_dir=None, job_socket=None)
    agent = build_agent(defaults, hardware, clock, fd_budget=fd_budget_for_process())
    await agent.start()
    tree = SimSysfsTree(sysfs_root)
    rng = random.Random(7)
    sent: list[int] = []

    async def cycle() -> float:
        """One poll interval of agent work; returns its CPU time in ms."""
        move_hardware(node, tree, rng)  # not measured
        began = time.process_time()
        await agent.poll_once()
        changes = agent.live.take_changes()
        report = pb.Report(
            time_unix_ms=unix_ms(clock),
            samples=[sample_to_pb(k[0], k[1], v) for k, v in changes],
        )
        sent.append(len(report.SerializeToString()))
        cpu = (time.process_time() - began) * 1000
        clock.advance(defaults.poll_interval)
        return cpu

    for _ in range(5):  # warm-up: first reports carry everything
        await cycle()
    per_poll: list[float] = []
    full: list[float] = []
    fast: list[float] = []
    for _ in range(rounds):
        cycles = [await cycle() for _ in range(polls)]
        per_poll.append(statistics.fmean(cycles))
    sampler = agent.sampler
    for interval, into in ((1e-9, full), (1e9, fast)):
        sampler._counter_interval = interval  # noqa: SLF001 - the benchmark picks the cadence
        for _ in range(rounds):
            into.append(statistics.median([await cycle() for _ in range(polls)]))
    rss_mb = psutil.Process().memory_info().rss / 2**20
    sampler.close()
    return {
        "cpu_ms_per_poll_median": round(statistics.median(per_poll), 3),
        "cpu_ms_per_poll_definition": (
            f"mean agent CPU per {defaults.poll_interval:g} s poll at the shipped cadence "
            f"(sysfs counters every {defaults.counter_interval:g} s); median of {rounds} rounds "
            f"of {polls} polls"
        ),
        "cpu_ms_per_full_poll_median": round(statistics.median(full), 3),
        "cpu_ms_per_fast_poll_median": round(statistics.median(fast), 3),
        "gpus": hardware.nvml.nvmlDeviceGetCount(),
        "samples_per_poll": len(agent.live.values),
        "report_bytes_per_poll_median": int(statistics.median(sent[5:])),
        "rss_mb": round(rss_mb, 1),
    }


def ib_polls(workdir: Path, polls: int, rounds: int) -> float:
    """CPU to read all 8 IB ports (state and every counter) through the real sysfs source."""
    sysfs_root = workdir / "sys-ib"
    shutil.copytree(FIXTURE, sysfs_root, symlinks=True)
    reader = SysfsReader(sysfs_root, fd_budget_for_process())
    ports = tuple(reader.ib_ports())
    poller = IbPoller(reader, SystemClock())
    from collections import Counter

    from agent.poll.findings import PollResult

    errors: Counter[str] = Counter()
    for _ in range(5):
        poller.poll(ports, PollResult(), 0, errors, counters=True)
    medians = []
    for _ in range(rounds):
        times = []
        for _ in range(polls):
            began = time.process_time()
            poller.poll(ports, PollResult(), 0, errors, counters=True)
            times.append((time.process_time() - began) * 1000)
        medians.append(statistics.median(times))
    return statistics.median(medians)


def find_node_exporter() -> str | None:
    for name in NODE_EXPORTER_NAMES:
        path = shutil.which(name) or (
            f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None
        )
        if path:
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")


def node_exporter_scrapes(workdir: Path, binary: str, scrapes: int, rounds: int) -> float:
    """CPU per scrape of node_exporter's infiniband collector on the same tree."""
    sysfs_root = workdir / "sys-ne"
    shutil.copytree(FIXTURE, sysfs_root, symlinks=True)
    port = free_port()
    proc = subprocess.Popen(  # noqa: S603 - our own arguments
        [
            binary,
            f"--path.sysfs={sysfs_root}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            "--web.disable-exporter-metrics",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    body = resp.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        if "node_infiniband_port_data_transmitted_bytes_total" not in body:
            msg = "node_exporter exposes no infiniband metrics for the fixture tree"
            raise RuntimeError(msg)
        for _ in range(20):
            with urllib.request.urlopen(url, timeout=5) as resp:
                resp.read()
        per_scrape = []
        for _ in range(rounds):
            before = cpu_seconds(proc.pid)
            for _ in range(scrapes):
                with urllib.request.urlopen(url, timeout=5) as resp:
                    resp.read()
            per_scrape.append((cpu_seconds(proc.pid) - before) * 1000 / scrapes)
        return statistics.median(per_scrape)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--polls", type=int, default=200, help="polls per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=400, help="node_exporter scrapes/round")
    parser.add_argument(
        "--nvml",
        choices=("sim", "real"),
        default="sim",
        help="whose GPUs: the simulated 8-GPU node's, or this machine's through pynvml",
    )
    args = parser.parse_args()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="fleetwatch-bench-") as tmp:
        workdir = Path(tmp)
        log("agent: full polls ...")
        polls = agent_polls(workdir, args.polls, args.rounds, real_nvml=args.nvml == "real")
        result.update(asyncio.run(polls))
        result["nvml"] = args.nvml
        log("agent: IB ports only ...")
        ib_ms = ib_polls(workdir, args.polls, args.rounds)
        result["ib_cpu_ms_per_poll_median"] = round(ib_ms, 3)
        binary = find_node_exporter()
        if binary is None:
            result["node_exporter_ib_cpu_ms_per_scrape_median"] = None
            result["ib_cpu_ratio_vs_node_exporter"] = None
            result["why"] = (
                "prometheus-node-exporter not installed (apt-get install prometheus-node-exporter)"
            )
        else:
            log(f"node_exporter ({binary}): scrapes ...")
            ne_ms = node_exporter_scrapes(workdir, binary, args.scrapes, args.rounds)
            result["node_exporter_ib_cpu_ms_per_scrape_median"] = round(ne_ms, 3)
            result["ib_cpu_ratio_vs_node_exporter"] = round(ib_ms / ne_ms, 3) if ne_ms else None
    result["machine"] = f"{os.cpu_count()} cpus, python {sys.version.split()[0]}"
    log("\n".join(f"  {k}: {v}" for k, v in result.items()))
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
