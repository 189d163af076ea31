# Local type stubs for the part of nvidia-ml-py (pynvml) that fleetwatch calls.
# Handles are opaque; everything else is typed the way pynvml returns it.
from typing import Any

NVML_FEATURE_ENABLED: int
NVML_NVLINK_MAX_LINKS: int
NVML_ERROR_UNINITIALIZED: int
NVML_ERROR_INVALID_ARGUMENT: int
NVML_ERROR_NOT_SUPPORTED: int
NVML_ERROR_NO_PERMISSION: int
NVML_ERROR_DRIVER_NOT_LOADED: int
NVML_ERROR_LIBRARY_NOT_FOUND: int
NVML_ERROR_FUNCTION_NOT_FOUND: int
NVML_ERROR_GPU_IS_LOST: int
NVML_ERROR_UNKNOWN: int

class NVMLError(Exception):
    value: int
    def __new__(cls, value: int) -> NVMLError: ...

class c_nvmlPciInfo_t:
    busId: str
    busIdLegacy: str
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int

def nvmlInit() -> None: ...
def nvmlShutdown() -> None: ...
def nvmlSystemGetDriverVersion() -> str: ...
def nvmlSystemGetNVMLVersion() -> str: ...
def nvmlDeviceGetCount() -> int: ...
def nvmlDeviceGetHandleByIndex(index: int) -> Any: ...
def nvmlDeviceGetUUID(handle: Any) -> str: ...
def nvmlDeviceGetName(handle: Any) -> str: ...
def nvmlDeviceGetPciInfo(handle: Any) -> c_nvmlPciInfo_t: ...
def nvmlDeviceGetNvLinkState(handle: Any, link: int) -> int: ...
def nvmlDeviceGetPcieReplayCounter(handle: Any) -> int: ...
