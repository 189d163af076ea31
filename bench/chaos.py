"""Chaos: events injected into 64 nodes while their agents and the collector are killed and cut off.

Run from the repository root: ``.venv/bin/python bench/chaos.py [--seeds 7,8,9] [--agents 64]``.
Each seed is a run of its own (a fresh collector, journal and agents; its kills, partitions and
faults drawn from the seed). The last line of output is one JSON object (see the project's
benchmark contract): the figures summed over the seeds, and each seed's own under ``per_seed``.
The exit status is 1 when any seed lost, duplicated or left missing anything, or did not finish:
no run can look green with a hole in it.

What runs, all on loopback and all real but the hardware:

* the collector, ``fleetwatch collector --config FILE`` with the built-in rules and a SQLite
  journal, its actions wired to a signed drain webhook and a signed ``default`` notify channel
  served by :class:`cli.dev.webhook_receiver.WebhookReceiver` in this process;
* one process per node (``bench/helpers/chaos_node.py``): the real agent with its disk spool and
  kernel log cursor, on a simulated node whose kernel log is a file that this process appends to;
* a relay between every agent and the collector (``bench/helpers/chaos_net.py``) that can cut
  nodes off.

With ``--journal postgres`` the journal is one PostgreSQL database on a server of its own
(``bench/helpers/chaos_journal.py``, durable), shared by ``--collectors`` collector processes
(2); each node streams to one of them. The database server is itself taken down during the run,
``--db-kills`` times with SIGKILL and ``--db-restarts`` times with a clean stop, and started
again on the same data a few seconds later. A collector that ends on its own (one started while
the database is down cannot open its journal) is started again a second later, as systemd would,
and counted (``collector_exits``).

For ``--duration`` seconds (per seed) this process appends Xid lines to the nodes' kernel logs,
each with a unique marker, at ``--rate`` a second (application Xids, which the built-in rules
answer with a notification per GPU incident; and one Xid 61 per node at a random moment, which
the rules answer with a drain and a notification). Meanwhile it kills a collector with SIGKILL
``--collector-kills`` times and starts it again, kills an agent with SIGKILL ``--agent-kills``
times and starts it again on the same spool (the same boot), and cuts groups of nodes off for a
few seconds ``--partitions`` times. Then it lets everything run undisturbed until every marker is
in the journal or nothing has come in for ``--settle`` seconds, stops the collectors and reads
the journal.

Figures: ``events_lost`` (markers injected but not journaled) and ``events_duplicated`` (journal
rows beyond one per marker); ``actions_duplicated``: actions carried out twice for one fault,
i.e. a second incident (a second idempotency key) of the same rule and target, or a second drain
of one node; ``actions_redelivered``: webhook requests repeated with the same idempotency key
(safe by contract: a receiver de-duplicates them); ``actions_missing``: faults whose action
never came. Kills, partitions and restarts are seeded (``--seeds``, or ``--seed`` for one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from agent.sim.devices import H100_BUSES, SimGpu
from agent.sim.kmsg_file import KmsgFileWriter
from cli.dev.webhook_receiver import WebhookReceiver
from fleetwatch.clock import SystemClock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for bench.*
from bench.helpers.chaos_journal import ChaosJournal, PostgresJournal, SqliteJournal
from bench.helpers.chaos_net import PartitionRelay
from bench.helpers.collector_config import webhook_actions_toml

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[1]

CHAOS_NODE: Final = Path(__file__).resolve().parent / "helpers" / "chaos_node.py"
SECRET: Final = b"chaos-bench-webhook-secret"
GPUS_PER_NODE: Final = 8
APP_XIDS: Final = (13, 31, 43, 45, 68, 69)  # class "application": notify per GPU incident
DRAIN_XID: Final = 61  # CONTACT_SUPPORT: xid_needs_reboot_or_rma drains the node
MARKER: Final = re.compile(r"chaos-event-(\d+)")
# Rules whose incidents come from the network, not from injected faults: a node cut off twice is
# two incidents, rightly.
NETWORK_RULES: Final = frozenset({"node_unreachable"})
PR_SET_PDEATHSIG: Final = 1
DEFAULT_SEEDS: Final = [7, 8, 9]
SHARED_SEED_OFFSET: Final = 1_000_003
DB_DOWN_S: Final = (0.5, 4.0)  # how long the database stays down each time
# A seed fails when any of these is not 0.
BAD_KEYS: Final = ("events_lost", "events_duplicated", "actions_duplicated", "actions_missing")
# Summed over the seeds in the last line.
SUMMED_KEYS: Final = (
    "collector_kills",
    "agent_kills",
    "partitions",
    "events_injected",
    "events_journaled",
    *BAD_KEYS,
    "actions_redelivered",
    "drains_expected",
    "drain_requests",
    "notifications",
    "collector_starts",
    "collector_exits",
)
# Summed too when the seeds have them (a PostgreSQL run).
SUMMED_IF_PRESENT: Final = ("db_kills", "db_clean_restarts")

Target = str | frozenset[str] | None  # what a disturbance acts on: a node, nodes, the collector


def say(*parts: object) -> None:
    print(*parts, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def kernel_bus_id(gpu: int) -> str:
    """The bus id the simulated node's GPU ``gpu`` has in kernel log lines."""
    bus = H100_BUSES[gpu % len(H100_BUSES)] + gpu // len(H100_BUSES)
    return SimGpu(index=gpu, uuid="", bus=bus, nvlink_up=[]).kernel_bus_id


# ---- processes --------------------------------------------------------------------------------


class Child:
    """A process this benchmark kills and starts again; its output appends to one log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0

    def start(self) -> None:
        """Start the process (again), its output appended to its log."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and scripts
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - no locks are taken before exec
            )
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a power cut would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self.kills += 1

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def running(self) -> bool:
        """Whether the process is alive."""
        return self.proc is not None and self.proc.poll() is None


def write_collector_config(  # noqa: PLR0913 - one collector's whole config
    workdir: Path, name: str, receiver_url: str, *, port: int, nodes: int, journal: ChaosJournal
) -> Path:
    secret_file = workdir / "webhook.secret"
    secret_file.write_bytes(SECRET + b"\n")
    path = workdir / f"{name}.toml"
    path.write_text(
        f"""\
[collector]
listen = "127.0.0.1:{port}"
http = "127.0.0.1:{free_port()}"
{journal.config_lines(name)}
# Every node is drained once by the design of the run: lift the caps that would hold drains
# back (they are tested elsewhere), keep the per-node cooldown that stops a second drain.
{
            webhook_actions_toml(
                receiver_url,
                secret_file,
                max_drained_nodes=nodes * 2,
                breaker_max_drains=nodes * 10,
            )
        }""",
    )
    return path


def wait_port(port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


# ---- what was injected, and what came of it --------------------------------------------------


@dataclass(slots=True)
class Injected:
    """Every marker written, per node, and the faults that should have drawn an action."""

    markers: dict[int, str] = field(default_factory=dict)  # marker -> node
    drain_nodes: set[str] = field(default_factory=set)
    app_targets: set[tuple[str, int]] = field(default_factory=set)  # (node, gpu)


class Injector:
    """Appends Xid lines with unique markers to the nodes' kernel log files."""

    def __init__(self, dirs: dict[str, Path], rng: random.Random) -> None:
        self._writers = {node: KmsgFileWriter(d / "kmsg") for node, d in dirs.items()}
        self._rng = rng
        # each node walks through its (GPU, Xid) pairs in turn, so the same Xid on the same GPU
        # comes back only after every other pair: what the agent would rightly merge as a storm
        # of one fault never happens by accident
        pairs = [(g, x) for g in range(GPUS_PER_NODE) for x in APP_XIDS]
        self._cycle = {node: rng.sample(pairs, len(pairs)) for node in dirs}
        self._next = dict.fromkeys(dirs, 0)
        self.injected = Injected()
        self._marker = 0

    def _write(self, node: str, gpu: int, xid: int, text: str) -> None:
        self._marker += 1
        line = (
            f"NVRM: Xid (PCI:{kernel_bus_id(gpu)}): {xid}, pid=4242, name=python3, "
            f"{text} chaos-event-{self._marker}"
        )
        self._writers[node].write(line)
        self.injected.markers[self._marker] = node

    def app_xid(self) -> None:
        """An application Xid on a random node, on its next (GPU, Xid) pair."""
        node = self._rng.choice(list(self._writers))
        i = self._next[node]
        gpu, xid = self._cycle[node][i % len(self._cycle[node])]
        self._next[node] = i + 1
        self._write(node, gpu, xid, "Graphics Exception")
        self.injected.app_targets.add((node, gpu))

    def drain_xid(self, node: str) -> None:
        """The node's one Xid 61, on a random GPU."""
        gpu = self._rng.randrange(GPUS_PER_NODE)
        self._write(node, gpu, DRAIN_XID, "PMU breakpoint")
        self.injected.drain_nodes.add(node)


@dataclass(slots=True)
class ActionFigures:
    """What became of the actions (see the module's docstring)."""

    duplicated: int
    redelivered: int
    missing: int
    drains: int
    notifications: int
    duplicates_seen: list[str]
    missing_seen: list[str]


def action_figures(receiver: WebhookReceiver, injected: Injected) -> ActionFigures:
    """What the webhooks show: a second incident for one fault is a duplicated action."""
    drains_by_node: defaultdict[str, set[str]] = defaultdict(set)
    incidents_by_fault: defaultdict[tuple[str, str, str], set[str]] = defaultdict(set)
    notified: set[tuple[str, str]] = set()  # (node, target) of notifications
    drains = notifications = 0
    for d in receiver.deliveries():
        payload = d.body.get("payload") or {}
        kind = d.body.get("kind")
        if kind == "drain_request":
            drains += 1
            drains_by_node[str(payload.get("node"))].add(d.idempotency_key)
        elif kind == "notification":
            notifications += 1
            rule = str(payload.get("rule"))
            if rule in NETWORK_RULES:
                continue
            fault = (rule, str(payload.get("node")), str(payload.get("target")))
            incidents_by_fault[fault].add(str(payload.get("incident")))
            notified.add((str(payload.get("node")), str(payload.get("target"))))
    seen: list[str] = []
    duplicated = 0
    for node, keys in drains_by_node.items():
        if len(keys) > 1:
            duplicated += len(keys) - 1
            seen.append(f"drain {node}: {sorted(keys)}")
    for (rule, node, target), incidents in incidents_by_fault.items():
        if len(incidents) > 1:
            duplicated += len(incidents) - 1
            seen.append(f"{rule} {node} {target}: incidents {sorted(incidents)}")
    missing_seen = [f"drain {node}" for node in injected.drain_nodes if node not in drains_by_node]
    missing_seen += [
        f"notification {node}/gpu/{gpu}"
        for node, gpu in sorted(injected.app_targets)
        if (node, f"{node}/gpu/{gpu}") not in notified
    ]
    missing = len(missing_seen)
    return ActionFigures(
        duplicated=duplicated,
        redelivered=receiver.duplicates,
        missing=missing,
        drains=drains,
        notifications=notifications,
        duplicates_seen=seen,
        missing_seen=missing_seen,
    )


# ---- the run ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """When each disturbance happens, in seconds from the start of the chaos phase."""

    collector_kills: list[float]
    agent_kills: list[tuple[float, str]]
    partitions: list[tuple[float, float, frozenset[str]]]  # start, length, nodes
    drains: list[tuple[float, str]]


def spread(rng: random.Random, count: int, duration: float, min_gap: float) -> list[float]:
    """``count`` random moments in ``[0, duration)``, at least ``min_gap`` apart where possible."""
    if count <= 0:
        return []
    slot = duration / count
    gap = min(min_gap, slot)
    return [i * slot + rng.uniform(0, slot - gap) for i in range(count)]


def make_plan(args: argparse.Namespace, nodes: list[str], rng: random.Random) -> Plan:
    kills = spread(rng, args.collector_kills, args.duration, 1.5)
    agent_kills = [
        (t, rng.choice(nodes)) for t in spread(rng, args.agent_kills, args.duration, 0.5)
    ]
    parts = [
        (
            t,
            rng.uniform(2.0, 12.0),
            frozenset(rng.sample(nodes, min(len(nodes), args.partition_size))),
        )
        for t in spread(rng, args.partitions, args.duration * 0.9, 1.0)
    ]
    drains = [(rng.uniform(0, args.duration * 0.9), node) for node in nodes]
    return Plan(kills, agent_kills, parts, sorted(drains))


class Run:
    """The processes of one run, and what was done to them."""

    def __init__(self, args: argparse.Namespace, seed: int, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.rng = random.Random(seed)
        # what a SQLite run does not draw (which collector, the database's restarts) comes from
        # a generator of its own, so a seed's SQLite run is the same as before these existed
        self.rng_shared = random.Random(seed + SHARED_SEED_OFFSET)
        self.nodes = [f"node-{i:03d}" for i in range(1, args.agents + 1)]
        self.receiver = WebhookReceiver(clock=SystemClock(), secret=SECRET)
        self.receiver.start()
        self.journal: ChaosJournal
        if args.journal == "postgres":
            self.journal = PostgresJournal()
            names = [f"c{i}" for i in range(1, args.collectors + 1)]
        else:
            self.journal = SqliteJournal(workdir / "journal.db")
            names = ["collector"]
        fleetwatch = str(Path(sys.executable).parent / "fleetwatch")
        self.ports: dict[str, int] = {}
        self.collectors: list[Child] = []
        self.relays: list[PartitionRelay] = []
        for name in names:
            port = self.ports[name] = free_port()
            cfg = write_collector_config(
                workdir,
                name,
                self.receiver.url,
                port=port,
                nodes=len(self.nodes),
                journal=self.journal,
            )
            argv = [fleetwatch, "collector", "--config", str(cfg)]
            self.collectors.append(Child(name, argv, workdir / f"{name}.log"))
            self.relays.append(PartitionRelay(port))
        self.dirs = {node: workdir / node for node in self.nodes}
        self.agents: dict[str, Child] = {}
        for i, (node, d) in enumerate(self.dirs.items()):
            d.mkdir()
            port = self.relays[i % len(self.relays)].add(node)  # each node has one collector
            argv = [
                sys.executable,
                str(CHAOS_NODE),
                "--node",
                node,
                "--dir",
                str(d),
                "--collector",
                f"127.0.0.1:{port}",
            ]
            self.agents[node] = Child(node, argv, d / "agent.log")
        self.injector = Injector(self.dirs, self.rng)
        self.lock = threading.Lock()  # the injector's writers and the restarts
        self.collector_kills = 0
        self.collector_exits = 0  # collectors that ended on their own (restarted, as systemd does)
        self.agent_kills = 0
        self.partitions = 0
        self._restarts: list[tuple[float, Callable[[], None], str]] = []

    def start(self) -> None:
        """The collectors, then the agents, a little apart."""
        for collector in self.collectors:
            collector.start()
            if not wait_port(self.ports[collector.name], 60):
                msg = f"{collector.name} did not listen within 60 s; see {collector.log_path}"
                raise RuntimeError(msg)
        for agent in self.agents.values():
            agent.start()
            time.sleep(0.05)

    def connected(self) -> int:
        """Nodes the journal knows (each said Hello at least once)."""
        return self.journal.nodes()

    def _timeline(self) -> list[tuple[float, str, Target]]:
        plan = make_plan(self.args, self.nodes, self.rng)
        timeline: list[tuple[float, str, Target]] = []
        timeline += [(t, "kill_collector", None) for t in plan.collector_kills]
        timeline += [(t, "kill_agent", node) for t, node in plan.agent_kills]
        for t, length, nodes in plan.partitions:
            timeline += [(t, "partition", nodes), (t + length, "heal", nodes)]
        timeline += [(t, "drain_xid", node) for t, node in plan.drains]
        if isinstance(self.journal, PostgresJournal):
            downs = ["kill_db"] * self.args.db_kills + ["stop_db"] * self.args.db_restarts
            self.rng_shared.shuffle(downs)
            moments = spread(self.rng_shared, len(downs), self.args.duration * 0.8, 3.0)
            timeline += [(t, what, None) for t, what in zip(moments, downs, strict=True)]
        timeline.sort(key=lambda item: item[0])
        return timeline

    def chaos(self) -> None:
        """The disturbed phase: inject throughout, kill and cut off on the plan."""
        timeline = self._timeline()
        began = time.monotonic()
        interval = 1.0 / self.args.rate
        next_inject = began
        i = 0
        while (now := time.monotonic()) - began < self.args.duration:
            while i < len(timeline) and timeline[i][0] <= now - began:
                self._disturb(timeline[i][1], timeline[i][2], now)
                i += 1
            self._run_restarts(now)
            while next_inject <= now:
                self.injector.app_xid()
                next_inject += interval
            time.sleep(min(0.02, max(0.0, next_inject - time.monotonic())))
        self._run_restarts(float("inf"))
        for relay in self.relays:
            relay.heal(set(self.nodes))

    def _run_restarts(self, now: float) -> None:
        """Start what is due again, and collectors that ended on their own.

        A collector cannot start while its database is down: systemd would start it again a
        second later, and so does this.
        """
        for item in [r for r in self._restarts if r[0] <= now]:
            self._restarts.remove(item)
            item[1]()
        pending = {what for _, _, what in self._restarts}
        for collector in self.collectors:
            if not collector.running() and collector.name not in pending:
                self.collector_exits += 1
                self._restarts.append(
                    (time.monotonic() + 1.0, self._starter(collector), collector.name)
                )

    @staticmethod
    def _starter(child: Child) -> Callable[[], None]:
        def start() -> None:
            if not child.running():
                child.start()

        return start

    def _disturb(self, what: str, arg: Target, now: float) -> None:
        if what == "kill_collector":
            several = len(self.collectors) > 1
            collector = self.rng_shared.choice(self.collectors) if several else self.collectors[0]
            if not collector.running():
                return  # still down from the kill before (it comes back on its own)
            collector.kill()
            self.collector_kills += 1
            back = now + self.rng.uniform(0.0, 1.0)
            self._restarts.append((back, self._starter(collector), collector.name))
        elif what == "kill_agent" and isinstance(arg, str):
            agent = self.agents[arg]
            if agent.running():
                agent.kill()
                self.agent_kills += 1
                back = now + self.rng.uniform(0.2, 2.0)
                self._restarts.append((back, self._starter(agent), agent.name))
        elif what in ("partition", "heal") and isinstance(arg, frozenset):
            for relay in self.relays:
                (relay.partition if what == "partition" else relay.heal)(set(arg))
            self.partitions += what == "partition"
        elif what == "drain_xid" and isinstance(arg, str):
            self.injector.drain_xid(arg)
        elif what in ("kill_db", "stop_db"):
            self._take_db_down(killed=what == "kill_db", now=now)

    def _take_db_down(self, *, killed: bool, now: float) -> None:
        """SIGKILL or cleanly stop the database; it comes back a few seconds later."""
        db = self.journal
        if not isinstance(db, PostgresJournal) or not db.up:
            return
        if killed:
            db.kill()
        else:
            db.shut_down()
        down_s = self.rng_shared.uniform(*DB_DOWN_S)
        self._restarts.append((now + down_s, db.bring_back, "database"))

    def settle(self) -> float:
        """Run undisturbed until every marker is journaled, or nothing new for ``--settle`` s."""
        self._run_restarts(float("inf"))
        for agent in self.agents.values():
            if not agent.running():
                agent.start()
        want = len(self.injector.injected.markers)
        began = last_change = time.monotonic()
        last = -1
        while time.monotonic() - last_change < self.args.settle:
            self._run_restarts(time.monotonic())
            got = len(self.journal.markers())
            if got != last:
                last, last_change = got, time.monotonic()
            if got >= want:
                break
            time.sleep(1.0)
        # the actions of the last faults: wait until the webhooks have been quiet a while
        quiet_since, count = time.monotonic(), len(self.receiver.deliveries())
        while time.monotonic() - quiet_since < self.args.quiet:
            time.sleep(0.5)
            now_count = len(self.receiver.deliveries())
            if now_count != count:
                count, quiet_since = now_count, time.monotonic()
        return time.monotonic() - began

    def stop(self) -> None:
        """Stop every process (agents first, all at once), the relays, receiver and database."""
        for agent in self.agents.values():
            if agent.proc is not None and agent.running():
                agent.proc.terminate()
        for agent in self.agents.values():
            agent.stop()
        for collector in self.collectors:
            collector.stop()
        for relay in self.relays:
            relay.stop()
        self.receiver.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--duration", type=float, default=100.0, help="chaos phase per seed, s")
    parser.add_argument("--rate", type=float, default=20.0, help="Xid lines injected per second")
    parser.add_argument("--collector-kills", type=int, default=20, help="per seed")
    parser.add_argument("--agent-kills", type=int, default=8, help="per seed")
    parser.add_argument("--partitions", type=int, default=5, help="per seed")
    parser.add_argument("--partition-size", type=int, default=8, help="nodes cut off at once")
    parser.add_argument("--settle", type=float, default=45.0, help="give up after this long idle")
    parser.add_argument("--quiet", type=float, default=10.0, help="webhooks quiet this long")
    parser.add_argument(
        "--seeds",
        type=_seeds,
        default=DEFAULT_SEEDS,
        help="comma-separated seeds, one run each (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, help="one seed only (same as --seeds N)")
    parser.add_argument(
        "--journal",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="sqlite: one collector's file; postgres: a server of its own, shared by collectors",
    )
    parser.add_argument("--collectors", type=int, default=2, help="with --journal postgres")
    parser.add_argument("--db-kills", type=int, default=3, help="postgres SIGKILLs per seed")
    parser.add_argument("--db-restarts", type=int, default=3, help="clean restarts per seed")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    args = parser.parse_args(argv)
    if args.seed is not None:
        args.seeds = [args.seed]
    return args


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        msg = f"--seeds wants comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds names no seed")
    return seeds


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One chaos run with ``seed``: its figures (see the module's docstring)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"fleetwatch-chaos-{seed}-"))
    say(f"seed {seed}: {args.agents} agents, {args.duration:g} s, work directory {workdir}")
    run = Run(args, seed, workdir)
    began = time.monotonic()
    result: dict[str, Any] = {"seed": seed}
    try:
        run.start()
        deadline = time.monotonic() + 120
        while run.connected() < args.agents and time.monotonic() < deadline:
            time.sleep(0.5)
        say(f"{run.connected()} nodes connected after {time.monotonic() - began:.1f} s")
        run.chaos()
        say(
            f"chaos phase over: {run.collector_kills} collector kills, {run.agent_kills} agent "
            f"kills, {run.partitions} partitions, {len(run.injector.injected.markers)} events"
        )
        settle_s = run.settle()
        counts = run.journal.markers()
        injected = run.injector.injected
        lost = [m for m in injected.markers if counts[m] == 0]
        duplicated = sum(n - 1 for n in counts.values() if n > 1)
        actions = action_figures(run.receiver, injected)
        for line in actions.duplicates_seen[:20]:
            say("duplicated action:", line)
        for line in actions.missing_seen[:20]:
            say("missing action:", line)
        if lost:
            by_node = Counter(injected.markers[m] for m in lost)
            say("lost events by node:", dict(by_node.most_common(10)), "first:", lost[:10])
        result |= {
            "collector_kills": run.collector_kills,
            "agent_kills": run.agent_kills,
            "partitions": run.partitions,
            "events_injected": len(injected.markers),
            "events_journaled": sum(1 for m in injected.markers if counts[m] > 0),
            "events_lost": len(lost),
            "events_duplicated": duplicated,
            "actions_duplicated": actions.duplicated,
            "actions_redelivered": actions.redelivered,
            "actions_missing": actions.missing,
            "drains_expected": len(injected.drain_nodes),
            "drain_requests": actions.drains,
            "notifications": actions.notifications,
            "collector_starts": sum(c.starts for c in run.collectors),
            "collector_exits": run.collector_exits,
            "journal": run.journal.kind,
            **(
                {"db_kills": run.journal.kills, "db_clean_restarts": run.journal.restarts}
                if isinstance(run.journal, PostgresJournal)
                else {}
            ),
            "settle_s": round(settle_s, 1),
            "wall_s": round(time.monotonic() - began, 1),
        }
    finally:
        run.stop()
        run.journal.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    say(json.dumps(result, sort_keys=True))
    return result


def failures(result: dict[str, Any]) -> int:
    """What a seed lost, duplicated or left missing (a seed that did not finish counts as 1)."""
    if "events_lost" not in result:
        return 1
    return sum(int(result[key]) for key in BAD_KEYS)


def totals(args: argparse.Namespace, per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """The last line: sums over the seeds, and each seed's figures."""
    out: dict[str, Any] = {
        "agents": args.agents,
        "seeds": [r["seed"] for r in per_seed],
        "per_seed": per_seed,
        "cpus": os.cpu_count(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }
    finished = [r for r in per_seed if "events_lost" in r]
    for key in SUMMED_KEYS:
        out[key] = sum(int(r[key]) for r in finished) if finished else None
    for key in SUMMED_IF_PRESENT:
        if any(key in r for r in finished):
            out[key] = sum(int(r.get(key, 0)) for r in finished)
    if finished:
        out["journal"] = finished[0]["journal"]
    if len(finished) < len(per_seed):
        out["why"] = "; ".join(
            f"seed {r['seed']}: {r.get('error', 'did not finish')}"
            for r in per_seed
            if "events_lost" not in r
        )
    out["seeds_failed"] = sum(1 for r in per_seed if failures(r))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    per_seed: list[dict[str, Any]] = []
    for seed in args.seeds:
        try:
            per_seed.append(run_seed(args, seed))
        except Exception as exc:  # noqa: BLE001 - one seed's failure is reported, not raised
            say(f"seed {seed} failed: {type(exc).__name__}: {exc}")
            per_seed.append({"seed": seed, "error": f"{type(exc).__name__}: {exc}"})
    result = totals(args, per_seed)
    result["wall_s"] = round(time.monotonic() - began, 1)
    print(json.dumps(result, sort_keys=True), flush=True)
    return 1 if result["seeds_failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
