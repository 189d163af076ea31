"""The part of pynvml's surface fleetwatch calls, as a Protocol.

The ``pynvml`` module satisfies it, and so does the simulator's library. Handles are opaque.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agent.sources.nvml_fields import FieldKey, FieldValue


class PciInfo(Protocol):
    """The part of ``nvmlPciInfo_t`` we read."""

    @property
    def busId(self) -> str:  # noqa: N802 - NVML's field name
        """``%08X:%02X:%02X.0``, e.g. ``00000000:1B:00.0``."""
        ...


class Utilization(Protocol):
    """``nvmlUtilization_t``."""

    @property
    def gpu(self) -> int:
        """Percent of time a kernel ran."""
        ...

    @property
    def memory(self) -> int:
        """Percent of time device memory was read or written."""
        ...


class ProcessInfo(Protocol):
    """``nvmlProcessInfo_t``: a process using the GPU."""

    @property
    def pid(self) -> int:
        """The process id."""
        ...


class EventData(Protocol):
    """``nvmlEventData_t``: ``eventData`` is the Xid for Xid events."""

    @property
    def device(self) -> Any:  # noqa: ANN401 - opaque handle
        """The GPU's handle."""
        ...

    @property
    def eventType(self) -> int:  # noqa: N802 - NVML's name
        """One ``nvmlEventType*`` bit."""
        ...

    @property
    def eventData(self) -> int:  # noqa: N802 - NVML's name
        """The Xid number, for Xid events."""
        ...


class NvmlLibrary(Protocol):
    """The subset of pynvml that fleetwatch calls."""

    @property
    def NVMLError(self) -> type[Exception]:  # noqa: N802 - pynvml's name
        """The base class of every NVML error (``.value`` holds the return code)."""
        ...

    def nvmlInit(self) -> None: ...  # noqa: D102, N802
    def nvmlShutdown(self) -> None: ...  # noqa: D102, N802
    def nvmlSystemGetDriverVersion(self) -> str: ...  # noqa: D102, N802
    def nvmlSystemGetNVMLVersion(self) -> str: ...  # noqa: D102, N802
    def nvmlDeviceGetCount(self) -> int: ...  # noqa: D102, N802
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetName(self, handle: Any) -> str: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetPciInfo(self, handle: Any) -> PciInfo: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetFieldValues(  # noqa: D102, N802
        self,
        handle: Any,  # noqa: ANN401
        fieldIds: list[FieldKey],  # noqa: N803
    ) -> Sequence[FieldValue]: ...
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetNvLinkErrorCounter(  # noqa: D102, N802
        self,
        device: Any,  # noqa: ANN401
        link: int,
        counter: int,
    ) -> int: ...
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetTotalEccErrors(  # noqa: D102, N802
        self,
        handle: Any,  # noqa: ANN401
        errorType: int,  # noqa: N803
        counterType: int,  # noqa: N803
    ) -> int: ...
    def nvmlDeviceGetRemappedRows(  # noqa: D102, N802
        self,
        device: Any,  # noqa: ANN401
    ) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Utilization: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int: ...  # noqa: A002, ANN401, D102, N802
    def nvmlDeviceGetComputeRunningProcesses(  # noqa: D102, N802
        self,
        handle: Any,  # noqa: ANN401
    ) -> Sequence[ProcessInfo]: ...
    # pre-flight's quick checks (agent/preflight/quick.py)
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...  # noqa: D102, N802
    def nvmlDeviceGetEccMode(self, handle: Any) -> Sequence[int]: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str: ...  # noqa: ANN401, D102, N802
    def nvmlEventSetCreate(self) -> Any: ...  # noqa: ANN401, D102, N802
    def nvmlEventSetFree(self, eventSet: Any) -> None: ...  # noqa: ANN401, D102, N802, N803
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int: ...  # noqa: ANN401, D102, N802
    def nvmlDeviceRegisterEvents(  # noqa: D102, N802
        self,
        handle: Any,  # noqa: ANN401
        eventTypes: int,  # noqa: N803
        eventSet: Any,  # noqa: ANN401, N803
    ) -> None: ...
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> EventData: ...  # noqa: ANN401, D102, N802, N803
