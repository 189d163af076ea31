"""How late the agent's event loop answers while NVML hangs and while the disk is slow.

Run from the repository root: ``.venv/bin/python bench/agent_loop_lag.py [--rounds N]``.
The last line of output is one JSON object (see the project's benchmark contract).

One real agent (``agent.main.build_agent``) runs on a simulated node (8 GPUs, NVML through the
simulated library, a spool and a kernel log cursor under a temporary state directory, a job
socket), on its own event loop in this process, with the shipped NVML deadline (5 s) and a 1 s
poll. No collector answers: the link keeps trying to connect, as it would during an outage.
Other threads, never the agent's loop, drive and watch it:

- a probe thread hands the loop a callback every 10 ms (``call_soon_threadsafe``) and notes how
  long it waited to run: the loop's lag, sampled evenly in time, so a loop held for 5 s counts
  as 5 s of lag, not as one late tick. The figures are its p99 and max per phase;
- a writer thread appends an Xid line (Xid 13, GPUs in turn, never the hung one) to the
  simulated kernel log every 0.5 s; a watcher thread notes when each became a numbered event in
  the outbox (``kmsg_to_event``: the kernel log read and the event taken);
- a sender thread sends one step report every 50 ms to the job socket without blocking, as
  ``fleetwatch.jobclient`` does: a send the socket's queue refuses is a lost report; the watcher
  notes when each was read off the socket (``job_report_read``).

Each round has three phases of 12 s: ``idle`` (nothing wrong), ``nvml_hang`` (every NVML call
on GPU 4 blocks from the phase's start; it is released at its end) and ``slow_disk`` (every
fsync of the spool takes 2 s more, injected through the spool's ``fsync``). The JSON holds the
median over rounds of each phase's figures, and each round's.

``--code-without-seam``: for measuring the code from before the outbox had a disk thread,
whose ``Hardware`` had no ``fsync``: the slow fsync is then put into the spool after it is
built (its private ``_fsync``). The JSON's ``fsync_injected_through`` says which was used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import agent as agent_package
from agent.config import AgentConfig
from agent.main import build_agent
from agent.sim.cluster import sim_hardware
from agent.sim.hardware import SimNode
from agent.sources.kmsg_cursor import KmsgCursor
from fleetwatch.clock import SystemClock
from fleetwatch.logs import configure_logging
from fleetwatch.testing import free_port, wait_until

if TYPE_CHECKING:
    from agent.agent import Agent

PHASES = ("idle", "nvml_hang", "slow_disk")
PHASE_S = 12.0
SETTLE_S = 3.0
HUNG_GPU = 4
FSYNC_EXTRA_S = 2.0
PROBE_EVERY_S = 0.01
KMSG_EVERY_S = 0.5
REPORT_EVERY_S = 0.05
WATCH_EVERY_S = 0.001


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


class SlowableDisk:
    """The spool's fsync; ``extra_s`` seconds slower while set (on the disk thread or not)."""

    def __init__(self) -> None:
        self.extra_s = 0.0
        self.calls = 0

    def __call__(self, fd: int) -> None:
        """Wait ``extra_s``, then fsync for real."""
        self.calls += 1
        if self.extra_s:
            time.sleep(self.extra_s)
        os.fsync(fd)


@dataclasses.dataclass
class Phase:
    """What the threads saw during one phase."""

    name: str
    lags: list[float] = dataclasses.field(default_factory=list)
    kmsg_waits: list[float] = dataclasses.field(default_factory=list)
    report_waits: list[float] = dataclasses.field(default_factory=list)
    reports_sent: int = 0
    reports_refused: int = 0  # the socket's queue was full: lost
    kmsg_lines: int = 0
    kmsg_not_taken: int = 0  # still no event at the phase's end (plus the settle time)
    fsyncs: int = 0  # the spool's, in the phase and its settle time


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


class Drive:
    """The probe, writer, sender and watcher threads around one running agent."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, node: SimNode, agent: Agent, sock: Path
    ) -> None:
        self.loop, self.node, self.agent, self.sock = loop, node, agent, sock
        self.phase: Phase | None = None
        self.stop = threading.Event()
        self.kmsg_pending: list[tuple[int, float, Phase]] = []  # (event number, written, phase)
        self.report_pending: list[tuple[int, float, Phase]] = []  # (read count, sent, phase)
        self.lock = threading.Lock()
        self.numbered = 0  # events the writer's lines should have made so far
        self.reports = 0  # reports that left
        self.threads = [
            threading.Thread(target=self._probe, name="bench-probe", daemon=True),
            threading.Thread(target=self._write_kmsg, name="bench-kmsg", daemon=True),
            threading.Thread(target=self._send_reports, name="bench-reports", daemon=True),
            threading.Thread(target=self._watch, name="bench-watch", daemon=True),
        ]

    def start(self) -> None:
        """Count from what the agent has now; start the threads."""
        self.numbered = self.agent.outbox.last_seq
        self.reports = self._read_reports()
        for thread in self.threads:
            thread.start()

    def _probe(self) -> None:
        def ran(sent: float, phase: Phase | None) -> None:
            if phase is not None:
                phase.lags.append(time.perf_counter() - sent)

        while not self.stop.wait(PROBE_EVERY_S):
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(ran, time.perf_counter(), self.phase)

    def _write_kmsg(self) -> None:
        gpus = [g for i, g in enumerate(self.node.gpus) if i != HUNG_GPU]
        n = 0
        while not self.stop.wait(KMSG_EVERY_S):
            phase = self.phase
            if phase is None:
                continue
            gpu = gpus[n % len(gpus)]
            n += 1
            with self.lock:
                self.numbered += 1
                self.kmsg_pending.append((self.numbered, time.perf_counter(), phase))
            phase.kmsg_lines += 1
            self.node.kmsg.write(
                f"NVRM: Xid (PCI:{gpu.kernel_bus_id}): 13, pid=4242, name=python3, "
                f"Graphics Exception: bench line {n}",
            )

    def _send_reports(self) -> None:
        out = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # a rank's connection
        out.setblocking(False)  # noqa: FBT003 - the socket API
        connected = False
        step = 0
        while not self.stop.wait(REPORT_EVERY_S):
            phase = self.phase
            if phase is None:
                continue
            step += 1
            report = {"v": 1, "job": "bench", "rank": 0, "step": step, "step_time": 1.0}
            report.update({"tokens": 1000.0, "time": time.time(), "gpu": 0})
            phase.reports_sent += 1
            try:
                if not connected:
                    out.connect(str(self.sock))
                    connected = True
                out.send(json.dumps(report).encode())
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.ENOBUFS):
                    raise
                phase.reports_refused += 1
                continue
            with self.lock:
                self.reports += 1
                self.report_pending.append((self.reports, time.perf_counter(), phase))
        out.close()

    def _read_reports(self) -> int:
        jobs = self.agent.jobs
        assert jobs is not None  # noqa: S101 - the agent was built with a job socket
        return jobs.received + jobs.lost

    def _watch(self) -> None:
        while not self.stop.wait(WATCH_EVERY_S):
            now = time.perf_counter()
            numbered, read = self.agent.outbox.last_seq, self._read_reports()
            with self.lock:
                while self.kmsg_pending and self.kmsg_pending[0][0] <= numbered:
                    _, written, phase = self.kmsg_pending.pop(0)
                    phase.kmsg_waits.append(now - written)
                while self.report_pending and self.report_pending[0][0] <= read:
                    _, sent, phase = self.report_pending.pop(0)
                    phase.report_waits.append(now - sent)

    def close_phase(self, phase: Phase) -> None:
        """Count the phase's lines that never became an event."""
        with self.lock:
            phase.kmsg_not_taken = sum(1 for _, _, p in self.kmsg_pending if p is phase)


def summary(phase: Phase) -> dict[str, Any]:
    return {
        "loop_lag_p99_ms": ms(percentile(phase.lags, 0.99)),
        "loop_lag_max_ms": ms(max(phase.lags, default=None)),
        "loop_lag_samples": len(phase.lags),
        "kmsg_lines": phase.kmsg_lines,
        "kmsg_to_event_p50_ms": ms(percentile(phase.kmsg_waits, 0.5)),
        "kmsg_to_event_max_ms": ms(max(phase.kmsg_waits, default=None)),
        "kmsg_lines_not_taken": phase.kmsg_not_taken,
        "spool_fsyncs": phase.fsyncs,
        "job_reports_sent": phase.reports_sent,
        "job_reports_lost": phase.reports_refused,
        "job_report_read_p50_ms": ms(percentile(phase.report_waits, 0.5)),
        "job_report_read_max_ms": ms(max(phase.report_waits, default=None)),
    }


def controller(
    drive: Drive, disk: SlowableDisk, args: argparse.Namespace, out: list[dict[str, Any]]
) -> None:
    """Runs the phases on a thread of its own: the agent's loop may be the one that is stuck."""
    node, rounds, phase_s = drive.node, args.rounds, args.phase_s
    time.sleep(SETTLE_S)
    for r in range(rounds):
        by_phase: dict[str, Any] = {}
        for name in PHASES:
            phase = Phase(name)
            log(f"round {r + 1}/{rounds}: {name} for {phase_s:g} s ...")
            if name == "nvml_hang":
                node.nvml_hang(HUNG_GPU)
            elif name == "slow_disk":
                disk.extra_s = FSYNC_EXTRA_S
            drive.phase = phase
            fsyncs = disk.calls
            time.sleep(phase_s)
            drive.phase = None
            node.nvml_hang_clear()
            disk.extra_s = 0.0
            time.sleep(SETTLE_S)  # late events and reports of the phase still count as its own
            drive.close_phase(phase)
            phase.fsyncs = disk.calls - fsyncs
            by_phase[name] = summary(phase)
            log(f"  {by_phase[name]}")
        out.append(by_phase)
    drive.stop.set()


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name in PHASES:
        for key in rounds[0][name]:
            values = [r[name][key] for r in rounds if r[name][key] is not None]
            result[f"{name}_{key}"] = statistics.median(values) if values else None
    return result


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    clock = SystemClock()
    node = SimNode("bench-node", workdir / "sys", clock)
    state = workdir / "state"
    disk = SlowableDisk()
    hardware = dataclasses.replace(
        sim_hardware(node), kmsg_cursor=KmsgCursor(state / "kmsg-cursor.json", node.boot_id)
    )
    seam = "Hardware.fsync"
    if args.code_without_seam:
        seam = "Spool._fsync (set after build_agent)"
    else:
        hardware = dataclasses.replace(hardware, fsync=disk)
    sock = workdir / "jobs.sock"
    cfg = AgentConfig(
        collector=f"127.0.0.1:{free_port()}",  # nobody listens: an outage, as far as it knows
        node="bench-node",
        poll_interval=1.0,
        state_dir=state,
        job_socket=sock,
        memory_max_bytes=0,
        poll_cpu_max_share=0.0,
    )
    agent = build_agent(cfg, hardware, clock)
    if args.code_without_seam:
        assert agent.outbox.spool is not None  # noqa: S101 - built with a state_dir
        agent.outbox.spool._fsync = disk  # noqa: SLF001 - the code measured has no seam
    running = asyncio.create_task(agent.run(), name="agent")
    await wait_until(lambda: agent.polls > 0 and sock.exists(), timeout=60, what="agent up")
    drive = Drive(asyncio.get_running_loop(), node, agent, sock)
    drive.start()
    rounds: list[dict[str, Any]] = []
    control = threading.Thread(
        target=controller, args=(drive, disk, args, rounds), name="bench-control"
    )
    control.start()
    while control.is_alive():
        await asyncio.sleep(0.1)
        if running.done():
            running.result()  # the agent died: say why
            msg = "the agent stopped"
            raise RuntimeError(msg)
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    result = medians(rounds)
    result.update(
        {
            "rounds": args.rounds,
            "phase_s": args.phase_s,
            "nvml_deadline_s": cfg.nvml_call_timeout,
            "fsync_extra_s": FSYNC_EXTRA_S,
            "poll_interval_s": cfg.poll_interval,
            "fsync_injected_through": seam,
            "agent_code": str(Path(agent_package.__file__).parent),
            "by_round": rounds,
        }
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=PHASE_S, help="seconds per phase")
    parser.add_argument(
        "--code-without-seam",
        action="store_true",
        help="inject the slow fsync into the built spool (code whose Hardware has no fsync)",
    )
    args = parser.parse_args()
    configure_logging("error", "console")  # not the link's every failed connection
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fleetwatch-lag-") as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    result["machine"] = f"{os.cpu_count()} cpus, python {sys.version.split()[0]}"
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
