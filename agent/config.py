"""Agent configuration: defaults, an optional TOML file, then command-line overrides."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.exceptions import ConfigError
from fleetwatch.config_file import check_number, merge_config


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything the agent can be told. Intervals are in seconds."""

    collector: str = "127.0.0.1:7070"
    node: str = field(default_factory=socket.gethostname)
    poll_interval: float = 5.0
    heartbeat_interval: float = 5.0
    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    kmsg_path: str = "/dev/kmsg"  # "" turns the kernel log source off
    udev: bool = True
    nvml_events: bool = True  # Xid events from NVML, besides the kernel log
    counter_interval: float = 30.0  # IB counters (firmware queries) and PCIe AER/link files
    state_dir: Path | None = Path("/var/lib/fleetwatch")  # kmsg cursor; None: keep no state
    gpu_reset: bool = True  # carry out the collector's reset_gpu commands (when GPUs are idle)
    nvidia_smi: str = "nvidia-smi"  # the program that resets a GPU (--gpu-reset -i BUS)
    xid_catalog: Path | None = None
    # Training ranks send step reports here (fleetwatch.jobclient); None: take none.
    job_socket: Path | None = Path("/run/fleetwatch/jobs.sock")
    job_socket_mode: int = 0o666  # every local user's job may report
    backoff_initial: float = 0.5
    backoff_max: float = 30.0

    def __post_init__(self) -> None:
        """Reject values that cannot work, naming the key."""
        for key in (
            "poll_interval",
            "heartbeat_interval",
            "backoff_initial",
            "backoff_max",
            "counter_interval",
        ):
            check_number(getattr(self, key), key, ConfigError)
        for key in ("gpu_reset", "udev", "nvml_events"):
            value = getattr(self, key, True)
            if not isinstance(value, bool):
                msg = f"agent config: {key} must be true or false, got {value!r}"
                raise ConfigError(msg)
        mode: object = self.job_socket_mode  # TOML may give anything
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:  # noqa: PLR2004 - permission bits
            msg = f"agent config: job_socket_mode must be permission bits like 0o660, got {mode!r}"
            raise ConfigError(msg)
        if self.backoff_initial > self.backoff_max:
            msg = "agent config: backoff_initial must not exceed backoff_max"
            raise ConfigError(msg)
        if not self.collector or ":" not in self.collector:
            msg = f"agent config: collector must be host:port, got {self.collector!r}"
            raise ConfigError(msg)


_PATHS = {"sysfs_root", "proc_root", "xid_catalog", "state_dir", "job_socket"}


def load_agent_config(path: Path | None, overrides: dict[str, Any]) -> AgentConfig:
    """Merge defaults, the TOML file at ``path`` (if any) and ``overrides`` (None means unset)."""
    values = merge_config(path, "agent", overrides, AgentConfig, ConfigError)
    for key in _PATHS & values.keys():
        if values[key] == "" and key == "job_socket":
            values[key] = None  # "" turns the job socket off
        elif values[key] is not None:
            values[key] = Path(values[key])
    return AgentConfig(**values)
