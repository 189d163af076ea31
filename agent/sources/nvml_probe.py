"""Ask an NVML library every question the agent asks, and write down how each was answered.

Used two ways: on a real GPU (``scripts/gpu_check.py``) to record what the hardware and driver
answer, and in the tests against the simulator's library, whose answers must match that record
(``tests/fixtures/nvml/``). A probe holds, per call, whether it answered and with what type and
value; identifiers that name one physical GPU (its UUID) are masked, and no serial number is read.
"""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from agent.sources import nvml_fields as fi

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent.sources.nvml_api import NvmlLibrary

NOT_SUPPORTED: Final = 3
FUNCTION_NOT_FOUND: Final = 13
TEMPERATURE_GPU: Final = 0
THRESHOLD_SHUTDOWN: Final = 0
THRESHOLD_SLOWDOWN: Final = 1
CLOCK_SM: Final = 1
MASKED_UUID: Final = "GPU-00000000-0000-0000-0000-000000000000"

Answer = dict[str, Any]


def _plain(value: object) -> object:
    """A JSON-able form of what pynvml returned (structures become their fields)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    fields = getattr(value, "_fields_", None)
    if fields is not None:  # a ctypes structure
        return {name: _plain(getattr(value, name)) for name, *_ in fields}
    return repr(value)


def ask(lib: NvmlLibrary, fn: Callable[[], object]) -> Answer:
    """Call ``fn``: ``{"status": "ok", "type": ..., "value": ...}`` or how it was refused."""
    try:
        value = fn()
    except lib.NVMLError as exc:
        code = int(getattr(exc, "value", -1))
        if code in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
            return {"status": "not_supported", "code": code}
        return {"status": "error", "code": code, "message": str(exc)}
    return {"status": "ok", "type": type(value).__name__, "value": _plain(value)}


def device_calls(lib: NvmlLibrary, handle: Any, links: int) -> dict[str, Callable[[], object]]:  # noqa: ANN401 - opaque handle
    """Every per-GPU call the agent and pre-flight make, by a name that says its arguments."""
    h = handle
    calls: dict[str, Callable[[], object]] = {
        "nvmlDeviceGetName": partial(lib.nvmlDeviceGetName, h),
        "nvmlDeviceGetUUID": partial(lib.nvmlDeviceGetUUID, h),
        "nvmlDeviceGetPciInfo.busId": lambda: lib.nvmlDeviceGetPciInfo(h).busId,
        "nvmlDeviceGetPcieReplayCounter": partial(lib.nvmlDeviceGetPcieReplayCounter, h),
        "nvmlDeviceGetCurrPcieLinkGeneration": partial(lib.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "nvmlDeviceGetCurrPcieLinkWidth": partial(lib.nvmlDeviceGetCurrPcieLinkWidth, h),
        "nvmlDeviceGetMaxPcieLinkGeneration": partial(lib.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "nvmlDeviceGetMaxPcieLinkWidth": partial(lib.nvmlDeviceGetMaxPcieLinkWidth, h),
        "nvmlDeviceGetRemappedRows": partial(lib.nvmlDeviceGetRemappedRows, h),
        "nvmlDeviceGetCurrentClocksEventReasons": partial(
            lib.nvmlDeviceGetCurrentClocksEventReasons, h
        ),
        "nvmlDeviceGetTemperature(GPU)": partial(lib.nvmlDeviceGetTemperature, h, TEMPERATURE_GPU),
        "nvmlDeviceGetTemperatureThreshold(SLOWDOWN)": partial(
            lib.nvmlDeviceGetTemperatureThreshold, h, THRESHOLD_SLOWDOWN
        ),
        "nvmlDeviceGetTemperatureThreshold(SHUTDOWN)": partial(
            lib.nvmlDeviceGetTemperatureThreshold, h, THRESHOLD_SHUTDOWN
        ),
        "nvmlDeviceGetPowerUsage": partial(lib.nvmlDeviceGetPowerUsage, h),
        "nvmlDeviceGetUtilizationRates": lambda: _utilization(lib, h),
        "nvmlDeviceGetClockInfo(SM)": partial(lib.nvmlDeviceGetClockInfo, h, CLOCK_SM),
        "nvmlDeviceGetComputeRunningProcesses": lambda: len(
            lib.nvmlDeviceGetComputeRunningProcesses(h)
        ),
        "nvmlDeviceGetEccMode": lambda: list(lib.nvmlDeviceGetEccMode(h)),
        "nvmlDeviceGetPersistenceMode": partial(lib.nvmlDeviceGetPersistenceMode, h),
        "nvmlDeviceGetVbiosVersion": partial(lib.nvmlDeviceGetVbiosVersion, h),
        "nvmlDeviceGetSupportedEventTypes": partial(lib.nvmlDeviceGetSupportedEventTypes, h),
    }
    for kind, kind_name in ((0, "CORRECTED"), (1, "UNCORRECTED")):
        for counter, counter_name in ((0, "VOLATILE"), (1, "AGGREGATE")):
            calls[f"nvmlDeviceGetTotalEccErrors({kind_name},{counter_name})"] = partial(
                lib.nvmlDeviceGetTotalEccErrors, h, kind, counter
            )
    for link in range(max(links, 1)):  # link 0 even where none is counted: how it is refused
        calls[f"nvmlDeviceGetNvLinkState({link})"] = partial(lib.nvmlDeviceGetNvLinkState, h, link)
        for counter in (0, 1, 2):
            calls[f"nvmlDeviceGetNvLinkErrorCounter({link},{counter})"] = partial(
                lib.nvmlDeviceGetNvLinkErrorCounter, h, link, counter
            )
    return calls


def _utilization(lib: NvmlLibrary, handle: Any) -> dict[str, int]:  # noqa: ANN401 - opaque handle
    rates = lib.nvmlDeviceGetUtilizationRates(handle)
    return {"gpu": int(rates.gpu), "memory": int(rates.memory)}


def field_answers(lib: NvmlLibrary, handle: Any, keys: list[fi.FieldKey]) -> Answer:  # noqa: ANN401
    """One ``nvmlDeviceGetFieldValues`` call: per ``"field:scope"`` its return, type and value."""
    try:
        entries = lib.nvmlDeviceGetFieldValues(handle, keys)
    except lib.NVMLError as exc:
        return {"status": "error", "code": int(getattr(exc, "value", -1))}
    out: dict[str, Any] = {}
    for (field_id, scope), entry in zip(keys, entries, strict=False):
        answer: dict[str, Any] = {"return": int(entry.nvmlReturn)}
        if entry.nvmlReturn == 0:
            answer["valueType"] = int(entry.valueType)
            answer["value"] = fi.decode(entry)
        out[f"{field_id}:{scope}"] = answer
    return {"status": "ok", "fields": out}


def link_count(lib: NvmlLibrary, handle: Any) -> int:  # noqa: ANN401 - opaque handle
    """Field 91's link count, or 0 when the GPU does not answer it."""
    answer = field_answers(lib, handle, [(fi.FI_NVLINK_LINK_COUNT, 0)])
    entry = answer.get("fields", {}).get(f"{fi.FI_NVLINK_LINK_COUNT}:0", {})
    return int(entry.get("value", 0))


def probe(lib: NvmlLibrary, index: int = 0) -> dict[str, Any]:
    """Everything NVML answers about the system and GPU ``index``; NVML must be initialised."""
    system = {
        "nvmlSystemGetDriverVersion": ask(lib, lib.nvmlSystemGetDriverVersion),
        "nvmlSystemGetNVMLVersion": ask(lib, lib.nvmlSystemGetNVMLVersion),
        "nvmlSystemGetCudaDriverVersion": ask(lib, lib.nvmlSystemGetCudaDriverVersion),
        "nvmlDeviceGetCount": ask(lib, lib.nvmlDeviceGetCount),
    }
    handle = lib.nvmlDeviceGetHandleByIndex(index)
    links = link_count(lib, handle)
    calls = {name: ask(lib, fn) for name, fn in device_calls(lib, handle, links).items()}
    uuid = calls["nvmlDeviceGetUUID"]
    if uuid.get("status") == "ok":
        uuid["value"] = MASKED_UUID if str(uuid["value"]).startswith("GPU-") else "masked"
    # The batch the agent asks for, and no more: on a real H100 without NVLink, a batch that
    # also held the link fields once answered NOT_SUPPORTED for field 3 (see docs/signals.md).
    wanted = [(fi.FI_NVLINK_LINK_COUNT, 0), *fi.request(links)]
    found = {
        "system": system,
        "nvlink_count": links,
        "calls": calls,
        "field_values": field_answers(lib, handle, wanted),
    }
    if links == 0:  # how a GPU without NVLink refuses link 0's fields, asked on their own
        link_zero = [(field, 0) for field in fi.LINK_FIELDS]
        found["link_fields_without_links"] = field_answers(lib, handle, link_zero)
    return found


def call_times_us(
    lib: NvmlLibrary,
    index: int = 0,
    repeat: int = 50,
) -> dict[str, float]:
    """Median wall time of each call in microseconds, over ``repeat`` calls."""
    handle = lib.nvmlDeviceGetHandleByIndex(index)
    links = link_count(lib, handle)
    calls = device_calls(lib, handle, links)
    wanted = fi.request(links)
    calls["nvmlDeviceGetFieldValues(poll batch)"] = partial(
        lib.nvmlDeviceGetFieldValues, handle, wanted
    )
    out: dict[str, float] = {}
    for name, fn in calls.items():
        times = []
        for _ in range(repeat):
            began = time.perf_counter_ns()
            ask(lib, fn)
            times.append(time.perf_counter_ns() - began)
        out[name] = round(statistics.median(times) / 1000, 1)
    return out


def differences(real: dict[str, Any], sim: dict[str, Any]) -> list[str]:
    """Where the simulator's probe answers otherwise than the real one: status, type, fields.

    Values that move (temperature, power, clocks) are not compared; whether a call answers, the
    type it answers with, the link count and each field's return code and value type are.
    """
    out: list[str] = []
    if real.get("nvlink_count") != sim.get("nvlink_count"):
        out.append(f"nvlink_count: real {real.get('nvlink_count')}, sim {sim.get('nvlink_count')}")
    for section in ("system", "calls"):
        real_calls: dict[str, Answer] = real.get(section, {})
        sim_calls: dict[str, Answer] = sim.get(section, {})
        for name in sorted(set(real_calls) | set(sim_calls)):
            a, b = real_calls.get(name, {}), sim_calls.get(name, {})
            left = (a.get("status"), a.get("code"), a.get("type"))
            right = (b.get("status"), b.get("code"), b.get("type"))
            if left != right:
                out.append(f"{name}: real {left}, sim {right}")
    for section in ("field_values", "link_fields_without_links"):
        out.extend(_field_differences(section, real, sim))
    return out


def _field_differences(section: str, real: dict[str, Any], sim: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if section not in real:  # a record made before the section was asked for
        return out
    real_fields = real.get(section, {}).get("fields", {})
    sim_fields = sim.get(section, {}).get("fields", {})
    for key in sorted(set(real_fields) | set(sim_fields)):
        a, b = real_fields.get(key, {}), sim_fields.get(key, {})
        real_answer = (a.get("return"), a.get("valueType"))
        sim_answer = (b.get("return"), b.get("valueType"))
        if real_answer != sim_answer:
            out.append(f"field {key}: real {real_answer}, sim {sim_answer}")
    return out
