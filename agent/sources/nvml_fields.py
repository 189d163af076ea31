"""NVML field ids the agent batches into one ``nvmlDeviceGetFieldValues`` call per GPU.

Numbers are NVML's (``nvml.h``); the per-link NVLink fields take the link index as scope id, the
way Hopper and later want them. Decoding follows ``nvmlValueType_t``.
"""

from __future__ import annotations

from typing import Final, Protocol

FI_ECC_SBE_VOL_TOTAL: Final = 3
FI_ECC_DBE_VOL_TOTAL: Final = 4
FI_ECC_SBE_AGG_TOTAL: Final = 5
FI_ECC_DBE_AGG_TOTAL: Final = 6
FI_NVLINK_LINK_COUNT: Final = 91
FI_PCIE_REPLAY_COUNTER: Final = 94
FI_REMAPPED_COR: Final = 142
FI_REMAPPED_UNC: Final = 143
FI_REMAPPED_PENDING: Final = 144
FI_REMAPPED_FAILURE: Final = 145
FI_NVLINK_ERROR_DL_REPLAY: Final = 161
FI_NVLINK_ERROR_DL_RECOVERY: Final = 162
FI_NVLINK_ERROR_DL_CRC: Final = 163
FI_NVLINK_GET_STATE: Final = 165

DEVICE_FIELDS: Final = (
    FI_PCIE_REPLAY_COUNTER,
    FI_ECC_SBE_VOL_TOTAL,
    FI_ECC_DBE_VOL_TOTAL,
    FI_ECC_SBE_AGG_TOTAL,
    FI_ECC_DBE_AGG_TOTAL,
    FI_REMAPPED_COR,
    FI_REMAPPED_UNC,
    FI_REMAPPED_PENDING,
    FI_REMAPPED_FAILURE,
)
# Read at the counter interval, not every poll: on a real H100 (driver 580.159.04) the PCIe
# replay counter is about three quarters of a GPU's read (0.17 ms of CPU without it, 0.48-0.64
# with it; docs/performance.md, "The NVML library on a real GPU").
SLOW_FIELDS: Final = frozenset({(FI_PCIE_REPLAY_COUNTER, 0)})
LINK_FIELDS: Final = (
    FI_NVLINK_GET_STATE,
    FI_NVLINK_ERROR_DL_REPLAY,
    FI_NVLINK_ERROR_DL_RECOVERY,
    FI_NVLINK_ERROR_DL_CRC,
)

VALUE_DOUBLE: Final = 0
VALUE_UNSIGNED_LONG_LONG: Final = 3  # what counters come as: read without a lookup
_UNION_MEMBER: Final = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}

FieldKey = tuple[int, int]  # (field id, scope id)


class FieldValue(Protocol):
    """One entry of the array ``nvmlDeviceGetFieldValues`` fills (``nvmlFieldValue_t``)."""

    @property
    def fieldId(self) -> int:  # noqa: N802 - NVML's name
        """The field asked for."""
        ...

    @property
    def scopeId(self) -> int:  # noqa: N802 - NVML's name
        """The scope (link index for per-link NVLink fields)."""
        ...

    @property
    def nvmlReturn(self) -> int:  # noqa: N802 - NVML's name
        """NVML's return code for this entry alone."""
        ...

    @property
    def valueType(self) -> int:  # noqa: N802 - NVML's name
        """Which member of ``value`` holds the number."""
        ...

    @property
    def value(self) -> object:
        """The ``nvmlValue_t`` union."""
        ...


def request(nvlinks: int) -> list[FieldKey]:
    """Every field we would like from a GPU with ``nvlinks`` links, before probing."""
    keys: list[FieldKey] = [(field, 0) for field in DEVICE_FIELDS]
    keys += [(field, link) for link in range(nvlinks) for field in LINK_FIELDS]
    return keys


def decode(entry: FieldValue) -> int | float:
    """Read the number out of a successful entry according to its value type."""
    member = _UNION_MEMBER.get(int(entry.valueType))
    if member is None:
        msg = f"field {entry.fieldId}: unknown NVML value type {entry.valueType}"
        raise ValueError(msg)
    raw = getattr(entry.value, member)
    return float(raw) if entry.valueType == VALUE_DOUBLE else int(raw)
