"""The agent's composition root: the one place that picks real or simulated hardware."""

from __future__ import annotations

import contextlib
import os
import resource
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from agent.agent import Agent, build_hello
from agent.bmc_config import open_bmc
from agent.exceptions import NoDriverError, SourceError
from agent.jobs.claims import SenderCheck
from agent.jobs.listener import JobQueue
from agent.jobs.peer_identity import PeerResolver
from agent.jobs.rank_dumps import RankDumps
from agent.jobs.stacks import PySpyDumper, find_py_spy
from agent.link.backoff import Backoff
from agent.link.collector_list import start_index
from agent.link.commands import CommandRunner, NvidiaSmiReset
from agent.link.intervals import Intervals
from agent.link.stream import CollectorLink
from agent.link.tls import channel_credentials
from agent.outbox.budget import ByteBudget
from agent.outbox.changes import LiveSamples
from agent.outbox.queue import Outbox
from agent.outbox.spool import Spool
from agent.poll.bmc import BmcPoller
from agent.poll.sampler import Sampler
from agent.poll.self_limits import ProcessUsage, SelfLimits
from agent.preflight.executor import PreflightExecutor
from agent.preflight.quick import QuickChecks
from agent.preflight.real import real_runners
from agent.preflight.runners import PreflightRunners
from agent.sources.kmsg import DevKmsgReader
from agent.sources.kmsg_cursor import KmsgCursor
from agent.sources.nvml import NvmlSource, load_pynvml, nvml_library_installed
from agent.sources.nvml_events import NvmlEventWatcher
from agent.sources.pci_sysfs import PciSysfsReader
from agent.sources.sel_cursor import SelCursor
from agent.sources.sysfs import SysfsReader
from agent.sources.sysfs_io import FdBudget
from agent.sources.udev import PyudevSource
from rules.xid_catalog import load_catalog

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import grpc

    from agent.config import AgentConfig
    from agent.jobs.stacks import StackDumper
    from agent.link.commands import GpuReset
    from agent.sources.bmc import BmcSource
    from agent.sources.kmsg import KmsgSource
    from agent.sources.nvml_api import NvmlLibrary
    from agent.sources.udev import UdevSource
    from fleetwatch.clock import Clock
    from fleetwatch.sd_notify import SdNotifier

log = structlog.get_logger("agent")


@dataclass(frozen=True, slots=True)
class Hardware:
    """The four hardware sources and the boot id, real or simulated."""

    nvml: NvmlLibrary
    sysfs_root: Path
    kmsg: KmsgSource | None
    udev: UdevSource | None
    boot_id: str
    kmsg_cursor: KmsgCursor | None = None
    gpu_reset: GpuReset | None = None
    bmc: BmcSource | None = None  # the node's BMC, when the config names one
    # What reads a hung job's rank stacks (py-spy, or the simulator's); None: state and wchan only.
    stacks: StackDumper | None = None
    # How the spool under state_dir makes its writes durable (a benchmark injects a slow disk).
    fsync: Callable[[int], None] = os.fsync
    # What measures the pre-flight checks (the real tools, or the simulator's model); a missing
    # runner makes its checks could_not_run.
    preflight: PreflightRunners = field(default_factory=PreflightRunners)


def read_boot_id(proc_root: Path) -> str:
    """Return the kernel's boot id (changes on every boot)."""
    path = proc_root / "sys" / "kernel" / "random" / "boot_id"
    try:
        return path.read_text("ascii").strip()
    except OSError as exc:
        msg = f"cannot read {path}: {exc.strerror}"
        raise SourceError("proc", msg) from exc


def require_nvidia_driver() -> None:
    """Raise :class:`NoDriverError` on a node without NVML's library (no driver installed).

    Before anything is opened, so the agent's one line is all a new user sees.
    """
    if not nvml_library_installed():
        raise NoDriverError


def real_hardware(cfg: AgentConfig) -> Hardware:
    """Open the node's real sources; kmsg and udev are optional and say once why they are off.

    The kernel log is read from the start of its buffer when a cursor from an earlier agent
    exists (a restart, or a reboot: the buffer then holds this boot's early lines), and from
    its end on a node that never ran the agent, so old history is not reported as new.
    """
    boot_id = read_boot_id(cfg.proc_root)
    cursor = None
    if cfg.state_dir is not None:
        cursor = KmsgCursor(cfg.state_dir / "kmsg-cursor.json", boot_id)
    kmsg: KmsgSource | None = None
    if cfg.kmsg_path:
        try:
            from_start = cursor is not None and cursor.path.exists()
            kmsg = DevKmsgReader(cfg.kmsg_path, from_start=from_start)
        except SourceError as exc:
            log.warning("source_disabled", source="kmsg", error=str(exc))
    udev: UdevSource | None = None
    if cfg.udev:
        try:
            udev = PyudevSource()
        except SourceError as exc:
            log.warning("source_disabled", source="udev", error=str(exc))
    return Hardware(
        nvml=load_pynvml(),
        sysfs_root=cfg.sysfs_root,
        kmsg=kmsg,
        udev=udev,
        boot_id=boot_id,
        kmsg_cursor=cursor,
        gpu_reset=NvidiaSmiReset(cfg.nvidia_smi) if cfg.gpu_reset else None,
        bmc=open_bmc(cfg.bmc),
        preflight=real_runners(),
        stacks=PySpyDumper(find_py_spy()),
    )


def fd_budget_for_process(share: float = 0.25) -> FdBudget:
    """Raise the soft descriptor limit to the hard one; let kept sysfs files use ``share``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return FdBudget(int(min(soft, 65_536) * share))


def build_agent(  # noqa: PLR0913 - the composition root passes every collaborator
    cfg: AgentConfig,
    hardware: Hardware,
    clock: Clock,
    credentials: grpc.ChannelCredentials | None = None,
    fd_budget: FdBudget | None = None,
    *,
    notifier: SdNotifier | None = None,
) -> Agent:
    """Assemble an agent from its configuration and hardware.

    ``credentials`` None: mTLS from the config's TLS keys, or plaintext where the config allows
    it (ConfigError otherwise). ``fd_budget`` bounds the sysfs files kept open between reads;
    agents of one process should share one (None keeps none open). ``notifier`` speaks to
    systemd (None: not under systemd).
    """
    if credentials is None:
        credentials = channel_credentials(cfg)
        if credentials is None and cfg.insecure:
            log.warning("grpc_plaintext", collectors=list(cfg.targets), reason="insecure = true")
    nvml = NvmlSource(hardware.nvml, call_timeout_s=cfg.nvml_call_timeout)
    sampler = Sampler(
        nvml=nvml,
        nvml_events=NvmlEventWatcher(hardware.nvml, clock) if cfg.nvml_events else None,
        sysfs=SysfsReader(hardware.sysfs_root, fd_budget),
        pci=PciSysfsReader(hardware.sysfs_root),
        kmsg=hardware.kmsg,
        kmsg_cursor=hardware.kmsg_cursor,
        udev=hardware.udev,
        catalog=load_catalog(cfg.xid_catalog),
        clock=clock,
        counter_interval_s=cfg.counter_interval,
    )
    budget = ByteBudget(cfg.spool_max_bytes)
    spool = None
    if cfg.state_dir is not None:
        spool = Spool(cfg.state_dir / "spool", hardware.boot_id, fsync=hardware.fsync)
    outbox = Outbox(hardware.boot_id, spool=spool, budget=budget)
    live = LiveSamples(cfg.gauge_interval, clock.monotonic)
    intervals = Intervals(poll=cfg.poll_interval, heartbeat=cfg.heartbeat_interval)
    jobs = None
    if cfg.job_socket is not None:  # senders are looked up in the real /proc (their cgroups)
        senders = SenderCheck(
            PeerResolver(cfg.proc_root),
            clock,
            jobs_per_uid=cfg.jobs_per_uid,
            ranks_per_uid=cfg.ranks_per_uid,
        )
        jobs = JobQueue(budget=budget, senders=senders)
        jobs.now = clock.monotonic
    if jobs is not None:
        budget.shed = jobs.shed  # an event that needs room drops the oldest step reports
    # a hung job's ranks are dumped from what the job socket saw (never a pid the command names)
    dumps = (
        RankDumps(jobs.ranks, hardware.stacks, recorders=jobs.recorders)
        if jobs is not None
        else None
    )
    commands = CommandRunner(sampler, hardware.gpu_reset, dumps)
    preflight = PreflightExecutor(
        node=cfg.node,
        sampler=sampler,
        nvml=nvml,
        # readers of its own: the sampler's keep files open for its polls on the event loop
        quick=QuickChecks(
            nvml, SysfsReader(hardware.sysfs_root), PciSysfsReader(hardware.sysfs_root)
        ),
        runners=hardware.preflight,
        jobs=jobs,
        monotonic=clock.monotonic,
    )
    link = CollectorLink(
        targets=cfg.targets,
        start=start_index(cfg.node, len(cfg.targets)),
        hello=lambda: build_hello(cfg.node, hardware.boot_id, sampler.inventory, clock),
        outbox=outbox,
        live=live,
        clock=clock,
        backoff=Backoff(cfg.backoff_initial, cfg.backoff_max),
        intervals=intervals,
        credentials=credentials,
        server_name=cfg.tls_server_name,
        commands=commands,
        jobs=jobs,
        preflight=preflight,
    )
    limits = None
    if cfg.memory_max_bytes or cfg.poll_cpu_max_share:
        limits = SelfLimits(
            ProcessUsage(cfg.proc_root),
            memory_max_bytes=cfg.memory_max_bytes,
            poll_cpu_max_share=cfg.poll_cpu_max_share,
        )
    return Agent(
        node=cfg.node,
        boot_id=hardware.boot_id,
        sampler=sampler,
        outbox=outbox,
        live=live,
        link=link,
        clock=clock,
        intervals=intervals,
        start_backoff=Backoff(cfg.backoff_initial, cfg.backoff_max),
        jobs=jobs,
        job_socket=cfg.job_socket,
        job_socket_mode=cfg.job_socket_mode,
        notifier=notifier,
        limits=limits,
        bmc=_bmc_poller(cfg, hardware),
        # a BMC the hardware brings without an [agent.bmc] table is the simulator's: it answers
        # at once, and is read as often as the rest
        bmc_interval=cfg.bmc.interval if cfg.bmc is not None else max(cfg.poll_interval, 1.0),
    )


def _bmc_poller(cfg: AgentConfig, hardware: Hardware) -> BmcPoller | None:
    """The BMC's poller, its SEL cursor under ``state_dir`` (None: the position in memory)."""
    if hardware.bmc is None:
        return None
    timeout, needed = (cfg.bmc.timeout, cfg.bmc.psus_needed) if cfg.bmc else (20.0, 0)
    cursor = None
    if cfg.state_dir is not None:
        cursor = SelCursor(cfg.state_dir / "bmc-sel-cursor.json", hardware.bmc.address)
    return BmcPoller(
        hardware.bmc,
        cursor=cursor,
        timeout_s=timeout,
        psus_needed=needed,
    )
