"""Hung and failed jobs: how soon fleetwatch says so, and whom it names.

Run from the repository root:
``.venv/bin/python bench/hang.py [--rounds N] [--torch-rounds N] [--floor S]``.
The last line of output is one JSON object (the project's benchmark contract).

What runs, all real but the hardware: a collector (``CollectorService``, built-in rules, rules
every 0.1 s) and two agents (``SimCluster``, polls every 0.2 s, their real job sockets and their
real watch on ``/proc``), in this process. Each case is one job of 4 rank processes, 2 on each
agent. ``--rounds`` rounds (6) of every kind below run with *simulated* ranks: small Python
processes that report each step through ``fleetwatch.jobclient``, where a step is 0.1 s of
sleep and the step's collective is this script, which tells every rank to start the next step
only once all reported the last (a rank that never reports holds every other rank, as a wedged
NCCL collective does). Then ``--torch-rounds`` rounds (1; 0: none) of ``stop``, ``kill``,
``sleep``, ``desync``, ``end`` and ``slow`` run with *real* ranks: ``tests/jobs/torch_job.py``,
a torch.distributed gloo job on the CPU (a small MLP, gradients all-reduced by hand, steps of
about 0.1 s with 4 ranks on 2 cores), which the 2-core machine runs one job at a time, in 1.5 to 2.5
minutes a round. ``raise``, ``stall``, ``checkpoint`` and ``agent_restart`` stay simulated
only (the real job has no flag for them). Where torch is not importable, no real case runs and
``real_torch`` says why.

Hangs (one rank, chosen in turn, unless said; a real case's rank is 1, 2 or 3 in turn, as rank
0 holds the job's rendezvous store):

* ``stop``: SIGSTOP (expect ``hung``, that rank named); real: after 20 steps;
* ``kill``: SIGKILL (expect ``failed``, that rank named); real: after 20 steps, and gloo then
  ends the others in an exception;
* ``raise``: an uncaught exception in that rank (expect ``failed``, that rank named);
* ``sleep``: the rank sleeps before its collective (expect ``hung``, that rank named: it waits
  in ``hrtimer_nanosleep`` while the others wait in the collective, here a pipe read); real:
  ``--sleep-rank`` before step 25's all-reduce, the others wait in gloo's, and py-spy's stacks
  (as root) name it;
* ``desync``: the rank enters another collective (a broadcast) while the others enter the
  step's all-reduce, and waits where they wait (the same pipe read, the same simulated stack):
  only its Flight Recorder tells it apart (expect ``hung``, that rank named). Each simulated
  rank serves a simulated Flight Recorder in torch's JSON format through
  ``fleetwatch.jobclient.serve_flight_recorder``, over the real channel to its agent; real:
  ``--broadcast-rank`` at step 25 with ``TORCH_FR_BUFFER_SIZE=64``, so that torch's own Flight
  Recorder is served (real stacks also show it in ``broadcast``);
* ``stall``: every rank waits in the same place outside the collective (a data loader; expect
  ``hung`` and nobody named).

Controls, which must never be ``hung`` or ``failed`` nor name anyone: ``end`` (the job ends
normally; real: after 40 steps), ``slow`` (steps of 1 s, steady; real: rank 3 computes 70 times
as long, so every step waits for it, about 1 s, for 20 steps, then the job ends),
``checkpoint`` (rank 0 announces a checkpoint, then no step for twice the deadline) and
``agent_restart`` (one agent is killed and started again mid-job). A real rank takes seconds to
exit after its last step (gloo's teardown, about 3 s on a busy 2-core machine), which can be
longer than a short ``--floor``: ``false_hangs_after_last_step`` counts the controls whose false
hang came only then, after the last step, before they finished (they are in ``false_hangs``).

The deadline floor is ``--floor`` (3 s, not the default 30 s, so that a case takes seconds):
the time to ``hung`` measured after the last step is the floor plus the detection latency, and
at the default floor it would be 27 s more. Every figure holds both kinds of case. Figures:
``hung_after_last_step_s_p50``/``p95`` (hang cases that were called hung or failed; for a
simulated case from the step this script saw finish, for a real one the collector's own
``silent_s`` when it called the job, since nothing here sees a real rank's step sooner),
``localised_share`` (single-culprit cases whose first culprit is the right rank and node),
``false_hangs`` (controls ever hung or failed), ``false_culprits`` (a culprit other than the
case's rank, or any in a ``stall`` or control), ``healthy_step_overhead_pct`` (the median cost
of one ``report_step`` to a real agent over a 1 s step, and over the 0.1 s steps here).
``evidence_s_p95``: how long the collector took to
gather the dumps of a hung case's ranks (real py-spy when this runs as root, ``stacks`` says
which; a stopped rank's Flight Recorder costs its 1 s timeout); and
``evidence_8_ranks_one_node_s_*``: one agent dumping an 8-rank job's ranks on demand, 5 times.
``by_kind`` counts each kind's cases, those called as expected and those whose culprits were
(simulated and real together); ``cases_by_source`` the same for ``real_torch`` and
``simulated`` apart; ``real_torch_cases`` and ``simulated_rank_cases`` how many of each;
``real_torch_localised`` the real single-culprit cases named right (``named/cases``);
``real_torch_hung_after_last_step_s`` each real hang's time; ``real_torch_control_step_s_median``
the real controls' step time; ``real_torch`` what ran (or why none); ``real_torch_s`` how long.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.sim.cluster import SimCluster
    from collector.main import CollectorService

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEP_S = 0.1
RANKS = 4
PLACES = {0: "node-1", 1: "node-1", 2: "node-2", 3: "node-2"}
HANGS = ("stop", "kill", "raise", "sleep", "desync", "stall")
CONTROLS = ("end", "slow", "checkpoint", "agent_restart")
SINGLE = ("stop", "kill", "raise", "sleep", "desync")
EXPECTED = {
    "stop": "hung",
    "kill": "failed",
    "raise": "failed",
    "sleep": "hung",
    "desync": "hung",
    "stall": "hung",
}
EXPECTED_CONTROL = {"end": "finished"}  # the others: running all along
WARM_STEPS = 8
TORCH_JOB = ROOT / "tests" / "jobs" / "torch_job.py"
TORCH_HANGS = ("stop", "kill", "sleep", "desync")
TORCH_CONTROLS = ("end", "slow")
TORCH_WARM_STEPS = 20  # steps a real job runs before it is stopped or killed
TORCH_AT_STEP = 25  # the step before whose all-reduce a real rank sleeps or broadcasts
TORCH_END_STEPS = 40  # the steps of the real end control (it then ends normally)
TORCH_SLOW_STEPS = 20  # the steps of the real slow control (it then ends normally)
TORCH_SLOW_RANK, TORCH_SLOW_FACTOR = 3, 70.0  # slow control: steps of about 1 s, waiting on 3
TORCH_START_S = 120.0  # at most this long for 4 ranks to import torch and meet (2 cores)

RANK = """
import sys, time
from fleetwatch.jobclient import report_step, serve_flight_recorder
path, job, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
entries = []  # a simulated Flight Recorder: (seq, op, state) of the default group

def recorder():
    done = max((s for s, _, state in entries if state == "completed"), default=-1)
    return {"version": "2.10", "pg_status": {"0": {
        "last_enqueued_collective": entries[-1][0] if entries else -1,
        "last_started_collective": -1, "last_completed_collective": done}},
        "entries": [{"collective_seq_id": s, "pg_id": 0, "process_group": ["0", "default_pg"],
                     "profiling_name": "sim:" + op, "state": state} for s, op, state in entries]}

for line in sys.stdin:
    word, *rest = line.split()
    if word == "go":
        step, step_s = int(rest[0]), float(rest[1])
        entries = entries[-7:] + [[step + 1, "all_reduce", "scheduled"]]
        time.sleep(step_s)
        entries[-1][2] = "completed"
        report_step(job, rank, step, step_s, 1000.0, socket_path=path, world_size=world,
                    checkpointing=len(rest) > 2)
        serve_flight_recorder(path, dump=recorder)
        print("done", flush=True)
    elif word in ("enter", "desync"):  # enter the step's collective (or another) and wait
        op = "all_reduce" if word == "enter" else "broadcast"
        entries = entries[-7:] + [[int(rest[0]) + 1, op, "scheduled"]]
    elif word == "sleep":
        time.sleep(3600)
    elif word == "raise":
        raise RuntimeError("the rank's own failure")
    elif word == "end":
        break
"""


@dataclass
class Case:
    """One hang or control: what was done, and what fleetwatch said."""

    kind: str
    culprit: int | None  # the rank at fault (None: none)
    job: str
    seen: set[str] = field(default_factory=set)  # states the job was seen in
    first_seen: dict[str, str] = field(default_factory=dict)  # state -> at which step, when
    began: float = field(default_factory=time.monotonic)
    hung_after_s: float | None = None
    culprits: list[str] = field(default_factory=list)
    evidence_s: float | None = None  # how long gathering the ranks' dumps took
    source: str = "simulated"  # or "real_torch"
    silent_when_called_s: float | None = None  # the collector's silent_s when hung or failed
    step_time_s: float = 0.0  # the job's step time as last seen
    top_step: int = 0  # the job's highest finished step as last seen
    called_at_step: int | None = None  # the job's step when first seen hung or failed


class Job:
    """4 rank processes and the collective that holds them together."""

    def __init__(
        self, job: str, sockets: dict[str, Path], places: dict[int, str] | None = None
    ) -> None:
        self.job, self.sockets = job, sockets
        self.places = places or PLACES
        self.procs: list[asyncio.subprocess.Process] = []
        self.last_step_at = 0.0

    async def start(self) -> None:
        """Start the rank processes."""
        for rank, node in self.places.items():
            self.procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    RANK,
                    str(self.sockets[node]),
                    self.job,
                    str(rank),
                    str(len(self.places)),
                    cwd=ROOT,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL,
                )
            )

    def tell(self, rank: int, line: str) -> None:
        """Send ``rank`` one line of instructions."""
        stdin = self.procs[rank].stdin
        assert stdin is not None  # noqa: S101 - a pipe we asked for
        stdin.write(f"{line}\n".encode())

    async def step(self, step: int, step_s: float = STEP_S, *, announce: bool = False) -> bool:
        """One step on every rank; False when some rank did not finish it within 5 s."""
        for rank in range(len(self.places)):
            extra = " checkpoint" if announce and rank == 0 else ""
            self.tell(rank, f"go {step} {step_s}{extra}")
        try:
            for proc in self.procs:
                assert proc.stdout is not None  # noqa: S101
                if await asyncio.wait_for(proc.stdout.readline(), 5 + step_s) != b"done\n":
                    return False
        except TimeoutError:
            return False
        self.last_step_at = time.monotonic()
        return True

    async def end(self) -> None:
        """Let every rank end normally."""
        for rank, proc in enumerate(self.procs):
            if proc.returncode is None:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    self.tell(rank, "end")
        await self.reap(5.0)

    async def reap(self, grace: float) -> None:
        """Wait ``grace`` seconds for each rank to end, then kill it."""
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                if proc.returncode is None:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                    await proc.wait()


class TorchJob(Job):
    """4 real torch.distributed gloo ranks (``tests/jobs/torch_job.py``), 2 on each agent."""

    def __init__(
        self, job: str, sockets: dict[str, Path], argv: list[str], env: dict[str, str], logs: Path
    ) -> None:
        super().__init__(job, sockets)
        self.argv, self.env, self.logs = argv, env, logs

    async def start(self) -> None:
        """Start the ranks; they meet on a free port of 127.0.0.1 and train on their own."""
        from fleetwatch.testing import free_port

        port = free_port()
        for rank, node in self.places.items():
            with (self.logs / f"{self.job}-rank{rank}.log").open("wb") as out:
                self.procs.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable,
                        str(TORCH_JOB),
                        f"--rank={rank}",
                        f"--world-size={len(self.places)}",
                        f"--master-port={port}",
                        f"--job={self.job}",
                        f"--socket={self.sockets[node]}",
                        *self.argv,
                        cwd=ROOT,
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=out,
                        stderr=out,
                        env={**os.environ, **self.env},
                    )
                )


def torch_argv(case: Case) -> tuple[list[str], dict[str, str]]:
    """The real job's own flags and environment for the case."""
    rank = case.culprit
    at = [f"--sleep-at-step={TORCH_AT_STEP}", "--gloo-timeout-s=600"]
    if case.kind == "end":
        return [f"--steps={TORCH_END_STEPS}"], {}
    if case.kind == "slow":
        slow = [f"--slow-rank={TORCH_SLOW_RANK}", f"--slow-factor={TORCH_SLOW_FACTOR}"]
        return [f"--steps={TORCH_SLOW_STEPS}", *slow], {}
    if case.kind == "sleep":
        return ["--steps=1000000", f"--sleep-rank={rank}", *at], {}
    if case.kind == "desync":  # torch's own Flight Recorder tells this one apart
        return ["--steps=1000000", f"--broadcast-rank={rank}", *at], {"TORCH_FR_BUFFER_SIZE": "64"}
    return ["--steps=1000000"], {}  # stop, kill: a signal from here, after the warm steps


async def run_torch_case(
    service: CollectorService, sockets: dict[str, Path], case: Case, floor: float, logs: Path
) -> None:
    argv, env = torch_argv(case)
    job = TorchJob(case.job, sockets, argv, env, logs)
    await job.start()
    try:
        if case.kind in {"stop", "kill"}:
            await watch(
                service, case, TORCH_START_S, until={"hung", "failed"}, step=TORCH_WARM_STEPS
            )
            if case.seen & {"hung", "failed"} or case.culprit is None:
                case.seen.add("broken")  # it hung or failed before anything was done to it
                return
            if job_view(service, case.job).get("step", 0) < TORCH_WARM_STEPS:
                case.seen.add("broken")  # it never got going
                return
            pid = job.procs[case.culprit].pid
            os.kill(pid, signal.SIGSTOP if case.kind == "stop" else signal.SIGKILL)
        if case.kind in TORCH_HANGS:  # sleep, desync: it hangs at TORCH_AT_STEP on its own
            await watch(service, case, TORCH_START_S + floor + 25.0, until={"hung", "failed"})
            case.hung_after_s = case.silent_when_called_s
            if "hung" in case.seen:
                case.evidence_s = await evidence_took(service, case.job)
            await watch(service, case, 0.5, until=set())
        else:
            await watch(service, case, TORCH_START_S + 60.0, until={"finished", "failed"})
            await watch(service, case, 0.5, until=set())
    finally:
        await job.reap(0.0 if case.kind in TORCH_HANGS else 10.0)


async def torch_part(
    service: CollectorService, sockets: dict[str, Path], args: argparse.Namespace, work: Path
) -> tuple[list[Case], str]:
    """The real torch cases, ``--torch-rounds`` of each kind, and what ran (or why none)."""
    if args.torch_rounds <= 0:
        return [], "none: --torch-rounds 0"
    if importlib.util.find_spec("torch") is None:
        return [], "none: torch is not importable here"
    logs = work / "torch-logs"
    logs.mkdir()
    cases: list[Case] = []
    for round_ in range(args.torch_rounds):
        for index, kind in enumerate(TORCH_HANGS + TORCH_CONTROLS):
            # ranks 1-3 in turn (rank 0 holds the rendezvous store; the others are alike)
            culprit = 1 + (round_ + index) % (RANKS - 1) if kind in TORCH_HANGS else None
            case = Case(kind, culprit, f"torch-{kind}-{round_}", source="real_torch")
            await run_torch_case(service, sockets, case, args.floor, logs)
            cases.append(case)
            print(f"[real torch] {said(case)}", flush=True)
    return cases, f"{len(cases)} real torch gloo jobs of 4 ranks (ranks' logs in {logs})"


def said(case: Case) -> str:
    """One line on what became of the case."""
    return (
        f"{case.job}: seen {case.first_seen}, "
        f"after {case.hung_after_s}, evidence {case.evidence_s}, "
        f"culprits {case.culprits[:1]}, step {case.step_time_s:.3f} s"
    )


def job_view(service: CollectorService, job: str) -> dict[str, Any]:
    return next((j for j in service.jobs.summaries() if j["id"] == job), {})


async def watch(
    service: CollectorService,
    case: Case,
    seconds: float,
    *,
    until: set[str],
    step: int | None = None,
) -> None:
    """Look at the job every 0.1 s for ``seconds``, or until it is in one of ``until``.

    With ``step``, also until the job has finished that step.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        view = job_view(service, case.job)
        state = view.get("state", "")
        case.seen.add(state)
        if state and state not in case.first_seen:
            at = time.monotonic() - case.began
            case.first_seen[state] = f"step {view.get('step', 0)} at {at:.1f} s"
        if view.get("culprits"):
            case.culprits = list(view["culprits"])
        case.step_time_s = float(view.get("step_time_s") or case.step_time_s)
        case.top_step = max(case.top_step, int(view.get("step", 0)))
        if state in {"hung", "failed"} and case.silent_when_called_s is None:
            case.silent_when_called_s = float(view["silent_s"])
            case.called_at_step = case.top_step
        if state in until or (step is not None and view.get("step", 0) >= step):
            return
        await asyncio.sleep(0.1)


async def run_case(
    service: CollectorService, cluster: SimCluster, case: Case, floor: float
) -> None:
    job = Job(case.job, cluster.job_sockets)
    await job.start()
    try:
        for step in range(WARM_STEPS):
            if not await job.step(step):
                case.seen.add("broken")
                return
        await watch(service, case, 0.5, until=set())
        if case.kind in HANGS:
            await inject(job, case)
            began = job.last_step_at
            await watch(service, case, floor + 25.0, until={"hung", "failed"})
            if case.seen & {"hung", "failed"}:
                case.hung_after_s = time.monotonic() - began
            if "hung" in case.seen:
                case.evidence_s = await evidence_took(service, case.job)
            await asyncio.sleep(0.3)
            await watch(service, case, 0.3, until=set())
        else:
            await control(job, case, cluster, service, floor)
    finally:
        await job.reap(0.0) if case.kind in HANGS else await job.end()


async def evidence_took(service: CollectorService, job: str) -> float | None:
    """How long the hung job's evidence took to gather (None: none within 30 s)."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        found = service.jobs.evidence_of(job)
        if found:
            return float(found["took_s"])
        await asyncio.sleep(0.1)
    return None


async def eight_ranks_of_a_node(service: CollectorService, cluster: SimCluster) -> list[float]:
    """Seconds node-1's agent took to dump an 8-rank job's ranks, asked 5 times (on demand)."""
    job = Job("eight", cluster.job_sockets, dict.fromkeys(range(8), "node-1"))
    await job.start()
    took = []
    try:
        for step in range(WARM_STEPS):
            await job.step(step)
        for _ in range(5):
            found = await service.jobs.dump(job.job) or {}
            node: dict[str, Any] = next(iter(found.get("nodes", [])), {})
            if node.get("ranks") == 8 and not node.get("error"):  # noqa: PLR2004
                took.append(float(node["took_s"]))
    finally:
        await job.end()
    return took


async def inject(job: Job, case: Case) -> None:
    """Make the case's fault happen."""
    rank = case.culprit
    if case.kind == "stall":
        for r in range(RANKS):
            job.tell(r, "sleep")
        return
    assert rank is not None  # noqa: S101
    if case.kind == "stop":
        os.kill(job.procs[rank].pid, signal.SIGSTOP)
    elif case.kind == "kill":
        job.procs[rank].kill()
    elif case.kind == "raise":
        job.tell(rank, "raise")
    elif case.kind == "sleep":
        job.tell(rank, "sleep")
    elif case.kind == "desync":
        job.tell(rank, f"desync {WARM_STEPS}")
    for r in range(RANKS):  # the others enter the collective and wait there
        if r != rank:
            job.tell(r, f"enter {WARM_STEPS}")


async def control(
    job: Job, case: Case, cluster: SimCluster, service: CollectorService, floor: float
) -> None:
    step = WARM_STEPS
    if case.kind == "end":
        await job.end()
        await watch(service, case, 5.0, until={"finished"})
    elif case.kind == "slow":
        for step in range(WARM_STEPS, WARM_STEPS + 8):
            await job.step(step, 1.0)
            await watch(service, case, 0.05, until=set())
    elif case.kind == "checkpoint":
        await job.step(step, announce=True)
        await watch(service, case, 2 * (floor + 1.0), until={"hung", "failed"})
        await job.step(step + 1)
    elif case.kind == "agent_restart":
        await cluster.crash("node-2")
        await cluster.restart("node-2")
        for step in range(WARM_STEPS, WARM_STEPS + 30):
            await job.step(step)
            await watch(service, case, 0.01, until=set())
    await watch(service, case, 0.5, until=set())


async def report_cost(sockets: dict[str, Path]) -> float:
    """Median seconds of one report_step to a real agent (in a child, as a rank calls it)."""
    code = (
        "import sys, time, statistics\n"
        "from fleetwatch.jobclient import report_step\n"
        "times = []\n"
        "for i in range(2000):\n"
        "    t = time.perf_counter()\n"
        "    report_step('cost', 0, i, 1.0, 1000.0, socket_path=sys.argv[1])\n"
        "    times.append(time.perf_counter() - t)\n"
        "    time.sleep(0.001)\n"
        "print(statistics.median(times))\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, str(sockets["node-1"]), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return float(out.decode().strip())


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import structlog

    from agent.jobs.stacks import PySpyDumper, find_py_spy
    from agent.sim.cluster import SimCluster
    from collector.config import CollectorConfig
    from collector.jobs.config import JobsConfig
    from collector.main import CollectorService
    from fleetwatch.clock import SystemClock
    from fleetwatch.testing import wait_until

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    # real stacks where this runs as root (py-spy reads other processes' memory), else simulated
    py_spy = find_py_spy() if os.geteuid() == 0 else None
    stacks = PySpyDumper(py_spy) if py_spy is not None else None
    work = Path(tempfile.mkdtemp(prefix="fwhang"))
    jobs = JobsConfig(hang_floor_s=args.floor, exit_grace_s=2.0, ranks_per_node=10_000)
    config = CollectorConfig(
        listen="127.0.0.1:0",
        http="127.0.0.1:0",
        journal=work / "journal.db",
        rules_interval=0.1,
        jobs=jobs,
    )
    service = CollectorService(config, SystemClock())
    await service.start()
    sockets = Path(tempfile.mkdtemp(prefix="fwhs", dir="/tmp"))
    cluster = SimCluster(
        list(dict.fromkeys(PLACES.values())),
        work / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.2,
        heartbeat_interval=0.5,
        job_socket_dir=sockets,
        stacks=stacks,
    )
    cluster.start()
    cases: list[Case] = []
    try:
        await wait_until(
            lambda: all(p.exists() for p in cluster.job_sockets.values()), what="job sockets"
        )
        for round_ in range(args.rounds):
            for kind in HANGS + CONTROLS:
                culprit = (round_ + len(cases)) % RANKS if kind in SINGLE else None
                case = Case(kind, culprit, f"{kind}-{round_}-{len(cases)}")
                await run_case(service, cluster, case, args.floor)
                cases.append(case)
                print(said(case), flush=True)
        began = time.monotonic()
        torch_cases, torch_note = await torch_part(service, cluster.job_sockets, args, work)
        torch_s = time.monotonic() - began
        cases += torch_cases
        cost = await report_cost(cluster.job_sockets)
        eight = await eight_ranks_of_a_node(service, cluster)
    finally:
        await cluster.stop()
        await service.stop(grace=0)
    return figures(cases, cost, args.floor) | {
        "real_torch": torch_note,
        "real_torch_s": round(torch_s, 1),
        "stacks": "py-spy" if stacks is not None else "simulated",
        "evidence_8_ranks_one_node_s_median": round(statistics.median(eight), 3) if eight else None,
        "evidence_8_ranks_one_node_s_max": round(max(eight), 3) if eight else None,
    }


def right_culprit(case: Case) -> bool:
    if not case.culprits or case.culprit is None:
        return False
    return case.culprits[0].startswith(f"rank {case.culprit} on {PLACES[case.culprit]}")


def as_expected(case: Case) -> bool:
    """The case's job was called what it is: hung or failed, finished, or never either."""
    if "broken" in case.seen:
        return False
    if case.kind in HANGS:
        return EXPECTED[case.kind] in case.seen
    wrong = bool(case.seen & {"hung", "failed"})
    return not wrong and EXPECTED_CONTROL.get(case.kind, "running") in case.seen


def false_culprit(case: Case) -> bool:
    if case.kind in CONTROLS or case.kind == "stall":
        return bool(case.culprits)
    return bool(case.culprits) and not right_culprit(case)


def hung_while_ending(case: Case) -> bool:
    """A control called hung or failed only after its last step, and then finished.

    Its ranks were still exiting when its deadline passed.
    """
    late = case.called_at_step is not None and case.called_at_step == case.top_step
    return bool(case.seen & {"hung", "failed"}) and late and "finished" in case.seen


def tally(cases: list[Case]) -> dict[str, dict[str, int]]:
    """Per kind that ran: cases, those called as expected, those whose culprits were."""
    return {
        kind: {
            "cases": sum(c.kind == kind for c in cases),
            "called_as_expected": sum(c.kind == kind and as_expected(c) for c in cases),
            "culprit_as_expected": sum(
                c.kind == kind and (right_culprit(c) if kind in SINGLE else not c.culprits)
                for c in cases
            ),
        }
        for kind in HANGS + CONTROLS
        if any(c.kind == kind for c in cases)
    }


def figures(cases: list[Case], cost: float, floor: float) -> dict[str, Any]:
    hangs = [c for c in cases if c.kind in HANGS]
    controls = [c for c in cases if c.kind in CONTROLS]
    times = sorted(c.hung_after_s for c in hangs if c.hung_after_s is not None)
    evidence = sorted(c.evidence_s for c in hangs if c.evidence_s is not None)
    single = [c for c in hangs if c.kind in SINGLE]
    torch = [c for c in cases if c.source == "real_torch"]
    torch_single = [c for c in torch if c.kind in SINGLE]
    torch_times = sorted(c.hung_after_s for c in torch if c.hung_after_s is not None)

    def pct(share: float) -> float:
        return round(100 * share, 3)

    return {
        "hangs": len(hangs),
        "controls": len(controls),
        "real_torch_cases": len(torch),
        "simulated_rank_cases": len(cases) - len(torch),
        "hung_after_last_step_s_p50": round(statistics.median(times), 2) if times else None,
        "hung_after_last_step_s_p95": round(times[int(0.95 * (len(times) - 1))], 2)
        if times
        else None,
        "deadline_floor_s": floor,
        "hangs_called": len(times),
        "evidence_s_p95": round(evidence[int(0.95 * (len(evidence) - 1))], 3) if evidence else None,
        "evidence_cases": len(evidence),
        "localised_share": round(sum(map(right_culprit, single)) / len(single), 3)
        if single
        else None,
        "false_hangs": sum(bool(c.seen & {"hung", "failed"}) for c in controls),
        "false_hangs_after_last_step": sum(map(hung_while_ending, controls)),
        "false_culprits": sum(map(false_culprit, cases)),
        "report_step_us_median": round(cost * 1e6, 1),
        "healthy_step_overhead_pct": pct(cost / 1.0),
        "healthy_step_overhead_pct_at_0_1s_steps": pct(cost / STEP_S),
        "by_kind": tally(cases),
        "cases_by_source": {
            source: tally([c for c in cases if c.source == source])
            for source in ("real_torch", "simulated")
        },
        "real_torch_localised": f"{sum(map(right_culprit, torch_single))}/{len(torch_single)}",
        "real_torch_hung_after_last_step_s": [round(t, 2) for t in torch_times],
        "real_torch_control_step_s_median": {
            kind: round(statistics.median(c.step_time_s for c in torch if c.kind == kind), 3)
            for kind in TORCH_CONTROLS
            if any(c.kind == kind for c in torch)
        },
        "machine": f"{os.cpu_count()} cpus, python {sys.version.split()[0]}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of every case kind")
    parser.add_argument("--floor", type=float, default=3.0, help="hang_floor_s for the run")
    parser.add_argument(
        "--torch-rounds", type=int, default=1, help="rounds of the real torch cases (0: none)"
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
