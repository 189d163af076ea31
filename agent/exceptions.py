"""Errors raised by the agent's sources; hardware faults are events, not exceptions.

Exception tree::

    AgentError
    ├── ConfigError          (agent configuration is invalid; names the key)
    ├── NoDriverError        (libnvidia-ml is not installed: no GPU to watch, exit 2)
    ├── OutboxFullError      (events alone fill the outbox's byte bound; the event is refused)
    └── SourceError          (a hardware source failed to read; carries the source name)
        └── NvmlError        (an NVML call failed; carries NVML's return code)
            └── GpuLostError (NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus)
"""

from __future__ import annotations


class AgentError(Exception):
    """Base class for agent errors."""


class ConfigError(AgentError):
    """The agent's configuration is invalid."""


class NoDriverError(AgentError):
    """NVML's library (libnvidia-ml) is not installed: this is no GPU node, or its driver is gone.

    Not retried: a driver whose kernel module is still loading answers DRIVER_NOT_LOADED, which
    the agent waits out; a missing library is a node to set up, not a moment to wait.
    """

    def __init__(self) -> None:
        """Say what is missing and how to try the agent anyway."""
        super().__init__(
            "no NVIDIA driver found (libnvidia-ml); use --simulate to try it without a GPU"
        )


class OutboxFullError(AgentError):
    """Unacknowledged events alone fill the outbox's byte bound: a new one cannot be kept."""


class SourceError(AgentError):
    """A hardware source could not be read."""

    def __init__(self, source: str, message: str) -> None:
        """Remember which source failed (``nvml``, ``sysfs``, ``kmsg``, ``udev``)."""
        super().__init__(f"{source}: {message}")
        self.source = source


class NvmlError(SourceError):
    """An NVML call returned an error code."""

    def __init__(self, code: int, message: str) -> None:
        """Keep NVML's numeric return code."""
        super().__init__("nvml", message)
        self.code = code


class GpuLostError(NvmlError):
    """The GPU is no longer reachable (it fell off the bus)."""
