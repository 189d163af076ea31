"""A simulated NVML library with pynvml's function names, return types and exception classes.

It is handed to the real :class:`agent.sources.nvml.NvmlSource` in place of the ``pynvml``
module. Errors are pynvml's own ``NVMLError`` subclasses built from NVML's return codes, so the
source's error translation runs exactly as it does against a real driver. A capability listed in
``SimGpu.unsupported`` (a field id or a function name) answers NOT_SUPPORTED, as on architectures
that lack it. :meth:`SimNvmlLibrary.hang` makes every call on a GPU block, and every event wait
with it, until :meth:`SimNvmlLibrary.release`: what a wedged driver does.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent.sim.devices import SimGpu

DRIVER_VERSION: Final = "570.133.20"
CUDA_DRIVER_VERSION: Final = 12080  # what nvmlSystemGetCudaDriverVersion answers: CUDA 12.8
NVML_VERSION: Final = "12.570.133.20"

SUCCESS: Final = 0
UNINITIALIZED: Final = 1
INVALID_ARGUMENT: Final = 2
NOT_SUPPORTED: Final = 3
THRESHOLD_SHUTDOWN: Final = 0  # NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
THRESHOLD_SLOWDOWN: Final = 1  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
DRIVER_NOT_LOADED: Final = 9
LIBRARY_NOT_FOUND: Final = 12
TIMEOUT: Final = 10
GPU_IS_LOST: Final = 15
UNKNOWN: Final = 999  # NVML_ERROR_UNKNOWN
VALUE_UNSIGNED_LONG_LONG: Final = 3
ENTRY_CACHE_LIMIT: Final = 100_000

VALUE_UNSIGNED_INT: Final = 1
# Field value types as a real H100 answers them (tests/fixtures/nvml/): the PCIe replay counter
# comes as an unsigned int, the ECC and row-remap fields as unsigned long longs.
FIELD_VALUE_TYPES: Final = {94: VALUE_UNSIGNED_INT}
FI_NVLINK_LINK_COUNT: Final = 91
NVLINK_FIELDS: Final = frozenset({161, 162, 163, 165})

EVENT_XID: Final = 0x8
EVENT_DBE: Final = 0x2
EVENT_GPU_UNAVAILABLE: Final = 0x4000
# What a real H100 answers nvmlDeviceGetSupportedEventTypes with (driver 580.159.04); the agent
# registers the Xid, double-bit ECC and GPU-unavailable bits of it.
SUPPORTED_EVENTS: Final = 0xFF9F


@dataclass(frozen=True, slots=True)
class SimPciInfo:
    """The fields of ``nvmlPciInfo_t`` we simulate."""

    busId: str  # noqa: N815 - NVML's field name
    domain: int
    bus: int
    device: int


@dataclass(frozen=True, slots=True)
class SimValue:
    """``nvmlValue_t``: the unsigned members (a union: both hold the same number here)."""

    ullVal: int  # noqa: N815 - NVML's name

    @property
    def uiVal(self) -> int:  # noqa: N802 - NVML's name
        """The 32-bit unsigned member."""
        return self.ullVal


@dataclass(frozen=True, slots=True)
class SimFieldValue:
    """``nvmlFieldValue_t``."""

    fieldId: int  # noqa: N815 - NVML's name
    scopeId: int  # noqa: N815
    nvmlReturn: int  # noqa: N815
    valueType: int = VALUE_UNSIGNED_LONG_LONG  # noqa: N815
    value: SimValue = SimValue(0)


@dataclass(frozen=True, slots=True)
class SimProcess:
    """``nvmlProcessInfo_t``."""

    pid: int
    usedGpuMemory: int = 0  # noqa: N815 - NVML's name


@dataclass(frozen=True, slots=True)
class SimUtilization:
    """``nvmlUtilization_t``."""

    gpu: int
    memory: int


@dataclass(frozen=True, slots=True)
class SimEventData:
    """``nvmlEventData_t``."""

    device: Any
    eventType: int  # noqa: N815 - NVML's name
    eventData: int  # noqa: N815
    gpuInstanceId: int = 0xFFFFFFFF  # noqa: N815
    computeInstanceId: int = 0xFFFFFFFF  # noqa: N815


@dataclass(slots=True)
class SimEventSet:
    """An event set: registered GPUs and a thread-safe queue of their events."""

    masks: dict[str, int] = field(default_factory=dict)
    pending: queue.Queue[SimEventData] = field(default_factory=queue.Queue)


def _field_state(gpu: SimGpu) -> tuple[object, ...]:
    """Everything the field values depend on, cheap to compare."""
    return (
        gpu.pcie_replays,
        gpu.ecc_sbe_volatile,
        gpu.ecc_dbe_volatile,
        gpu.ecc_sbe_aggregate,
        gpu.ecc_dbe_aggregate,
        gpu.remapped_correctable,
        gpu.remapped_uncorrectable,
        gpu.remap_pending,
        gpu.remap_failure,
        tuple(gpu.nvlink_up),
        tuple(map(tuple, gpu.nvlink_errors)),
        frozenset(gpu.unsupported),
    )


def _fields(gpu: SimGpu) -> dict[tuple[int, int], int]:
    """Every field the simulated GPU can answer, by (field id, scope)."""
    values = {
        (FI_NVLINK_LINK_COUNT, 0): len(gpu.nvlink_up),
        (94, 0): gpu.pcie_replays,
        (3, 0): gpu.ecc_sbe_volatile,
        (4, 0): gpu.ecc_dbe_volatile,
        (5, 0): gpu.ecc_sbe_aggregate,
        (6, 0): gpu.ecc_dbe_aggregate,
        (142, 0): gpu.remapped_correctable,
        (143, 0): gpu.remapped_uncorrectable,
        (144, 0): int(gpu.remap_pending),
        (145, 0): int(gpu.remap_failure),
    }
    for link, up in enumerate(gpu.nvlink_up):
        replay, recovery, crc = gpu.nvlink_errors[link]
        values[165, link] = int(up)
        values[161, link] = replay
        values[162, link] = recovery
        values[163, link] = crc
    return values


def _no_nvlink(gpu: SimGpu, field_id: int) -> bool:
    """A GPU without NVLink (a PCIe card, or one passed into a VM alone) refuses link fields."""
    return not gpu.nvlink_up and (field_id == FI_NVLINK_LINK_COUNT or field_id in NVLINK_FIELDS)


class SimNvmlLibrary:
    """The subset of pynvml the agent calls, backed by one node's simulated GPUs."""

    def __init__(self, gpus: list[SimGpu], *, driver_loaded: bool = True) -> None:
        """Borrow pynvml's exception class so errors match the real ones."""
        import pynvml  # noqa: PLC0415 - for its exception classes only

        self._pynvml = pynvml
        self.NVMLError: type[Exception] = pynvml.NVMLError
        self.gpus = gpus  # the node's, shared: faults change them in place
        self.driver_loaded = driver_loaded
        self.library_installed = True  # False: a node without libnvidia-ml (pynvml's code 12)
        self.driver_version = DRIVER_VERSION  # a node may run another (the driver_version fault)
        self.cuda_driver_version = CUDA_DRIVER_VERSION
        self._init_count = 0
        self._lock = threading.Lock()
        self.calls = 0
        self.event_sets: list[SimEventSet] = []
        self._entries: dict[tuple[int, int, int], SimFieldValue] = {}
        self._answers: dict[
            str, tuple[tuple[object, ...], list[tuple[int, int]], list[SimFieldValue]]
        ] = {}
        self._hung: dict[str, threading.Event] = {}  # by GPU uuid: set once released
        self.blocked = 0  # calls blocked in a hang right now

    # ---- plumbing ----------------------------------------------------------------------------

    def _error(self, code: int) -> Exception:
        return self._pynvml.NVMLError(code)

    def _ready(self) -> None:
        with self._lock:
            self.calls += 1
        if self._init_count == 0:
            raise self._error(UNINITIALIZED)

    def hang(self, gpu: SimGpu) -> None:
        """From now on, calls on ``gpu`` and event waits block until :meth:`release`."""
        with self._lock:
            gate = self._hung.get(gpu.uuid)
            if gate is None or gate.is_set():
                self._hung[gpu.uuid] = threading.Event()

    def release(self, gpu: SimGpu | None = None) -> None:
        """Let the blocked calls on ``gpu`` (None: on every GPU) return."""
        with self._lock:
            uuids = list(self._hung) if gpu is None else [gpu.uuid]
            for uuid in uuids:
                gate = self._hung.pop(uuid, None)
                if gate is not None:
                    gate.set()

    def _hold(self, uuid: str | None) -> None:
        """Block while ``uuid`` (None: any GPU) hangs."""
        gates = list(self._hung.values()) if uuid is None else [self._hung.get(uuid)]
        for gate in gates:
            if gate is not None and not gate.is_set():
                with self._lock:
                    self.blocked += 1
                gate.wait()
                with self._lock:
                    self.blocked -= 1

    def _gpu(self, handle: Any, capability: str = "") -> SimGpu:  # noqa: ANN401 - opaque handle
        self._ready()
        gpu: SimGpu = handle
        if self._hung:
            self._hold(gpu.uuid)
        if gpu.lost:
            raise self._error(GPU_IS_LOST)
        if gpu.unknown_error:
            raise self._error(UNKNOWN)
        if capability and capability in gpu.unsupported:
            raise self._error(NOT_SUPPORTED)
        return gpu

    def _value(self, handle: Any, name: str, read: Callable[[SimGpu], int]) -> int:  # noqa: ANN401
        return read(self._gpu(handle, name))

    def post(self, gpu: SimGpu, event_type: int, data: int) -> None:
        """Deliver an event to every set that registered the GPU for its type."""
        for event_set in self.event_sets:
            if event_set.masks.get(gpu.uuid, 0) & event_type:
                event_set.pending.put(SimEventData(gpu, event_type, data))

    # ---- system ------------------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's name
        """Initialise; fails like a node without the kernel module when the driver is absent."""
        with self._lock:
            self.calls += 1
        if not self.library_installed:
            raise self._error(LIBRARY_NOT_FOUND)
        if not self.driver_loaded:
            raise self._error(DRIVER_NOT_LOADED)
        self._init_count += 1

    def nvmlShutdown(self) -> None:  # noqa: N802 - pynvml's name
        """Drop one reference."""
        self._ready()
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802 - pynvml's name
        """Return the simulated driver version."""
        self._ready()
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:  # noqa: N802 - pynvml's name
        """Return the simulated NVML version."""
        self._ready()
        return NVML_VERSION

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's name
        """Count GPUs, lost ones included (the driver still knows them)."""
        self._ready()
        return len(self.gpus)

    # ---- identity ----------------------------------------------------------------------------

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: ANN401, N802 - pynvml's name
        """Return the GPU as its own handle."""
        self._ready()
        if not 0 <= index < len(self.gpus):
            raise self._error(INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if self._hung:
            self._hold(gpu.uuid)
        if gpu.lost:
            raise self._error(GPU_IS_LOST)
        if gpu.unknown_error:
            raise self._error(UNKNOWN)
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

    # ---- field values ------------------------------------------------------------------------

    def nvmlDeviceGetFieldValues(  # noqa: N802 - pynvml's name
        self,
        handle: Any,  # noqa: ANN401 - opaque handle
        fieldIds: list[tuple[int, int]],  # noqa: N803 - pynvml's name
    ) -> list[SimFieldValue]:
        """Answer each requested field, NOT_SUPPORTED for those the GPU lacks."""
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        # The answer depends only on the GPU's state and the request: reuse the last one while
        # neither changed (a busy simulated cluster asks the same thing many times a second).
        state = _field_state(gpu)
        last = self._answers.get(gpu.uuid)
        if last is not None and last[0] == state and last[1] == fieldIds:
            return last[2]
        known = _fields(gpu)
        out = []
        cache = self._entries  # entries are immutable: reuse one per (field, scope, value)
        for field_id, scope in fieldIds:
            value = known.get((field_id, scope))
            if value is None or field_id in gpu.unsupported or _no_nvlink(gpu, field_id):
                value = -1
            entry = cache.get((field_id, scope, value))
            if entry is None:
                entry = (
                    SimFieldValue(field_id, scope, NOT_SUPPORTED)
                    if value < 0
                    else SimFieldValue(
                        field_id,
                        scope,
                        SUCCESS,
                        FIELD_VALUE_TYPES.get(field_id, VALUE_UNSIGNED_LONG_LONG),
                        SimValue(value),
                    )
                )
                if len(cache) < ENTRY_CACHE_LIMIT:
                    cache[field_id, scope, value] = entry
            out.append(entry)
        self._answers[gpu.uuid] = (state, list(fieldIds), out)
        return out

    # ---- per-call API ------------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:  # noqa: ANN401, N802
        """Return 1 (enabled) or 0; an index past the GPU's links is an invalid argument.

        A GPU without NVLink answers NOT_SUPPORTED, as a real H100 passed into a VM alone does.
        """
        gpu = self._gpu(handle, "nvmlDeviceGetNvLinkState")
        if not gpu.nvlink_up:
            raise self._error(NOT_SUPPORTED)
        if not 0 <= link < len(gpu.nvlink_up):
            raise self._error(INVALID_ARGUMENT)
        return int(gpu.nvlink_up[link])

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:  # noqa: ANN401, N802
        """Return a DL error counter of one link."""
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkErrorCounter")
        if not gpu.nvlink_up:
            raise self._error(NOT_SUPPORTED)
        if not 0 <= link < len(gpu.nvlink_up) or counter not in (0, 1, 2):
            raise self._error(INVALID_ARGUMENT)
        return gpu.nvlink_errors[link][counter]

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:  # noqa: ANN401, N802
        """Return the replay counter (it only grows)."""
        return self._value(handle, "nvmlDeviceGetPcieReplayCounter", lambda g: g.pcie_replays)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:  # noqa: ANN401, N802
        """Return the link generation now."""
        return self._value(handle, "nvmlDeviceGetCurrPcieLinkGeneration", lambda g: g.pcie_gen)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:  # noqa: ANN401, N802
        """Return the link width now."""
        return self._value(handle, "nvmlDeviceGetCurrPcieLinkWidth", lambda g: g.pcie_width)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:  # noqa: ANN401, N802
        """Return the highest generation the link can train to."""
        return self._value(handle, "nvmlDeviceGetMaxPcieLinkGeneration", lambda g: g.max_pcie_gen)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:  # noqa: ANN401, N802
        """Return the widest the link can train to."""
        return self._value(handle, "nvmlDeviceGetMaxPcieLinkWidth", lambda g: g.max_pcie_width)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:  # noqa: ANN401, N802, N803
        """Return one of the four ECC totals."""
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        return (
            (gpu.ecc_sbe_volatile, gpu.ecc_sbe_aggregate),
            (gpu.ecc_dbe_volatile, gpu.ecc_dbe_aggregate),
        )[errorType][counterType]

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:  # noqa: ANN401, N802
        """Return (correctable rows, uncorrectable rows, pending, failure)."""
        gpu = self._gpu(device, "nvmlDeviceGetRemappedRows")
        return (
            gpu.remapped_correctable,
            gpu.remapped_uncorrectable,
            int(gpu.remap_pending),
            int(gpu.remap_failure),
        )

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:  # noqa: ANN401, N802
        """Return the clock-event (throttle) reason bits."""
        name = "nvmlDeviceGetCurrentClocksEventReasons"
        return self._value(handle, name, lambda g: g.clock_event_reasons)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:  # noqa: ANN401, ARG002, N802
        """Return the GPU core temperature in °C."""
        return self._value(handle, "nvmlDeviceGetTemperature", lambda g: g.temperature_c)

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:  # noqa: ANN401, N802
        """Return a temperature threshold in °C: the slowdown one (1) or shutdown (0)."""
        name = "nvmlDeviceGetTemperatureThreshold"
        if threshold == THRESHOLD_SHUTDOWN:
            return self._value(handle, name, lambda g: g.temperature_shutdown_c)
        if threshold != THRESHOLD_SLOWDOWN:
            raise self._error(NOT_SUPPORTED)
        return self._value(handle, name, lambda g: g.temperature_slowdown_c)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:  # noqa: ANN401, N802
        """Return the board power in mW."""
        return self._value(handle, "nvmlDeviceGetPowerUsage", lambda g: g.power_mw)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimUtilization:  # noqa: ANN401, N802
        """Return GPU and memory utilisation in percent."""
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return SimUtilization(gpu.util_gpu, gpu.util_mem)

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:  # noqa: A002, ANN401, ARG002, N802
        """Return the SM clock in MHz."""
        return self._value(handle, "nvmlDeviceGetClockInfo", lambda g: g.sm_clock_mhz)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimProcess]:  # noqa: ANN401, N802
        """Return the compute processes on the GPU."""
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [SimProcess(pid) for pid in gpu.processes]

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802 - pynvml's name
        """Return the CUDA version the driver supports, as NVML encodes it (12080: 12.8)."""
        self._ready()
        return self.cuda_driver_version

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:  # noqa: ANN401, N802
        """Return ``[current, pending]`` ECC modes, as pynvml does (1 enabled, 0 disabled)."""
        gpu = self._gpu(handle, "nvmlDeviceGetEccMode")
        return [gpu.ecc_mode, gpu.ecc_mode_pending]

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:  # noqa: ANN401, N802
        """Return 1 when persistence mode is on."""
        return self._value(handle, "nvmlDeviceGetPersistenceMode", lambda g: g.persistence_mode)

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:  # noqa: ANN401, N802
        """Return the VBIOS version string."""
        return self._gpu(handle, "nvmlDeviceGetVbiosVersion").vbios_version

    # ---- events ------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> SimEventSet:  # noqa: N802 - pynvml's name
        """Create an empty event set."""
        self._ready()
        event_set = SimEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlEventSetFree(self, eventSet: Any) -> None:  # noqa: ANN401, N802, N803
        """Free an event set."""
        self._ready()
        if eventSet in self.event_sets:
            self.event_sets.remove(eventSet)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:  # noqa: ANN401, N802
        """Return the event bits the GPU can deliver."""
        return self._value(handle, "nvmlDeviceGetSupportedEventTypes", lambda _: SUPPORTED_EVENTS)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:  # noqa: ANN401, N802, N803
        """Register the GPU's events of ``eventTypes`` with the set."""
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        event_set: SimEventSet = eventSet
        event_set.masks[gpu.uuid] = event_set.masks.get(gpu.uuid, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> SimEventData:  # noqa: ANN401, N802, N803
        """Block up to ``timeoutms`` for the next event; NVML_ERROR_TIMEOUT when none came.

        While a GPU hangs, the wait blocks past its timeout until the GPU is released.
        """
        self._ready()
        if self._hung:
            self._hold(None)
        event_set: SimEventSet = eventSet
        try:
            return event_set.pending.get(timeout=max(timeoutms, 0) / 1000)
        except queue.Empty:
            raise self._error(TIMEOUT) from None
