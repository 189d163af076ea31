"""NVML source: GPU identity, NVLink state and the PCIe replay counter.

The NVML *library* is injected: production passes the ``pynvml`` module (imported lazily by
:func:`load_pynvml`), the simulator passes :class:`agent.sim.nvml_lib.SimNvmlLibrary`, which
offers the same functions and raises pynvml's own exception classes. So the code below is the
code that runs against real GPUs, in tests and in the demo alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agent.exceptions import GpuLostError, NvmlError
from agent.pci import normalize_bus_id

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


class PciInfo(Protocol):
    """The part of ``nvmlPciInfo_t`` we read."""

    @property
    def busId(self) -> str:  # noqa: N802 - NVML's field name
        """``%08X:%02X:%02X.0``, e.g. ``00000000:1B:00.0``."""
        ...


class NvmlLibrary(Protocol):
    """The subset of pynvml that fleetwatch calls (the ``pynvml`` module satisfies it)."""

    @property
    def NVMLError(self) -> type[Exception]:  # noqa: N802 - pynvml's name
        """The base class of every NVML error (``.value`` holds the return code)."""
        ...

    NVML_ERROR_GPU_IS_LOST: int
    NVML_ERROR_NOT_SUPPORTED: int
    NVML_ERROR_INVALID_ARGUMENT: int
    NVML_FEATURE_ENABLED: int
    NVML_NVLINK_MAX_LINKS: int

    def nvmlInit(self) -> None: ...  # noqa: D102, N802
    def nvmlShutdown(self) -> None: ...  # noqa: D102, N802
    def nvmlSystemGetDriverVersion(self) -> str: ...  # noqa: D102, N802
    def nvmlSystemGetNVMLVersion(self) -> str: ...  # noqa: D102, N802
    def nvmlDeviceGetCount(self) -> int: ...  # noqa: D102, N802
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetName(self, handle: Any) -> str: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetPciInfo(self, handle: Any) -> PciInfo: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int: ...  # noqa: ANN401, D102, N802


def load_pynvml() -> NvmlLibrary:
    """Import the real pynvml module (it loads libnvidia-ml only when ``nvmlInit`` runs)."""
    import pynvml  # noqa: PLC0415 - imported only where real NVML is wanted

    return pynvml


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What does not change while the GPU is on the bus."""

    index: int
    uuid: str
    pci_bus_id: str
    model: str
    nvlink_count: int


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One poll of one GPU. ``None`` marks a value this GPU does not support."""

    nvlink_up: tuple[bool, ...]
    pcie_replay_count: int | None


class NvmlSource:
    """Reads GPUs through an injected NVML library and translates its errors at the boundary."""

    __slots__ = ("_handles", "_lib", "_started")

    def __init__(self, lib: NvmlLibrary) -> None:
        """Keep the library; nothing is called until :meth:`start`."""
        self._lib = lib
        self._handles: dict[int, Any] = {}
        self._started = False

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except self._lib.NVMLError as exc:
            code = int(getattr(exc, "value", -1))
            msg = f"{what}: {exc}"
            if code == self._lib.NVML_ERROR_GPU_IS_LOST:
                raise GpuLostError(code, msg) from exc
            raise NvmlError(code, msg) from exc

    def _optional(self, what: str, fn: Callable[[], T]) -> T | None:
        """Like :meth:`_call`, but NOT_SUPPORTED becomes None."""
        try:
            return self._call(what, fn)
        except GpuLostError:
            raise
        except NvmlError as exc:
            if exc.code == self._lib.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise

    def start(self) -> tuple[str, str]:
        """Initialise NVML; return (driver version, NVML version)."""
        lib = self._lib
        self._call("nvmlInit", lib.nvmlInit)
        self._started = True
        driver = self._call("nvmlSystemGetDriverVersion", lib.nvmlSystemGetDriverVersion)
        version = self._call("nvmlSystemGetNVMLVersion", lib.nvmlSystemGetNVMLVersion)
        return driver, version

    def stop(self) -> None:
        """Shut NVML down (reference-counted by NVML itself)."""
        if self._started:
            self._started = False
            self._handles.clear()
            self._call("nvmlShutdown", self._lib.nvmlShutdown)

    def device_count(self) -> int:
        """Return how many GPUs the driver reports (lost ones included)."""
        return self._call("nvmlDeviceGetCount", self._lib.nvmlDeviceGetCount)

    def _handle(self, index: int) -> Any:  # noqa: ANN401 - NVML handles are opaque
        handle = self._handles.get(index)
        if handle is None:
            lib = self._lib
            handle = self._call(
                f"nvmlDeviceGetHandleByIndex({index})",
                lambda: lib.nvmlDeviceGetHandleByIndex(index),
            )
            self._handles[index] = handle
        return handle

    def identify(self, index: int) -> GpuIdentity:
        """Read the identity of GPU ``index`` and count its NVLinks (probed once, here)."""
        lib = self._lib
        handle = self._handle(index)
        uuid = self._call("nvmlDeviceGetUUID", lambda: lib.nvmlDeviceGetUUID(handle))
        model = self._call("nvmlDeviceGetName", lambda: lib.nvmlDeviceGetName(handle))
        pci = self._call("nvmlDeviceGetPciInfo", lambda: lib.nvmlDeviceGetPciInfo(handle))
        return GpuIdentity(
            index=index,
            uuid=uuid,
            pci_bus_id=normalize_bus_id(pci.busId),
            model=model,
            nvlink_count=self._count_nvlinks(handle),
        )

    def _count_nvlinks(self, handle: Any) -> int:  # noqa: ANN401 - NVML handles are opaque
        """Count links by asking for each until NVML says the index is invalid or unsupported.

        Do not trust NVML_NVLINK_MAX_LINKS as the count: it is a bound (36 since v590).
        """
        lib = self._lib
        count = 0
        for link in range(lib.NVML_NVLINK_MAX_LINKS):
            try:
                self._call(
                    "nvmlDeviceGetNvLinkState",
                    partial(lib.nvmlDeviceGetNvLinkState, handle, link),
                )
            except GpuLostError:
                raise
            except NvmlError as exc:
                if exc.code in (lib.NVML_ERROR_INVALID_ARGUMENT, lib.NVML_ERROR_NOT_SUPPORTED):
                    break
                raise
            count += 1
        return count

    def read(self, gpu: GpuIdentity) -> GpuReading:
        """Poll one GPU. Raises :class:`GpuLostError` when it has fallen off the bus."""
        lib = self._lib
        handle = self._handle(gpu.index)
        links = tuple(
            self._call(
                "nvmlDeviceGetNvLinkState",
                partial(lib.nvmlDeviceGetNvLinkState, handle, link),
            )
            == lib.NVML_FEATURE_ENABLED
            for link in range(gpu.nvlink_count)
        )
        replay = self._optional(
            "nvmlDeviceGetPcieReplayCounter",
            lambda: lib.nvmlDeviceGetPcieReplayCounter(handle),
        )
        return GpuReading(nvlink_up=links, pcie_replay_count=replay)
