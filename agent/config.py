"""Agent configuration: defaults, an optional TOML file, then command-line overrides."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.bmc_config import BmcConfig, parse_bmc
from agent.exceptions import ConfigError
from agent.jobs.claims import MAX_JOBS_PER_UID as DEFAULT_JOBS_PER_UID
from agent.jobs.claims import MAX_RANKS_PER_OWNER as DEFAULT_RANKS_PER_UID
from agent.link.collector_list import DEFAULT_COLLECTOR, check_address, check_collectors, split_flag
from agent.outbox.budget import DEFAULT_MAX_BYTES
from agent.poll.self_limits import DEFAULT_MEMORY_MAX_BYTES, DEFAULT_POLL_CPU_MAX_SHARE
from fleetwatch.config_file import (
    check_log_level,
    check_number,
    check_text,
    merge_config,
    short_repr,
    to_path,
)
from fleetwatch.tls import check_tls_keys

# The spool must hold at least one event of the largest size the wire takes (1 MiB).
MIN_SPOOL_BYTES = 2 << 20
# An idle agent's Python, gRPC and NVML take about 55 MiB: a ceiling below 64 MiB sheds always.
MIN_MEMORY_MAX_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything the agent can be told. Intervals are in seconds."""

    # Where to stream: one collector, or several sharing one journal (agent/link/collector_list.py);
    # not both. Neither: 127.0.0.1:7070. ``targets`` is the list in use.
    collector: str | None = None
    collectors: tuple[str, ...] | None = None
    node: str = field(default_factory=socket.gethostname)
    poll_interval: float = 5.0
    heartbeat_interval: float = 5.0
    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    kmsg_path: str = "/dev/kmsg"  # "" turns the kernel log source off
    udev: bool = True
    nvml_events: bool = True  # Xid events from NVML, besides the kernel log
    counter_interval: float = 30.0  # IB counters (firmware queries) and PCIe AER/link files
    # A GPU's temperature, power, utilisation and SM clock travel at most this often (each
    # series; 0: at every change); states and error counters always at the next report.
    gauge_interval: float = 5.0
    # Self limits (docs/signals.md): NVML work waits this long before the poll goes on without
    # it; above this RSS the agent sheds held step reports (0: off); polls costing more CPU than
    # this share of the poll interval stretch the interval (0: off).
    nvml_call_timeout: float = 5.0
    memory_max_bytes: int = DEFAULT_MEMORY_MAX_BYTES
    poll_cpu_max_share: float = DEFAULT_POLL_CPU_MAX_SHARE
    state_dir: Path | None = Path("/var/lib/fleetwatch")  # kmsg cursor, spool; None: keep none
    # Unacknowledged events (spooled under state_dir/spool) and held step reports, in bytes.
    spool_max_bytes: int = DEFAULT_MAX_BYTES
    gpu_reset: bool = True  # carry out the collector's reset_gpu commands (when GPUs are idle)
    nvidia_smi: str = "nvidia-smi"  # the program that resets a GPU (--gpu-reset -i BUS)
    xid_catalog: Path | None = None
    # Training ranks send step reports here (fleetwatch.jobclient); None: take none.
    job_socket: Path | None = Path("/run/fleetwatch/jobs.sock")
    job_socket_mode: int = 0o666  # every local user's job may report
    # Job ids one uid may report for at once on this node outside Slurm jobs and pods (the node
    # takes 4 times this from all of them); docs/jobs.md.
    jobs_per_uid: int = DEFAULT_JOBS_PER_UID
    # Ranks one uid (its pods together, or one Slurm job) may report for at once on this node
    # (the node takes 4 times this from all of them).
    ranks_per_uid: int = DEFAULT_RANKS_PER_UID
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    # mTLS (docs/deploy.md): all three, or none and plaintext gRPC, which a non-loopback
    # collector gets only with insecure = true.
    tls_cert: Path | None = None  # this node's certificate (chain), PEM; it names the node
    tls_key: Path | None = None  # its private key, PEM
    tls_ca: Path | None = None  # the CA that signed the collector's certificate, PEM
    tls_server_name: str | None = None  # the name to expect in the collector's certificate
    insecure: bool = False
    log_level: str | None = None  # debug, info, warning, error; None: --log-level, or info
    # The node's BMC, the [agent.bmc] table (agent/bmc_config.py, docs/signals.md): None reads
    # none. Its credentials come from files, never from this file or the command line.
    bmc: BmcConfig | None = None

    def __post_init__(self) -> None:
        """Reject values that cannot work, naming the key."""
        for key in ("jobs_per_uid", "ranks_per_uid"):
            check_number(
                getattr(self, key), key, ConfigError, minimum=1, inclusive=True, integer=True
            )
        for key in (
            "poll_interval",
            "heartbeat_interval",
            "backoff_initial",
            "backoff_max",
            "counter_interval",
            "nvml_call_timeout",
        ):
            check_number(getattr(self, key), key, ConfigError)
        check_number(self.gauge_interval, "gauge_interval", ConfigError, inclusive=True)
        _check_self_limits(self)
        bmc: object = self.bmc  # a TOML table, to check and convert
        if bmc is not None and not isinstance(bmc, BmcConfig):
            object.__setattr__(self, "bmc", parse_bmc(bmc))
        size: object = self.spool_max_bytes  # TOML may give anything
        if isinstance(size, bool) or not isinstance(size, int) or size < MIN_SPOOL_BYTES:
            msg = (
                f"agent config: spool_max_bytes must be a whole number of bytes, at least "
                f"{MIN_SPOOL_BYTES} (2 MiB), got {short_repr(size)}"
            )
            raise ConfigError(msg)
        for key in ("gpu_reset", "udev", "nvml_events"):
            value = getattr(self, key, True)
            if not isinstance(value, bool):
                msg = f"agent config: {key} must be true or false, got {short_repr(value)}"
                raise ConfigError(msg)
        mode: object = self.job_socket_mode  # TOML may give anything
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:  # noqa: PLR2004 - permission bits
            msg = (
                "agent config: job_socket_mode must be permission bits like 0o660, "
                f"got {short_repr(mode)}"
            )
            raise ConfigError(msg)
        if self.backoff_initial > self.backoff_max:
            msg = "agent config: backoff_initial must not exceed backoff_max"
            raise ConfigError(msg)
        for key in ("node", "nvidia_smi"):
            check_text(getattr(self, key), key, "agent config", ConfigError)
        check_text(self.kmsg_path, "kmsg_path", "agent config", ConfigError, empty=True)
        _check_collectors(self)
        _check_tls(self)
        check_log_level(self.log_level, "agent config", ConfigError)

    @property
    def targets(self) -> tuple[str, ...]:
        """The collectors to stream to: ``collectors``, else ``collector``, else the default."""
        if self.collectors is not None:
            return self.collectors
        return (self.collector or DEFAULT_COLLECTOR,)


def _check_collectors(cfg: AgentConfig) -> None:
    if cfg.collector is not None:
        check_address(cfg.collector, "collector")
    if cfg.collectors is None:
        return
    if cfg.collector is not None:
        msg = (
            "agent config: collector and collectors are both set; keep one "
            '(collectors = ["a:7070", "b:7070"] for several, collector = "a:7070" for one)'
        )
        raise ConfigError(msg)
    # A TOML array arrives as a list: keep a tuple, so the frozen config stays immutable.
    object.__setattr__(cfg, "collectors", check_collectors(cfg.collectors))


def _check_self_limits(cfg: AgentConfig) -> None:
    size: object = cfg.memory_max_bytes  # TOML may give anything
    if (
        isinstance(size, bool)
        or not isinstance(size, int)
        or (size != 0 and size < MIN_MEMORY_MAX_BYTES)
    ):
        msg = (
            "agent config: memory_max_bytes must be 0 (off) or a whole number of bytes, at "
            f"least {MIN_MEMORY_MAX_BYTES} (64 MiB), got {short_repr(size)}"
        )
        raise ConfigError(msg)
    share = cfg.poll_cpu_max_share
    if share != 0:
        check_number(share, "poll_cpu_max_share", ConfigError)
        if share > 1:
            msg = f"agent config: poll_cpu_max_share must be at most 1, got {short_repr(share)}"
            raise ConfigError(msg)


def _check_tls(cfg: AgentConfig) -> None:
    check_tls_keys(
        {k: getattr(cfg, k) for k in TLS_KEYS},
        insecure=cfg.insecure,
        what="agent config",
        error=ConfigError,
    )
    name: object = cfg.tls_server_name  # TOML may give anything
    if name is None:
        return
    if not isinstance(name, str) or not name:
        msg = f"agent config: tls_server_name must be a host name, got {name!r}"
        raise ConfigError(msg)
    if cfg.tls_cert is None:
        msg = "agent config: tls_server_name needs TLS (tls_cert, tls_key and tls_ca)"
        raise ConfigError(msg)


TLS_KEYS = ("tls_cert", "tls_key", "tls_ca")
_PATHS = {"sysfs_root", "proc_root", "xid_catalog", "state_dir", "job_socket"}


def load_agent_config(path: Path | None, overrides: dict[str, Any]) -> AgentConfig:
    """Merge defaults, the TOML file at ``path`` (if any) and ``overrides`` (None means unset).

    A ``collector`` override (``--collector``: one address, a comma list, or a list of those)
    replaces whichever of ``collector`` and ``collectors`` the file sets.
    """
    overrides = dict(overrides)
    flag = overrides.pop("collector", None)
    values = merge_config(path, "agent", overrides, AgentConfig, ConfigError)
    if flag is not None:
        addresses = split_flag(flag)
        values.pop("collector", None)
        values.pop("collectors", None)
        if len(addresses) == 1:
            values["collector"] = addresses[0]
        else:
            values["collectors"] = addresses
    for key in _PATHS & values.keys():
        if values[key] == "" and key == "job_socket":
            values[key] = None  # "" turns the job socket off
        elif values[key] is not None:
            values[key] = to_path(values[key], key, "agent config", ConfigError)
    for key in TLS_KEYS:
        if isinstance(values.get(key), str) and values[key]:
            values[key] = Path(values[key])  # anything else: the dataclass says what is wrong
    return AgentConfig(**values)
