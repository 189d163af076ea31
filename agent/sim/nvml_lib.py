"""A simulated NVML library with pynvml's function names, return types and exception classes.

It is handed to the real :class:`agent.sources.nvml.NvmlSource` in place of the ``pynvml``
module. Errors are pynvml's own ``NVMLError`` subclasses built from NVML's return codes, so the
source's error translation runs exactly as it does against a real driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.sim.hardware import SimGpu, SimNode

DRIVER_VERSION = "570.133.20"
NVML_VERSION = "12.570.133.20"


@dataclass(frozen=True, slots=True)
class SimPciInfo:
    """The fields of ``nvmlPciInfo_t`` we simulate."""

    busId: str  # noqa: N815 - NVML's field name
    domain: int
    bus: int
    device: int


class SimNvmlLibrary:
    """The subset of pynvml the agent calls, backed by a :class:`SimNode`."""

    def __init__(self, node: SimNode, *, driver_loaded: bool = True) -> None:
        """Borrow pynvml's constants and exception classes so errors match the real ones."""
        import pynvml  # noqa: PLC0415 - for its exception classes and constants only

        self._pynvml = pynvml
        self.NVMLError: type[Exception] = pynvml.NVMLError
        self.NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
        self.NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
        self.NVML_ERROR_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
        self.NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
        self.NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
        self.node = node
        self.driver_loaded = driver_loaded
        self._init_count = 0
        self.calls = 0

    def _error(self, code: int) -> Exception:
        return self._pynvml.NVMLError(code)

    def _ready(self) -> None:
        self.calls += 1
        if self._init_count == 0:
            raise self._error(self._pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any) -> SimGpu:  # noqa: ANN401 - NVML handles are opaque
        self._ready()
        gpu: SimGpu = handle
        if gpu.lost:
            raise self._error(self.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's name
        """Initialise; fails like a node without the kernel module when the driver is absent."""
        self.calls += 1
        if not self.driver_loaded:
            raise self._error(self._pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self._init_count += 1

    def nvmlShutdown(self) -> None:  # noqa: N802 - pynvml's name
        """Drop one reference."""
        self._ready()
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802 - pynvml's name
        """Return the simulated driver version."""
        self._ready()
        return DRIVER_VERSION

    def nvmlSystemGetNVMLVersion(self) -> str:  # noqa: N802 - pynvml's name
        """Return the simulated NVML version."""
        self._ready()
        return NVML_VERSION

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's name
        """Count GPUs, lost ones included (the driver still knows them)."""
        self._ready()
        return len(self.node.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: ANN401, N802 - pynvml's name
        """Return the GPU as its own handle."""
        self._ready()
        if not 0 <= index < len(self.node.gpus):
            raise self._error(self.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.node.gpus[index]
        if gpu.lost:
            raise self._error(self.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: ANN401, N802 - pynvml's name
        """Return the GPU's UUID."""
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: ANN401, N802 - pynvml's name
        """Return the marketing name."""
        return self._gpu(handle).model

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimPciInfo:  # noqa: ANN401, N802
        """Return PCI info with NVML's bus id format."""
        gpu = self._gpu(handle)
        return SimPciInfo(busId=gpu.nvml_bus_id, domain=0, bus=gpu.bus, device=0)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:  # noqa: ANN401, N802
        """Return 1 (enabled) or 0; an index past the GPU's links is an invalid argument."""
        gpu = self._gpu(handle)
        if not 0 <= link < len(gpu.nvlink_up):
            raise self._error(self.NVML_ERROR_INVALID_ARGUMENT)
        return self.NVML_FEATURE_ENABLED if gpu.nvlink_up[link] else 0

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:  # noqa: ANN401, N802
        """Return the replay counter (it only grows)."""
        return self._gpu(handle).pcie_replays
