"""Carries out the collector's pre-flight tasks on this node, on a thread of its own.

A task (:class:`~fleetwatch.wire.v1.fleetwatch_pb2.PreflightTask`) names checks; the quick ones
read NVML and sysfs (:mod:`agent.preflight.quick`), the measured ones call the injected runners
(:class:`~agent.preflight.runners.PreflightRunners`: real tools in production, the simulator's in
the demo and tests). Everything that blocks runs on the task's own thread: the agent's event loop
only awaits it, and goes on polling, reading the kernel log and sending heartbeats meanwhile.

The agent's own safety checks come first, whatever the collector asks. A task is refused (its
result's ``refused`` says why; the collector records could_not_run) when:

* compute processes use any GPU of the node, or a job reported a step through the job socket
  within :data:`JOB_RECENT_S` (a node being qualified is never running a job);
* another task is still running on the node;
* the task breaks the wire contract.

A check whose runner is missing, raises, or runs past the task's time becomes a measurement
whose ``error`` says so: could not run, never a pass.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Final

import structlog

from agent.exceptions import SourceError
from agent.preflight.quick import QUICK_CHECKS, QuickChecks
from agent.preflight.runners import (
    Group,
    HostBandwidth,
    PairBandwidth,
    PreflightRunners,
    Rail,
)
from fleetwatch.preflight.vocabulary import Check, Measurement
from fleetwatch.preflight.vocabulary import rail_component as rail_name
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import WireError
from fleetwatch.wire.validate_preflight import measurement_to_pb, validate_task

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent.jobs.listener import JobQueue
    from agent.poll.sampler import Sampler
    from agent.sources.nvml import NvmlSource

log = structlog.get_logger("agent.preflight")

# A step report this recent means a job is running here.
JOB_RECENT_S: Final = 300.0
# The executor answers this long after the task's own time even if a runner never returns.
GRACE_S: Final = 10.0
# How often GPU utilisation is read while a ladder rung runs (the first read comes one interval
# after the rung starts, so its start-up is not counted).
UTIL_EVERY_S: Final = 0.2
_UNITS: Final = {
    Check.P2P_BW: "GB/s",
    Check.P2P_BIDIR_BW: "GB/s",
    Check.H2D_BW: "GB/s",
    Check.D2H_BW: "GB/s",
    Check.ALLREDUCE_NODE: "GB/s",
    Check.ALLREDUCE_MULTI: "GB/s",
    Check.IB_WRITE_BW: "Gb/s",
    Check.LADDER_THROUGHPUT: "samples/s",
    Check.GPU_UTILISATION: "percent",
}


def could_not_run(check: Check, component: str, why: str) -> Measurement:
    """A measurement that says ``check`` did not run on ``component``, and why."""
    return Measurement(check, component, None, _UNITS.get(check, ""), error=why)


def group_from_pb(run_id: str, group: pb.PreflightGroup, timeout_s: float) -> Group:
    """The runner's view of a planned group."""
    return Group(
        run_id=run_id,
        nodes=tuple(group.nodes),
        node_rank=group.node_rank,
        gpus_per_node=group.gpus_per_node,
        master_addr=group.master_addr,
        master_port=group.master_port,
        size_bytes=group.size_bytes,
        timeout_s=timeout_s,
    )


def rail_component(test: pb.PreflightIbTest, node: str) -> str:
    """``rail:<hca>/<port>:<server node>-<client node>``, as both ends name it."""
    return rail_name(test.device, test.port, node, test.peer, server=test.server)


class PreflightExecutor:
    """Runs one pre-flight task at a time; counts refusals by reason."""

    def __init__(  # noqa: PLR0913 - the node's sources and the runners, injected
        self,
        *,
        node: str,
        sampler: Sampler,
        nvml: NvmlSource,
        quick: QuickChecks,
        runners: PreflightRunners,
        jobs: JobQueue | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``quick`` reads through sysfs readers of its own (not the sampler's open files)."""
        self._node = node
        self._sampler = sampler
        self._nvml = nvml
        self._quick = quick
        self._runners = runners
        self._jobs = jobs
        self._monotonic = monotonic
        self._running: str | None = None  # the task id while one runs (its thread may outlive)
        self.refused: Counter[str] = Counter()
        self.tasks = 0

    async def run(self, task: pb.PreflightTask) -> pb.PreflightResult:
        """Carry ``task`` out (or refuse it) and answer with its result."""
        result = pb.PreflightResult(run_id=task.run_id[:64], task_id=task.task_id[:64])
        why = await self._refusal(task)
        if why is not None:
            reason, text = why
            self.refused[reason] += 1
            log.warning("preflight_refused", run=task.run_id[:64], reason=reason, why=text)
            result.refused = text[:512]
            return result
        self.tasks += 1
        self._running = task.task_id
        done = threading.Event()
        box: list[Measurement] = []
        log.info("preflight_task", run=task.run_id, task=task.task_id, checks=list(task.checks))

        def work() -> None:
            try:
                self._carry_out(task, box)
            finally:
                self._running = None
                done.set()

        thread = threading.Thread(target=work, name=f"preflight-{task.task_id}", daemon=True)
        thread.start()
        loop = asyncio.get_running_loop()
        finished = await loop.run_in_executor(None, done.wait, task.timeout_s + GRACE_S)
        measurements = list(box)
        if not finished:
            seen = {m.check for m in measurements}
            why_late = f"not done within the task's {task.timeout_s:g} s"
            measurements += [
                could_not_run(Check(name), "node", why_late)
                for name in dict.fromkeys(task.checks)
                if Check(name) not in seen
            ]
        result.measurements.extend(measurement_to_pb(m) for m in measurements)
        return result

    async def _refusal(self, task: pb.PreflightTask) -> tuple[str, str] | None:
        try:
            validate_task(task)
        except WireError as exc:
            return "invalid_task", f"invalid task: {exc}"
        if self._running is not None:
            return "busy", f"another pre-flight task ({self._running}) is still running here"
        jobs = self._jobs
        if jobs is not None and jobs.last_added is not None:
            age = self._monotonic() - jobs.last_added
            if age < JOB_RECENT_S:
                return "job_running", (
                    f"a job is running here: job {jobs.last_job!r} reported a step "
                    f"through the job socket {age:.0f} s ago"
                )
        for gpu in self._sampler.inventory.gpus:
            try:
                pids = await self._sampler.compute_processes(gpu)
            except SourceError as exc:
                return "gpu_unknown", f"cannot tell whether GPU {gpu.index} is idle: {exc}"
            if pids:
                shown = ", ".join(map(str, pids[:5]))
                return "job_running", (
                    f"a job is running here: GPU {gpu.index} has {len(pids)} compute "
                    f"processes ({shown})"
                )
        return None

    # ---- on the task's thread --------------------------------------------------------------

    def _carry_out(self, task: pb.PreflightTask, out: list[Measurement]) -> None:
        checks = {Check(name) for name in task.checks}
        deadline = self._monotonic() + task.timeout_s
        inventory = self._sampler.inventory
        gpus = [gpu.index for gpu in inventory.gpus]
        if checks & QUICK_CHECKS:
            quick = checks & QUICK_CHECKS
            out.extend(self._call("quick", quick, lambda: self._quick.run(inventory, quick)))
        pair_checks = {Check.P2P_BW, Check.P2P_BIDIR_BW} & checks
        if pair_checks:
            pair = self._runners.pair
            got = self._call(
                "p2p",
                pair_checks,
                None if pair is None else partial(self._measure, pair, gpus, deadline),
            )
            out.extend(m for m in got if m.check in checks)
        host_checks = {Check.H2D_BW, Check.D2H_BW} & checks
        if host_checks:
            host = self._runners.host
            got = self._call(
                "host",
                host_checks,
                None if host is None else partial(self._measure, host, gpus, deadline),
            )
            out.extend(m for m in got if m.check in checks)
        for spec in task.groups:
            group = group_from_pb(task.run_id, spec, self._left(deadline))
            out.extend(self._group(spec, group, checks))
        if task.ib_tests:
            out.extend(self._ib(task, deadline))

    def _measure(
        self, runner: PairBandwidth | HostBandwidth, gpus: list[int], deadline: float
    ) -> list[Measurement]:
        return runner.measure(gpus, self._left(deadline))

    def _left(self, deadline: float) -> float:
        return max(deadline - self._monotonic(), 1.0)

    def _call(
        self,
        what: str,
        checks: set[Check],
        fn: Callable[[], list[Measurement]] | None,
    ) -> list[Measurement]:
        """Run a per-node runner; a missing or crashing one gives could_not_run for ``checks``."""
        if fn is None:
            return [could_not_run(c, "node", f"no {what} runner on this agent") for c in checks]
        try:
            got = list(fn())
        except Exception as exc:
            log.exception("preflight_runner_failed", what=what)
            return [could_not_run(c, "node", f"{what} runner failed: {exc}") for c in checks]
        missing = checks - {m.check for m in got}
        return got + [could_not_run(c, "node", f"the {what} runner gave no {c}") for c in missing]

    def _group(
        self, spec: pb.PreflightGroup, group: Group, checks: set[Check]
    ) -> list[Measurement]:
        check = Check(spec.check)
        component = "node" if check == Check.ALLREDUCE_NODE else f"nodes:{len(group.nodes)}"
        if check not in checks:
            return []
        if check == Check.LADDER_THROUGHPUT:
            ladder = self._runners.ladder
            if ladder is None:
                return [could_not_run(check, component, "no ladder runner on this agent")]
            util = _UtilSampler(self._nvml, self._sampler)
            util.start()
            try:
                m = self._one(check, component, lambda: ladder.run(group, max(spec.steps, 1)))
            finally:
                mean = util.stop()
            out = [_as(check, component, m)]
            if Check.GPU_UTILISATION in checks:
                if mean is None:
                    why = "no GPU utilisation could be read while the rung ran"
                    out.append(could_not_run(Check.GPU_UTILISATION, component, why))
                else:
                    out.append(
                        Measurement(
                            Check.GPU_UTILISATION,
                            component,
                            mean,
                            "percent",
                            evidence=util.evidence()[:2048],
                        ),
                    )
            return out
        collective = self._runners.collective
        if collective is None:
            return [could_not_run(check, component, "no collective runner on this agent")]
        return [
            _as(check, component, self._one(check, component, lambda: collective.all_reduce(group)))
        ]

    @staticmethod
    def _one(check: Check, component: str, fn: Callable[[], Measurement]) -> Measurement:
        try:
            return fn()
        except Exception as exc:
            log.exception("preflight_runner_failed", what=check.value)
            return could_not_run(check, component, f"runner failed: {type(exc).__name__}: {exc}")

    def _ib(self, task: pb.PreflightTask, deadline: float) -> list[Measurement]:
        """Every rail's test at once (each its own HCA), servers and clients alike."""
        ib = self._runners.ib
        tests = list(task.ib_tests)
        if ib is None:
            return [
                could_not_run(Check.IB_WRITE_BW, rail_component(t, self._node), "no ib runner")
                for t in tests
            ]

        def one(test: pb.PreflightIbTest) -> Measurement:
            rail = Rail(test.device, test.port)
            comp = rail_component(test, self._node)
            left = self._left(deadline)
            if test.server:
                got = self._one(
                    Check.IB_WRITE_BW, comp, lambda: ib.serve(rail, test.tcp_port, left)
                )
            else:
                got = self._one(
                    Check.IB_WRITE_BW,
                    comp,
                    lambda: ib.connect(rail, test.server_addr, test.tcp_port, left),
                )
            return Measurement(
                Check.IB_WRITE_BW, comp, got.value, got.unit or "Gb/s",
                text=got.text, error=got.error, evidence=got.evidence,
            )  # fmt: skip

        with ThreadPoolExecutor(len(tests), thread_name_prefix="preflight-ib") as pool:
            return list(pool.map(one, tests))


def _as(check: Check, component: str, m: Measurement) -> Measurement:
    """A group's measurement under the name the plan gave it (``nodes:<n>``, or ``node``)."""
    if m.check != check:
        why = m.error or f"the runner answered {m.check}, not {check}"
        return Measurement(check, component, None, m.unit, error=why, evidence=m.evidence)
    return replace(m, component=component)


class _UtilSampler:
    """Reads every GPU's utilisation on a thread while a ladder rung runs (NVML, as polls do).

    A final read is taken when the rung stops (NVML's figure covers its last sample period, the
    rung's tail), so a rung shorter than the period still has a figure. Reads
    in which every GPU is idle before the first busy read and after the last are the rung's
    start-up and tear-down, not its training, and are left out (all idle: all kept, the GPUs
    never got busy).
    """

    def __init__(self, nvml: NvmlSource, sampler: Sampler) -> None:
        self._nvml = nvml
        self._gpus = sampler.inventory.gpus
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._reads: list[dict[int, float]] = []  # each read: GPU index -> percent
        self._thread = threading.Thread(target=self._loop, name="preflight-util", daemon=True)
        self.reads = 0

    def start(self) -> None:
        self._thread.start()

    def _read(self) -> None:
        got: dict[int, float] = {}
        for gpu in self._gpus:
            try:
                pct = self._nvml.read(gpu).gpu_util_pct
            except SourceError:
                continue
            if pct is not None:
                got[gpu.index] = float(pct)
        with self._lock:
            self._reads.append(got)
            self.reads += 1

    def _loop(self) -> None:
        while not self._stop.wait(UTIL_EVERY_S):
            self._read()

    def stop(self) -> float | None:
        """Stop reading; the mean of what was read (None: nothing could be read)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=UTIL_EVERY_S + 5.0)
        self._read()  # the final reading: the rung's tail (a short rung's only one)
        values = [v for read in self._running() for v in read.values()]
        if not values:
            return None
        return round(sum(values) / len(values), 2)

    def _running(self) -> list[dict[int, float]]:
        """The reads from the first in which a GPU was busy to the last (all, if none was)."""
        with self._lock:
            reads = list(self._reads)
        busy = [i for i, read in enumerate(reads) if any(v > 0 for v in read.values())]
        return reads[busy[0] : busy[-1] + 1] if busy else reads

    def per_gpu(self) -> dict[int, float]:
        """Each GPU's mean utilisation while the rung ran."""
        values: dict[int, list[float]] = {}
        for read in self._running():
            for index, pct in read.items():
                values.setdefault(index, []).append(pct)
        return {i: round(sum(vs) / len(vs), 1) for i, vs in sorted(values.items()) if vs}

    def evidence(self) -> str:
        """What the figure is, with each GPU's mean (``gpu:3 100%``).

        The GPU the others wait for at every step is the busiest.
        """
        shown = ", ".join(f"gpu:{i} {pct:g}%" for i, pct in self.per_gpu().items())
        kept = len(self._running())
        idle = (
            f" ({self.reads - kept} idle at its start or end left out)" if kept < self.reads else ""
        )
        return f"mean of {kept} reads of every GPU while it ran{idle}; per GPU: {shown}"
