"""Errors raised by the agent's sources; hardware faults are events, not exceptions.

Exception tree::

    AgentError
    ├── ConfigError          (agent configuration is invalid; names the key)
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
