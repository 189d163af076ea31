"""A real Slurm cluster on loopback for tests: munged, slurmctld and one slurmd, in a temp dir.

``slurm_cluster()`` writes a slurm.conf, starts the three daemons as child processes with
``SLURM_CONF`` pointing at it, waits until every node is IDLE and, on exit, stops them and removes
the directory. Tests talk to it with the real ``scontrol`` and ``SLURM_CONF=cluster.conf``.

What it takes to run Slurm here (Debian 12, Slurm 22.05, MUNGE 0.5.15; a container or VM with no
systemd, running as root) and the pitfalls met on the way:

- Packages: ``slurm-wlm`` and ``munge`` (``scripts/ensure-test-deps.sh``, which
  ``ensure_slurm_installed`` runs as root when a command is missing). Their postinst scripts try
  to start system services; without systemd that fails harmlessly, and nothing here uses them.
- MUNGE: our own ``munged -F`` on its own socket, key, pid and seed file in the temp dir, so the
  system daemon (running or not) and /etc/munge/munge.key never matter. munged refuses a socket
  whose directory is not executable by everyone ("Socket is inaccessible: execute permissions for
  all required"), which rules out pytest's ``tmp_path`` (under /tmp/pytest-of-root, mode 0700):
  the temp dir is a ``mkdtemp`` of our own, chmod 0755. With ``-F`` munged logs to stderr and
  ignores ``--log-file``. ``AuthInfo=socket=...`` points the daemons and every client command at
  that socket; cred/munge reads the same option.
- Ports: ``SlurmctldPort`` and ``SlurmdPort`` are free loopback ports picked at start, so tests
  never meet a system Slurm or another test run.
- ``SlurmctldHost=localhost`` is accepted whatever the machine's host name is.
- No cgroups: ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``,
  ``JobAcctGatherType=jobacct_gather/none`` keep slurmd away from the cgroup plugins (cgroup/v1
  or v2 setups differ between CI machines; linuxproc needs none).
- ``SlurmdParameters=config_overrides``: the nodes declare 1 CPU and 100 MB whatever the machine
  has, so slurmctld never drains a node for "Low socket*core*thread count" on a small CI box.
- ``MailProg=/bin/true`` silences "Configured MailProg is invalid" (no mail package installed).
  Both daemons still log "mpi/pmix_v4: can not load PMIx library" whatever MpiDefault says: the
  Debian build ships the pmix plugin without the library it needs; harmless.
- Only ``node-01`` has a slurmd (``slurmd -D -N node-01``; Debian's Slurm is not built with
  --enable-multiple-slurmd). The spare nodes share its address and port, so that slurmd answers
  slurmctld's pings for them too and they come up IDLE like a real node: drain and resume work on
  them. They run no jobs. Right after a RESUME a node reads ``IDLE+NOT_RESPONDING`` until the
  next ping (well under a second): wait for the state, do not assert it at once.
- ``scontrol show node`` reports an unknown node on stdout ("Node x not found", exit 1), and
  ``scontrol update`` on stderr ("slurm_update error: Invalid node name specified").
- ``RebootProgram`` is ``reboot-program.sh`` in the temp dir: it appends one line (time, host,
  its arguments: slurmd passes none) to ``reboots.log`` and reboots nothing. ``scontrol reboot
  ASAP nextstate=DOWN reason=... NODE`` makes an idle node ``IDLE+DRAIN+REBOOT_REQUESTED``, and
  about a second later slurmd (node-01's, for a spare too) runs the program and the node reads
  ``DOWN+DRAIN+REBOOT_ISSUED`` with ``: reboot issued`` after the reason; a node running a job
  waits for it to end. Since nothing reboots, no node registers from a new boot: after
  ``ResumeTimeout`` (60 s here) slurmctld marks it DOWN, ``reboot timed out``. slurmctld logs
  ``reboot request queued for nodes NODE`` for each reboot it takes.
- ``salloc --no-shell`` allocates a node at once without starting any process on it: the cheap
  way to make a node ALLOCATED (and a drain of it DRAINING) without slurmstepd or cgroups.
- ``sbatch -w node-01 --wrap 'sleep 300'`` runs a real batch job there (slurmstepd starts it as
  root without cgroups). ``JobRequeue=1`` is Slurm's default, so a batch job reads
  ``Requeue=1`` unless submitted with ``--no-requeue``; ``scontrol requeuehold`` then shows it
  ``COMPLETING`` with ``Reason=job_requeued_in_held_state`` (and ``Restarts=1``) while its step
  ends, then ``PENDING``. Once released it stays ``PENDING``, ``Reason=BeginTime``, for about two
  minutes: Slurm starts a requeued batch job no sooner. ``ExcNodeList`` can be changed only while
  a job is pending ("Job is no longer pending execution" for a running one). A salloc
  allocation (``BatchFlag=0``) cannot be requeued ("Only batch jobs are accepted").
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from collector.actions.slurm import SlurmNodeState, parse_node_line
from collector.actions.slurm_requeue import SlurmJobState, parse_job_record
from fleetwatch.testing import free_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

COMMANDS = ("slurmctld", "slurmd", "scontrol", "salloc", "sbatch", "scancel", "munged")
INSTALL_HINT = (
    "install them with `sudo apt-get install -y --no-install-recommends slurm-wlm munge` "
    "(or run `sudo scripts/ensure-test-deps.sh`)"
)
REAL_NODE = "node-01"
_ENSURE_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ensure-test-deps.sh"
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
_GRANTED = re.compile(r"Granted job allocation (\d+)")
_SUBMITTED = re.compile(r"Submitted batch job (\d+)")
_STOP_TIMEOUT_S = 10.0
_LOG_TAIL_CHARS = 3000
# The RebootProgram slurmd runs for `scontrol reboot`, and the file it records each call in.
REBOOT_PROGRAM = "reboot-program.sh"
REBOOT_LOG = "reboots.log"
# How long slurmctld waits for a rebooted node to register again before it marks it DOWN.
RESUME_TIMEOUT_S = 60


class SlurmHarnessError(RuntimeError):
    """The Slurm test cluster could not be installed or started; the message says why."""


def missing_commands() -> list[str]:
    """Return the Slurm and MUNGE commands the harness needs that are not installed."""
    return [cmd for cmd in COMMANDS if shutil.which(cmd, path=_SEARCH_PATH) is None]


def ensure_slurm_installed() -> None:
    """Install slurm-wlm and munge when a command is missing and we are root; else explain.

    Raises:
        SlurmHarnessError: something is missing and cannot be installed from here.
    """
    missing = missing_commands()
    if not missing:
        return
    if os.geteuid() != 0:
        msg = f"Slurm tests need {', '.join(missing)}, which are not installed: {INSTALL_HINT}"
        raise SlurmHarnessError(msg)
    done = subprocess.run(
        ["/bin/sh", str(_ENSURE_SCRIPT)], capture_output=True, text=True, check=False
    )
    still = missing_commands()
    if done.returncode != 0 or still:
        msg = (
            f"installing slurm-wlm and munge failed (exit {done.returncode}), still missing "
            f"{', '.join(still) or 'nothing'}: {done.stderr.strip()[-_LOG_TAIL_CHARS:]}"
        )
        raise SlurmHarnessError(msg)


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path.name}: no output)"
    return f"--- {path.name} ---\n{text[-_LOG_TAIL_CHARS:]}"


@dataclass
class SlurmCluster:
    """A running test cluster: its directory, config and the names of its nodes.

    Attributes:
        root: the temp dir holding config, key, sockets, state and logs.
        conf: the slurm.conf; pass ``env`` to anything that runs Slurm commands.
        env: ``{"SLURM_CONF": str(conf)}``.
        real_node: the node with a slurmd (it can run jobs).
        spare_nodes: nodes without their own slurmd, IDLE at start; hand them out with
            ``take_spare`` so that each test gets a node no other test touched.
    """

    root: Path
    conf: Path
    env: dict[str, str]
    real_node: str
    spare_nodes: tuple[str, ...]
    _taken: set[str] = field(default_factory=set)

    def take_spare(self) -> str:
        """Return a spare node no caller got before."""
        for node in self.spare_nodes:
            if node not in self._taken:
                self._taken.add(node)
                return node
        msg = f"all {len(self.spare_nodes)} spare nodes are taken; start more"
        raise SlurmHarnessError(msg)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``scontrol``, ``salloc``...) against this cluster."""
        done = subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            env={**os.environ, **self.env, "PATH": _SEARCH_PATH},
            timeout=30,
            check=False,
        )
        if check and done.returncode != 0:
            msg = f"{' '.join(args)} failed (exit {done.returncode}): {done.stderr or done.stdout}"
            raise SlurmHarnessError(msg)
        return done

    def nodes(self) -> dict[str, SlurmNodeState]:
        """Return every node's state, read with ``scontrol show node -o``."""
        out = self.run("scontrol", "show", "node", "-o").stdout
        states = [parse_node_line(line) for line in out.splitlines() if line.strip()]
        return {state.name: state for state in states}

    def node(self, name: str) -> SlurmNodeState:
        """Return one node's state."""
        return parse_node_line(self.run("scontrol", "show", "node", "-o", name).stdout.strip())

    def wait_for(
        self,
        name: str,
        predicate: Callable[[SlurmNodeState], bool],
        timeout_s: float = 10.0,
    ) -> SlurmNodeState:
        """Poll a node until ``predicate`` holds; raise AssertionError with its last state."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.node(name)
            if predicate(state):
                return state
            if time.monotonic() > deadline:
                msg = f"node {name} did not reach the expected state in {timeout_s} s: {state}"
                raise AssertionError(msg)
            time.sleep(0.05)

    def allocate(self, node: str) -> str:
        """Allocate ``node`` to a job that runs nothing (``salloc --no-shell``); return its id."""
        done = self.run("salloc", "--no-shell", "-N1", "-w", node, "-J", "fleetwatch-test")
        granted = _GRANTED.search(done.stderr + done.stdout)
        if granted is None:
            msg = f"salloc printed no job id: {done.stderr or done.stdout}"
            raise SlurmHarnessError(msg)
        return granted.group(1)

    def submit(self, node: str | None, *options: str) -> str:
        """Run ``sleep 300`` as a batch job on ``node`` (None: where Slurm puts it; only
        ``real_node`` runs jobs, so exclude the spares) with sbatch ``options``; its id."""
        where = ("-w", node) if node is not None else ()
        done = self.run(
            "sbatch", *where, "-J", "fleetwatch-test", "-o", "/dev/null", *options,
            "--wrap", "sleep 300",
        )  # fmt: skip
        submitted = _SUBMITTED.search(done.stdout)
        if submitted is None:
            msg = f"sbatch printed no job id: {done.stdout or done.stderr}"
            raise SlurmHarnessError(msg)
        return submitted.group(1)

    def job(self, job_id: str) -> SlurmJobState:
        """Return one job's state, read with ``scontrol show job -o``."""
        return parse_job_record(self.run("scontrol", "show", "job", "-o", job_id).stdout.strip())

    def wait_for_job(
        self,
        job_id: str,
        predicate: Callable[[SlurmJobState], bool],
        timeout_s: float = 20.0,
    ) -> SlurmJobState:
        """Poll a job until ``predicate`` holds; raise AssertionError with its last state."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.job(job_id)
            if predicate(state):
                return state
            if time.monotonic() > deadline:
                msg = f"job {job_id} did not reach the expected state in {timeout_s} s: {state}"
                raise AssertionError(msg)
            time.sleep(0.05)

    def cancel_all(self) -> None:
        """Cancel every job and wait until none is left."""
        self.run("scancel", "--user", pwd.getpwuid(os.getuid()).pw_name)
        deadline = time.monotonic() + 10
        while self.run("squeue", "--noheader", "--format=%i").stdout.strip():
            if time.monotonic() > deadline:
                raise SlurmHarnessError("jobs still listed 10 s after scancel")
            time.sleep(0.05)


def _write_reboot_program(root: Path) -> None:
    """The cluster's ``RebootProgram``: it writes one line per call and reboots nothing."""
    script = root / REBOOT_PROGRAM
    log = root / REBOOT_LOG
    script.write_text(
        "#!/bin/sh\n"
        "# fleetwatch's Slurm test harness: record the call, reboot nothing\n"
        f'printf \'%s %s %s\\n\' "$(date +%s.%N)" "$(hostname)" "$*" >> {log}\n'
        "exit 0\n"
    )
    script.chmod(0o755)


def _slurm_conf(root: Path, spares: int, user: str) -> str:
    """The cluster's slurm.conf: every file under ``root``, free ports, no cgroups, no mail."""
    node = "NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 State=UNKNOWN"
    spare_names = f"node-[02-{spares + 1:02d}]"
    return f"""\
ClusterName=fleetwatch-test
SlurmctldHost=localhost
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root / "munge.socket"}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "slurmctld.log"}
SlurmdLogFile={root / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
RebootProgram={root / REBOOT_PROGRAM}
ResumeTimeout={RESUME_TIMEOUT_S}
NodeName={REAL_NODE} {node}
NodeName={spare_names} {node}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class _Daemons:
    """The child processes, started in order and stopped in reverse."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    def start(self, name: str, *argv: str) -> None:
        out = (self.root / f"{name}.out").open("wb")
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a Ctrl-C in the terminal is for pytest, not them
            )
        except BaseException:
            out.close()
            raise
        self.procs.append((name, proc, out))

    def check_alive(self) -> None:
        for name, proc, _ in self.procs:
            if proc.poll() is not None:
                msg = f"{name} exited with {proc.returncode} during start-up\n{self.logs()}"
                raise SlurmHarnessError(msg)

    def logs(self) -> str:
        names = [f"{name}.out" for name, _, _ in self.procs] + ["slurmctld.log", "slurmd.log"]
        return "\n".join(_tail(self.root / name) for name in names)

    def stop(self) -> None:
        for _name, proc, out in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            out.close()
        self.procs.clear()


def _wait(what: str, ready: Callable[[], bool], daemons: _Daemons, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        daemons.check_alive()
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout_s} s waiting for {what}\n{daemons.logs()}"
            raise SlurmHarnessError(msg)
        time.sleep(0.05)


@contextlib.contextmanager
def slurm_cluster(spares: int = 8, startup_timeout_s: float = 30.0) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and a slurmd for ``node-01``; yield once every node is IDLE.

    Args:
        spares: nodes besides ``node-01`` (``node-02`` ...), served by its slurmd.
        startup_timeout_s: the longest wait for the daemons and the nodes to come up.

    Raises:
        SlurmHarnessError: a command is missing, a daemon died, or the nodes never came up; the
            message carries the daemons' logs.
    """
    ensure_slurm_installed()
    # Our own dir, not pytest's tmp_path: munged wants a socket dir everyone may traverse.
    root = Path(tempfile.mkdtemp(prefix="fleetwatch-slurm-"))
    root.chmod(0o755)
    daemons: _Daemons | None = None
    try:
        for sub in ("state", "spool"):
            (root / sub).mkdir()
        key = root / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        user = pwd.getpwuid(os.getuid()).pw_name
        _write_reboot_program(root)
        conf = root / "slurm.conf"
        conf.write_text(_slurm_conf(root, spares, user))
        cluster = SlurmCluster(
            root=root,
            conf=conf,
            env={"SLURM_CONF": str(conf)},
            real_node=REAL_NODE,
            spare_nodes=tuple(f"node-{i:02d}" for i in range(2, spares + 2)),
        )
        daemons = _Daemons(root, {**os.environ, **cluster.env, "PATH": _SEARCH_PATH})
        daemons.start(
            "munged",
            "munged",
            "--foreground",
            f"--socket={root / 'munge.socket'}",
            f"--key-file={key}",
            f"--pid-file={root / 'munged.pid'}",
            f"--seed-file={root / 'munged.seed'}",
        )
        _wait("munged's socket", (root / "munge.socket").exists, daemons, startup_timeout_s)
        daemons.start("slurmctld", "slurmctld", "-D")
        _wait(
            "slurmctld to answer",
            lambda: cluster.run("scontrol", "ping", check=False).returncode == 0,
            daemons,
            startup_timeout_s,
        )
        daemons.start("slurmd", "slurmd", "-D", "-N", REAL_NODE)
        _wait(
            "every node to be IDLE",
            lambda: all(s.states == {"IDLE"} for s in cluster.nodes().values()),
            daemons,
            startup_timeout_s,
        )
        yield cluster
    finally:
        if daemons is not None:
            daemons.stop()
        shutil.rmtree(root, ignore_errors=True)
