"""Hung and failed jobs: how soon fleetwatch says so, and whom it names.

Run from the repository root: ``.venv/bin/python bench/hang.py [--rounds N] [--floor S]``.
The last line of output is one JSON object (the project's benchmark contract).

What runs, all real but the hardware: a collector (``CollectorService``, built-in rules, rules
every 0.1 s) and two agents (``SimCluster``, polls every 0.2 s, their real job sockets and their
real watch on ``/proc``), in this process. Each case is one job of 4 rank processes, 2 on each
agent: small Python processes that report each step through ``fleetwatch.jobclient``. They are
*simulated* ranks, not torch: a step is 0.1 s of sleep, and the step's collective is this
script, which tells every rank to start the next step only once all reported the last (a rank
that never reports holds every other rank, as a wedged NCCL collective does). Real torch gloo
jobs are in ``tests/integration/test_job_hangs.py`` (``real_torch_cases`` is 0 here).

Hangs (one rank, chosen in turn, unless said):

* ``stop``: SIGSTOP (expect ``hung``, that rank named);
* ``kill``: SIGKILL (expect ``failed``, that rank named);
* ``raise``: an uncaught exception in that rank (expect ``failed``, that rank named);
* ``sleep``: the rank sleeps before its collective (expect ``hung``, that rank named: it waits
  in ``hrtimer_nanosleep`` while the others wait in the collective, here a pipe read);
* ``desync``: the rank enters another collective (a broadcast) while the others enter the
  step's all-reduce, and waits where they wait (the same pipe read, the same simulated stack):
  only its Flight Recorder tells it apart (expect ``hung``, that rank named). Each simulated
  rank serves a simulated Flight Recorder in torch's JSON format through
  ``fleetwatch.jobclient.serve_flight_recorder``, over the real channel to its agent;
* ``stall``: every rank waits in the same place outside the collective (a data loader; expect
  ``hung`` and nobody named).

Controls, which must never be ``hung`` or ``failed`` nor name anyone: ``end`` (the job ends
normally), ``slow`` (steps of 1 s, steady), ``checkpoint`` (rank 0 announces a checkpoint, then
no step for twice the deadline) and ``agent_restart`` (one agent is killed and started again
mid-job).

The deadline floor is ``--floor`` (3 s, not the default 30 s, so that a case takes seconds):
the time to ``hung`` measured after the last step is the floor plus the detection latency, and
at the default floor it would be 27 s more. Figures: ``hung_after_last_step_s_p50``/``p95``
(hang cases that were called hung or failed), ``localised_share`` (single-culprit cases whose
first culprit is the right rank and node), ``false_hangs`` (controls ever hung or failed),
``false_culprits`` (a culprit other than the case's rank, or any in a ``stall`` or control),
``healthy_step_overhead_pct`` (the median cost of one ``report_step`` to a real agent over a
1 s step, and over the 0.1 s steps here). ``evidence_s_p95``: how long the collector took to
gather the dumps of a hung case's ranks (real py-spy when this runs as root, ``stacks`` says
which; a stopped rank's Flight Recorder costs its 1 s timeout); and
``evidence_8_ranks_one_node_s_*``: one agent dumping an 8-rank job's ranks on demand, 5 times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
    hung_after_s: float | None = None
    culprits: list[str] = field(default_factory=list)
    evidence_s: float | None = None  # how long gathering the ranks' dumps took


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


def job_view(service: CollectorService, job: str) -> dict[str, Any]:
    return next((j for j in service.jobs.summaries() if j["id"] == job), {})


async def watch(service: CollectorService, case: Case, seconds: float, *, until: set[str]) -> None:
    """Look at the job every 0.1 s for ``seconds`` or until it is in one of ``until``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        view = job_view(service, case.job)
        state = view.get("state", "")
        case.seen.add(state)
        if view.get("culprits"):
            case.culprits = list(view["culprits"])
        if state in until:
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
                print(
                    f"{case.job}: seen {sorted(s for s in case.seen if s)}, "
                    f"after {case.hung_after_s}, evidence {case.evidence_s}, "
                    f"culprits {case.culprits[:1]}",
                    flush=True,
                )
        cost = await report_cost(cluster.job_sockets)
        eight = await eight_ranks_of_a_node(service, cluster)
    finally:
        await cluster.stop()
        await service.stop(grace=0)
    return figures(cases, cost, args.floor) | {
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
    if case.kind in HANGS:
        return EXPECTED[case.kind] in case.seen
    wrong = bool(case.seen & {"hung", "failed"})
    return not wrong and EXPECTED_CONTROL.get(case.kind, "running") in case.seen


def false_culprit(case: Case) -> bool:
    if case.kind in CONTROLS or case.kind == "stall":
        return bool(case.culprits)
    return bool(case.culprits) and not right_culprit(case)


def figures(cases: list[Case], cost: float, floor: float) -> dict[str, Any]:
    hangs = [c for c in cases if c.kind in HANGS]
    controls = [c for c in cases if c.kind in CONTROLS]
    times = sorted(c.hung_after_s for c in hangs if c.hung_after_s is not None)
    evidence = sorted(c.evidence_s for c in hangs if c.evidence_s is not None)
    single = [c for c in hangs if c.kind in SINGLE]
    by_kind = {
        kind: {
            "cases": sum(c.kind == kind for c in cases),
            "called_as_expected": sum(c.kind == kind and as_expected(c) for c in cases),
            "culprit_as_expected": sum(
                c.kind == kind and (right_culprit(c) if kind in SINGLE else not c.culprits)
                for c in cases
            ),
        }
        for kind in HANGS + CONTROLS
    }

    def pct(share: float) -> float:
        return round(100 * share, 3)

    return {
        "hangs": len(hangs),
        "controls": len(controls),
        "real_torch_cases": 0,
        "simulated_rank_cases": len(cases),
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
        "false_culprits": sum(map(false_culprit, cases)),
        "report_step_us_median": round(cost * 1e6, 1),
        "healthy_step_overhead_pct": pct(cost / 1.0),
        "healthy_step_overhead_pct_at_0_1s_steps": pct(cost / STEP_S),
        "by_kind": by_kind,
        "machine": f"{os.cpu_count()} cpus, python {sys.version.split()[0]}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds of every case kind")
    parser.add_argument("--floor", type=float, default=3.0, help="hang_floor_s for the run")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
