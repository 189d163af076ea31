"""NVML source: GPU identity, NVLink state and errors, PCIe, ECC, row remapping, clocks, power.

The NVML *library* is injected: production passes the ``pynvml`` module (imported lazily by
:func:`load_pynvml`), the simulator passes :class:`agent.sim.nvml_lib.SimNvmlLibrary`, which
offers the same functions and raises pynvml's own exception classes. So the code below is the
code that runs against real GPUs, in tests and in the demo alike.

Per poll and GPU: one ``nvmlDeviceGetFieldValues`` batch for what the GPU supports as fields,
the per-call API for what it supports only that way, and nothing for what it supports neither
way. What is supported is found once, at :meth:`NvmlSource.identify`, and remembered; a call that
later says NOT_SUPPORTED is dropped for good. No call on the poll path blocks (no 20 ms PCIe
throughput sampling).

Every public method runs its NVML calls on the worker thread of an
:class:`~agent.sources.nvml_guard.NvmlGuard` and waits at most ``call_timeout_s`` for them: a call
that hangs raises :class:`~agent.sources.nvml_guard.NvmlHungError`, and so does every call after it
until it returns.
:meth:`NvmlSource.guarded` runs a caller's batch (every GPU of a poll) in one hand-off.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TypeVar

from agent.exceptions import GpuLostError, NvmlError
from agent.probes.pci import normalize_bus_id
from agent.sources import nvml_fields as fi
from agent.sources.nvml_guard import DEFAULT_TIMEOUT_S, NvmlGuard

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent.sources.nvml_api import NvmlLibrary

T = TypeVar("T")

# NVML return codes (nvml.h); stable across driver versions.
SUCCESS: Final = 0
ERROR_INVALID_ARGUMENT: Final = 2
ERROR_NOT_SUPPORTED: Final = 3
ERROR_LIBRARY_NOT_FOUND: Final = 12  # nvmlInit: libnvidia-ml.so.1 is not installed
ERROR_FUNCTION_NOT_FOUND: Final = 13
ERROR_GPU_IS_LOST: Final = 15
_UNSUPPORTED: Final = frozenset({ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND})

FEATURE_ENABLED: Final = 1
NVLINK_MAX_LINKS: Final = 36
CLOCK_SM: Final = 1
TEMPERATURE_GPU: Final = 0
TEMPERATURE_THRESHOLD_SLOWDOWN: Final = 1  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
MEMORY_ERROR_CORRECTED: Final = 0
MEMORY_ERROR_UNCORRECTED: Final = 1
ECC_VOLATILE: Final = 0
ECC_AGGREGATE: Final = 1
NVLINK_ERROR_COUNTERS: Final = (0, 1, 2)  # DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT


def load_pynvml() -> NvmlLibrary:
    """Import the real pynvml module (it loads libnvidia-ml only when ``nvmlInit`` runs)."""
    import pynvml  # noqa: PLC0415 - imported only where real NVML is wanted

    return pynvml


def nvml_library_installed(name: str = "libnvidia-ml.so.1") -> bool:
    """Whether NVML's library loads, as pynvml loads it (no call into it, so nothing can hang)."""
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What does not change while the GPU is on the bus."""

    index: int
    uuid: str
    pci_bus_id: str
    model: str
    nvlink_count: int
    max_pcie_gen: int | None = None
    max_pcie_width: int | None = None


class NvlinkReading(NamedTuple):
    """One NVLink. ``None`` marks what this GPU does not report.

    A NamedTuple so that a GPU's 18 links compare with the last poll's in C.
    """

    up: bool | None
    replay_errors: int | None = None
    recovery_errors: int | None = None
    crc_errors: int | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One poll of one GPU. ``None`` marks a value this GPU does not support."""

    nvlinks: tuple[NvlinkReading, ...] = ()
    pcie_replay_count: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    clock_event_reasons: int | None = None
    temperature_c: int | None = None
    temperature_slowdown_c: int | None = None  # where the GPU starts slowing itself down
    power_w: float | None = None
    gpu_util_pct: int | None = None
    mem_util_pct: int | None = None
    sm_clock_mhz: int | None = None

    @property
    def nvlink_up(self) -> tuple[bool, ...]:
        """Link states, a link of unknown state counted as down."""
        return tuple(bool(link.up) for link in self.nvlinks)


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What pre-flight's quick checks read of a GPU that polls do not. ``None``: unsupported."""

    ecc_enabled: bool | None  # the current ECC mode (a pending change shows after a reset)
    ecc_pending: bool | None
    persistence_mode: bool | None
    vbios_version: str | None


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version (``12080``) as people write it (``12.8``)."""
    return f"{version // 1000}.{version % 1000 // 10}"


@dataclass(slots=True)
class _Plan:
    """What one GPU supports, probed once."""

    fields: list[fi.FieldKey] = field(default_factory=list)
    fast_fields: list[fi.FieldKey] = field(default_factory=list)  # without the slow counters
    batched: frozenset[fi.FieldKey] = frozenset()
    links_batched: bool = False
    unsupported: set[str] = field(default_factory=set)
    # The slowdown temperature threshold: fixed per GPU model, read at the first poll only.
    slowdown_read: bool = False
    slowdown_c: int | None = None


class NvmlSource:
    """Reads GPUs through an injected NVML library and translates its errors at the boundary."""

    __slots__ = ("_handles", "_lib", "_plans", "_started", "calls", "guard")

    def __init__(self, lib: NvmlLibrary, call_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Keep the library; nothing is called until :meth:`start`.

        ``call_timeout_s`` bounds each public method (and each :meth:`guarded` batch).
        """
        self._lib = lib
        self._handles: dict[int, Any] = {}
        self._plans: dict[int, _Plan] = {}
        self._started = False
        self.calls = 0
        self.guard = NvmlGuard(call_timeout_s)

    def guarded(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (which may call this source's methods) under the deadline, in one hand-off.

        Raises :class:`~agent.sources.nvml_guard.NvmlHungError` when it does not return in time, or
        at once while an earlier call is still stuck.
        """
        return self.guard.run(what, fn)

    def close(self) -> None:
        """Let the worker thread end (NVML itself stays initialised: see :meth:`stop`)."""
        self.guard.close()

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        self.calls += 1
        try:
            return fn()
        except self._lib.NVMLError as exc:
            code = int(getattr(exc, "value", -1))
            msg = f"{what}: {exc}"
            if code == ERROR_GPU_IS_LOST:
                raise GpuLostError(code, msg) from exc
            raise NvmlError(code, msg) from exc

    def _optional(self, plan: _Plan, key: str, fn: Callable[[], T]) -> T | None:
        """Call ``fn`` unless ``key`` is known unsupported; NOT_SUPPORTED marks it so."""
        if key in plan.unsupported:
            return None
        try:
            return self._call(key, fn)
        except GpuLostError:
            raise
        except NvmlError as exc:
            if exc.code in _UNSUPPORTED or exc.code == ERROR_INVALID_ARGUMENT:
                plan.unsupported.add(key)
                return None
            raise

    def start(self) -> tuple[str, str]:
        """Initialise NVML; return (driver version, NVML version)."""
        return self.guard.run("nvmlInit", self._start)

    def _start(self) -> tuple[str, str]:
        lib = self._lib
        self._call("nvmlInit", lib.nvmlInit)
        self._started = True
        driver = self._call("nvmlSystemGetDriverVersion", lib.nvmlSystemGetDriverVersion)
        version = self._call("nvmlSystemGetNVMLVersion", lib.nvmlSystemGetNVMLVersion)
        return driver, version

    def stop(self) -> None:
        """Shut NVML down (reference-counted by NVML itself), and end the worker thread."""
        try:
            if self._started:
                self._started = False
                self._handles.clear()
                shutdown = partial(self._call, "nvmlShutdown", self._lib.nvmlShutdown)
                self.guard.run("nvmlShutdown", shutdown)
        finally:
            self.close()

    def device_count(self) -> int:
        """Return how many GPUs the driver reports (lost ones included)."""
        count = partial(self._call, "nvmlDeviceGetCount", self._lib.nvmlDeviceGetCount)
        return self.guard.run("nvmlDeviceGetCount", count)

    def handle(self, index: int) -> Any:  # noqa: ANN401 - NVML handles are opaque
        """Return (and cache) the NVML handle of GPU ``index``."""
        return self.guard.run(f"handle of GPU {index}", partial(self._handle, index))

    def _handle(self, index: int) -> Any:  # noqa: ANN401 - NVML handles are opaque
        handle = self._handles.get(index)
        if handle is None:
            handle = self._call(
                f"nvmlDeviceGetHandleByIndex({index})",
                partial(self._lib.nvmlDeviceGetHandleByIndex, index),
            )
            self._handles[index] = handle
        return handle

    def forget(self, index: int) -> None:
        """Drop a cached handle and plan, so a GPU back on the bus is probed afresh."""
        self._handles.pop(index, None)
        self._plans.pop(index, None)

    def identify(self, index: int) -> GpuIdentity:
        """Read the identity of GPU ``index`` and probe, once, what it can report."""
        return self.guard.run(f"identify GPU {index}", partial(self._identify, index))

    def _identify(self, index: int) -> GpuIdentity:
        lib = self._lib
        handle = self._handle(index)
        uuid = self._call("nvmlDeviceGetUUID", partial(lib.nvmlDeviceGetUUID, handle))
        model = self._call("nvmlDeviceGetName", partial(lib.nvmlDeviceGetName, handle))
        pci = self._call("nvmlDeviceGetPciInfo", partial(lib.nvmlDeviceGetPciInfo, handle))
        plan = _Plan()
        links = self._count_nvlinks(handle, plan)
        plan.fields = self._probe_fields(handle, plan, links)
        plan.fast_fields = [key for key in plan.fields if key not in fi.SLOW_FIELDS]
        plan.batched = frozenset(plan.fields)
        plan.links_batched = all(
            (field_id, link) in plan.batched for link in range(links) for field_id in fi.LINK_FIELDS
        )
        self._plans[index] = plan
        return GpuIdentity(
            index=index,
            uuid=uuid,
            pci_bus_id=normalize_bus_id(pci.busId),
            model=model,
            nvlink_count=links,
            max_pcie_gen=self._optional(
                plan,
                "max_pcie_gen",
                partial(lib.nvmlDeviceGetMaxPcieLinkGeneration, handle),
            ),
            max_pcie_width=self._optional(
                plan,
                "max_pcie_width",
                partial(lib.nvmlDeviceGetMaxPcieLinkWidth, handle),
            ),
        )

    def _count_nvlinks(self, handle: Any, plan: _Plan) -> int:  # noqa: ANN401 - opaque handle
        """Ask the device for its link count (field 91); else probe links until one is refused.

        NVML_NVLINK_MAX_LINKS is a bound (36 since v590), not a count.
        """
        values = self._fields(handle, plan, [(fi.FI_NVLINK_LINK_COUNT, 0)])
        count = values.get((fi.FI_NVLINK_LINK_COUNT, 0))
        if count is not None:
            return int(count)
        lib = self._lib
        for link in range(NVLINK_MAX_LINKS):
            state = self._optional(
                _Plan(),
                "nvlink_state",
                partial(lib.nvmlDeviceGetNvLinkState, handle, link),
            )
            if state is None:
                return link
        return NVLINK_MAX_LINKS

    def _probe_fields(self, handle: Any, plan: _Plan, links: int) -> list[fi.FieldKey]:  # noqa: ANN401
        """Ask once for every field; keep those the GPU answers."""
        wanted = fi.request(links)
        return sorted(self._fields(handle, plan, wanted))

    def _fields(
        self,
        handle: Any,  # noqa: ANN401 - opaque handle
        plan: _Plan,
        keys: list[fi.FieldKey],
    ) -> dict[fi.FieldKey, int | float]:
        """One ``nvmlDeviceGetFieldValues`` call; entries that failed are left out."""
        if not keys:
            return {}
        entries = self._optional(
            plan,
            "field_values",
            partial(self._lib.nvmlDeviceGetFieldValues, handle, keys),
        )
        values: dict[fi.FieldKey, int | float] = {}
        # NVML fills the array in the order asked, so the keys need not be read back.
        for key, entry in zip(keys, entries or (), strict=False):
            status = entry.nvmlReturn
            if status == SUCCESS:
                values[key] = (
                    entry.value.ullVal  # type: ignore[attr-defined]
                    if entry.valueType == fi.VALUE_UNSIGNED_LONG_LONG
                    else fi.decode(entry)
                )
            elif status == ERROR_GPU_IS_LOST:
                msg = f"nvmlDeviceGetFieldValues: field {key[0]}: GPU is lost"
                raise GpuLostError(ERROR_GPU_IS_LOST, msg)
        return values

    def compute_processes(self, gpu: GpuIdentity) -> list[int]:
        """Pids of the compute processes using the GPU (GpuLostError when it is gone)."""
        what = f"compute processes of GPU {gpu.index}"
        return self.guard.run(what, partial(self._compute_processes, gpu))

    def _compute_processes(self, gpu: GpuIdentity) -> list[int]:
        handle = self._handle(gpu.index)
        processes = self._call(
            "nvmlDeviceGetComputeRunningProcesses",
            partial(self._lib.nvmlDeviceGetComputeRunningProcesses, handle),
        )
        return [int(p.pid) for p in processes]

    def cuda_driver_version(self) -> int | None:
        """The CUDA version the driver supports (``12080`` for 12.8); None when not known."""
        return self.guard.run("nvmlSystemGetCudaDriverVersion", self._cuda_driver_version)

    def _cuda_driver_version(self) -> int | None:
        try:
            return int(
                self._call(
                    "nvmlSystemGetCudaDriverVersion", self._lib.nvmlSystemGetCudaDriverVersion
                ),
            )
        except NvmlError as exc:
            if exc.code in _UNSUPPORTED:
                return None
            raise

    def facts(self, gpu: GpuIdentity) -> GpuFacts:
        """ECC mode, persistence mode and VBIOS of one GPU (GpuLostError when it is gone)."""
        return self.guard.run(f"facts of GPU {gpu.index}", partial(self._facts, gpu))

    def _facts(self, gpu: GpuIdentity) -> GpuFacts:
        lib = self._lib
        h = self._handle(gpu.index)
        plan = _Plan()  # asked rarely: probe afresh, keeping the poll's plan as it is
        ecc = self._optional(plan, "ecc_mode", partial(lib.nvmlDeviceGetEccMode, h))
        persistence = self._optional(
            plan, "persistence_mode", partial(lib.nvmlDeviceGetPersistenceMode, h)
        )
        vbios = self._optional(plan, "vbios", partial(lib.nvmlDeviceGetVbiosVersion, h))
        return GpuFacts(
            ecc_enabled=None if ecc is None else int(ecc[0]) == FEATURE_ENABLED,
            ecc_pending=None if ecc is None else int(ecc[1]) == FEATURE_ENABLED,
            persistence_mode=None if persistence is None else persistence == FEATURE_ENABLED,
            vbios_version=None if vbios is None else str(vbios),
        )

    def read(self, gpu: GpuIdentity, *, counters: bool = True) -> GpuReading:
        """Poll one GPU. Raises :class:`GpuLostError` when it has fallen off the bus.

        ``counters=False`` leaves out the slow counters (:data:`~agent.sources.nvml_fields.
        SLOW_FIELDS`: the PCIe replay counter), which the agent reads at its counter interval;
        they are None in that reading.
        """
        return self.guard.run(f"read GPU {gpu.index}", partial(self._read, gpu, counters=counters))

    def _slowdown(self, plan: _Plan, handle: Any) -> int | None:  # noqa: ANN401 - NVML's
        """The GPU's slowdown temperature threshold (°C), asked once; None: not supported."""
        if not plan.slowdown_read:
            read = partial(
                self._lib.nvmlDeviceGetTemperatureThreshold, handle, TEMPERATURE_THRESHOLD_SLOWDOWN
            )
            plan.slowdown_c = self._optional(plan, "temperature_slowdown", read)
            plan.slowdown_read = True
        return plan.slowdown_c

    def _read(self, gpu: GpuIdentity, *, counters: bool = True) -> GpuReading:
        lib = self._lib
        h = self._handle(gpu.index)
        plan = self._plans.setdefault(gpu.index, _Plan())
        got = self._fields(h, plan, plan.fields if counters else plan.fast_fields)
        batched = plan.batched

        def pick(key: fi.FieldKey, name: str, fn: Callable[..., int], *args: int) -> int | None:
            """The batch's value; else the per-call API's, unless known unsupported."""
            value = got.get(key)
            if value is not None:
                return int(value)
            if key in batched:  # asked for in the batch, but no answer this time
                return None
            return self._optional(plan, name, partial(fn, h, *args))

        nvlinks = []
        if plan.links_batched:  # the common case: every link field came in the batch
            for link in range(gpu.nvlink_count):
                state = got.get((fi.FI_NVLINK_GET_STATE, link))
                replay = got.get((fi.FI_NVLINK_ERROR_DL_REPLAY, link))
                recovery = got.get((fi.FI_NVLINK_ERROR_DL_RECOVERY, link))
                crc = got.get((fi.FI_NVLINK_ERROR_DL_CRC, link))
                nvlinks.append(
                    NvlinkReading(
                        up=None if state is None else state == FEATURE_ENABLED,
                        replay_errors=None if replay is None else int(replay),
                        recovery_errors=None if recovery is None else int(recovery),
                        crc_errors=None if crc is None else int(crc),
                    ),
                )
        for link in range(0 if plan.links_batched else gpu.nvlink_count):
            state = pick(
                (fi.FI_NVLINK_GET_STATE, link),
                "nvlink_state",
                lib.nvmlDeviceGetNvLinkState,
                link,
            )
            errors = [
                pick(
                    (field_id, link),
                    f"nvlink_error_{c}",
                    lib.nvmlDeviceGetNvLinkErrorCounter,
                    link,
                    c,
                )
                for field_id, c in zip(fi.LINK_FIELDS[1:], NVLINK_ERROR_COUNTERS, strict=True)
            ]
            nvlinks.append(
                NvlinkReading(
                    up=None if state is None else state == FEATURE_ENABLED,
                    replay_errors=errors[0],
                    recovery_errors=errors[1],
                    crc_errors=errors[2],
                ),
            )
        ecc = [
            pick(
                (field_id, 0),
                f"ecc_{kind}_{counter}",
                lib.nvmlDeviceGetTotalEccErrors,
                kind,
                counter,
            )
            for field_id, kind, counter in (
                (fi.FI_ECC_SBE_VOL_TOTAL, MEMORY_ERROR_CORRECTED, ECC_VOLATILE),
                (fi.FI_ECC_DBE_VOL_TOTAL, MEMORY_ERROR_UNCORRECTED, ECC_VOLATILE),
                (fi.FI_ECC_SBE_AGG_TOTAL, MEMORY_ERROR_CORRECTED, ECC_AGGREGATE),
                (fi.FI_ECC_DBE_AGG_TOTAL, MEMORY_ERROR_UNCORRECTED, ECC_AGGREGATE),
            )
        ]
        remap = self._remap(h, plan, got)
        util = self._optional(plan, "utilization", partial(lib.nvmlDeviceGetUtilizationRates, h))
        power_mw = self._optional(plan, "power", partial(lib.nvmlDeviceGetPowerUsage, h))
        return GpuReading(
            nvlinks=tuple(nvlinks),
            pcie_replay_count=pick(
                (fi.FI_PCIE_REPLAY_COUNTER, 0),
                "pcie_replay",
                lib.nvmlDeviceGetPcieReplayCounter,
            )
            if counters
            else None,
            pcie_gen=self._optional(
                plan,
                "pcie_gen",
                partial(lib.nvmlDeviceGetCurrPcieLinkGeneration, h),
            ),
            pcie_width=self._optional(
                plan,
                "pcie_width",
                partial(lib.nvmlDeviceGetCurrPcieLinkWidth, h),
            ),
            ecc_sbe_volatile=ecc[0],
            ecc_dbe_volatile=ecc[1],
            ecc_sbe_aggregate=ecc[2],
            ecc_dbe_aggregate=ecc[3],
            remapped_correctable=remap[0],
            remapped_uncorrectable=remap[1],
            remap_pending=None if remap[2] is None else bool(remap[2]),
            remap_failure=None if remap[3] is None else bool(remap[3]),
            clock_event_reasons=self._optional(
                plan,
                "clock_event_reasons",
                partial(lib.nvmlDeviceGetCurrentClocksEventReasons, h),
            ),
            temperature_c=self._optional(
                plan,
                "temperature",
                partial(lib.nvmlDeviceGetTemperature, h, TEMPERATURE_GPU),
            ),
            temperature_slowdown_c=self._slowdown(plan, h),
            power_w=None if power_mw is None else power_mw / 1000,
            gpu_util_pct=None if util is None else int(util.gpu),
            mem_util_pct=None if util is None else int(util.memory),
            sm_clock_mhz=self._optional(
                plan,
                "sm_clock",
                partial(lib.nvmlDeviceGetClockInfo, h, CLOCK_SM),
            ),
        )

    def _remap(
        self,
        handle: Any,  # noqa: ANN401 - opaque handle
        plan: _Plan,
        got: dict[fi.FieldKey, int | float],
    ) -> tuple[int | None, int | None, int | None, int | None]:
        """Remapped rows from the batch, else from ``nvmlDeviceGetRemappedRows``."""
        keys = [(f, 0) for f in (fi.FI_REMAPPED_COR, fi.FI_REMAPPED_UNC)]
        keys += [(f, 0) for f in (fi.FI_REMAPPED_PENDING, fi.FI_REMAPPED_FAILURE)]
        if all(key in plan.batched for key in keys):
            values = [got.get(key) for key in keys]
            return tuple(None if v is None else int(v) for v in values)  # type: ignore[return-value]
        rows = self._optional(
            plan,
            "remapped_rows",
            partial(self._lib.nvmlDeviceGetRemappedRows, handle),
        )
        if rows is None:
            return None, None, None, None
        return int(rows[0]), int(rows[1]), int(rows[2]), int(rows[3])
