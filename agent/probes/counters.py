"""Deltas and rates from successive readings of monotonic hardware counters.

A pure module: callers pass every reading with the time it was taken (seconds on a monotonic
clock), nothing here reads a clock or a file.

Rules, applied by :func:`counter_delta` when a reading is compared with the one before it:

* **First reading** of a counter: kind ``FIRST``, no delta and no rate yet.
* **Saturating counters** (the narrow IBA PortCounters, e.g. 8-bit ``link_downed`` at 255 or
  16-bit ``symbol_error`` at 65535) stop at their maximum instead of wrapping. A reading at the
  maximum is kind ``SATURATED``: the delta and the rate are only lower bounds, and when the
  previous reading was already at the maximum the rate is unknown (``None``), never zero.
* **A decrease** on a saturating counter is a reset (driver reload, HCA reset, ``perfquery -R``):
  kind ``RESET`` and the delta is the new value (everything counted since the reset).
* **A decrease** on a wrapping counter is a wrap when the forward distance modulo the counter's
  range is at most a quarter of that range (the counter was near its top and is now near zero);
  the delta is that distance, kind ``WRAPPED``. Any other decrease (including one from a value
  the counter's width cannot hold, i.e. a wrong spec) is a ``RESET``. For a 64-bit
  counter this means a wrap is only believed when the previous value was above 3/4 of 2**64,
  which no real counter reaches, so in practice every decrease of a 64-bit counter is a reset.
* A rate needs a positive elapsed time; a reading taken at the same or an earlier time than the
  previous one gives a delta but ``rate=None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Hashable, Mapping

__all__ = [
    "DEFAULT_SPEC",
    "IB_COUNTER_SPECS",
    "IB_COUNTER_WIDTH_BITS",
    "IB_DATA_COUNTERS",
    "IB_DATA_OCTETS_PER_UNIT",
    "IB_NARROW_COUNTER_SPECS",
    "MLX5_HW_COUNTER_SPECS",
    "CounterDelta",
    "CounterSample",
    "CounterSpec",
    "CounterTracker",
    "DeltaKind",
    "counter_delta",
]


@dataclass(frozen=True, slots=True)
class CounterSpec:
    """How a counter behaves at its top: ``width_bits`` wide, counting in ``unit`` steps.

    ``unit`` is what one step of the hardware counter is worth after conversion, e.g. 4 for IB
    data counters that count 4-octet words but are reported in bytes.
    """

    width_bits: int
    saturates: bool
    unit: int = 1

    @property
    def max_value(self) -> int:
        """The largest value the (converted) counter can show."""
        return ((1 << self.width_bits) - 1) * self.unit

    @property
    def modulus(self) -> int:
        """Where a wrapping counter goes back to zero."""
        return (1 << self.width_bits) * self.unit


# Widths in bits of the IBA PortCounters under ``counters/`` (kernel drivers/infiniband/core/
# sysfs.c; the data and packet counters are the 64-bit PortCountersExtended, which every
# ConnectX HCA supports). Keyed by sysfs file name.
IB_COUNTER_WIDTH_BITS: Mapping[str, int] = MappingProxyType(
    {
        "symbol_error": 16,
        "link_error_recovery": 8,
        "link_downed": 8,
        "port_rcv_errors": 16,
        "port_rcv_remote_physical_errors": 16,
        "port_rcv_switch_relay_errors": 16,
        "port_xmit_discards": 16,
        "port_xmit_constraint_errors": 8,
        "port_rcv_constraint_errors": 8,
        "local_link_integrity_errors": 4,
        "excessive_buffer_overrun_errors": 4,
        "VL15_dropped": 16,
        "port_xmit_wait": 32,
        "port_xmit_data": 64,
        "port_rcv_data": 64,
        "port_xmit_packets": 64,
        "port_rcv_packets": 64,
        "unicast_xmit_packets": 64,
        "unicast_rcv_packets": 64,
        "multicast_xmit_packets": 64,
        "multicast_rcv_packets": 64,
    },
)

# The data counters count octets divided by 4; the sysfs reader reports them in bytes under these
# names: raw file name -> reported name.
IB_DATA_OCTETS_PER_UNIT = 4
IB_DATA_COUNTERS: Mapping[str, str] = MappingProxyType(
    {"port_xmit_data": "port_xmit_bytes", "port_rcv_data": "port_rcv_bytes"},
)

# PortCounters (the narrow ones) saturate; the 64-bit extended counters are treated as wrapping.
IB_COUNTER_SPECS: Mapping[str, CounterSpec] = MappingProxyType(
    {
        **{
            name: CounterSpec(bits, saturates=bits < 64)  # noqa: PLR2004 - 64-bit = extended set
            for name, bits in IB_COUNTER_WIDTH_BITS.items()
        },
        **{
            out: CounterSpec(
                IB_COUNTER_WIDTH_BITS[raw], saturates=False, unit=IB_DATA_OCTETS_PER_UNIT
            )
            for raw, out in IB_DATA_COUNTERS.items()
        },
    },
)

# An HCA without PortCountersExtended gives the data and packet counters from PortCounters: 32
# bits, stopping at their top (a 200 Gb/s port fills port_xmit_data's 2**32 words in 0.7 s).
IB_NARROW_COUNTERS = (
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
)
IB_NARROW_COUNTER_SPECS: Mapping[str, CounterSpec] = MappingProxyType(
    {
        **IB_COUNTER_SPECS,
        **{name: CounterSpec(32, saturates=True) for name in IB_NARROW_COUNTERS},
        **{
            out: CounterSpec(32, saturates=True, unit=IB_DATA_OCTETS_PER_UNIT)
            for out in IB_DATA_COUNTERS.values()
        },
    },
)

# mlx5 ``hw_counters/``: the Q counters are 32-bit firmware counters (QUERY_Q_COUNTER) that wrap;
# the congestion counters are 64-bit (high/low pairs). Unknown names get DEFAULT_SPEC.
_MLX5_CONG = ("rp_cnp_ignored", "rp_cnp_handled", "np_ecn_marked_roce_packets", "np_cnp_sent")
_MLX5_Q = (
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
)
MLX5_HW_COUNTER_SPECS: Mapping[str, CounterSpec] = MappingProxyType(
    {
        **{name: CounterSpec(32, saturates=False) for name in _MLX5_Q},
        **{name: CounterSpec(64, saturates=False) for name in _MLX5_CONG},
    },
)
DEFAULT_SPEC = CounterSpec(64, saturates=False)


class DeltaKind(StrEnum):
    """What happened to a counter between two readings."""

    FIRST = "first"
    OK = "ok"
    RESET = "reset"
    WRAPPED = "wrapped"
    SATURATED = "saturated"


@dataclass(frozen=True, slots=True)
class CounterSample:
    """One reading of a counter, taken at ``at`` seconds on a monotonic clock."""

    value: int
    at: float


@dataclass(frozen=True, slots=True)
class CounterDelta:
    """The change of a counter since its previous reading.

    ``delta`` and ``rate`` (per second) are ``None`` on the first reading; ``rate`` is also
    ``None`` without a positive elapsed time and for a counter stuck at saturation. When ``kind``
    is ``SATURATED`` both are lower bounds.
    """

    value: int
    kind: DeltaKind
    delta: int | None
    rate: float | None
    elapsed_s: float | None
    saturated: bool

    @property
    def is_lower_bound(self) -> bool:
        """True when the true change may be larger than ``delta`` (the counter saturated)."""
        return self.kind is DeltaKind.SATURATED


def counter_delta(
    prev: CounterSample | None,
    cur: CounterSample,
    spec: CounterSpec = DEFAULT_SPEC,
) -> CounterDelta:
    """Compare ``cur`` with ``prev`` under the rules in the module docstring."""
    if cur.value < 0:
        msg = f"counter value {cur.value} is negative; hardware counters are unsigned"
        raise ValueError(msg)
    saturated = spec.saturates and cur.value >= spec.max_value
    if prev is None:
        return CounterDelta(cur.value, DeltaKind.FIRST, None, None, None, saturated)
    elapsed = cur.at - prev.at
    if cur.value < prev.value:
        forward = (cur.value - prev.value) % spec.modulus
        plausible = prev.value <= spec.max_value and forward <= spec.modulus // 4
        if not spec.saturates and plausible:
            kind, delta = DeltaKind.WRAPPED, forward
        else:
            kind, delta = DeltaKind.RESET, cur.value
    elif saturated:
        kind, delta = DeltaKind.SATURATED, cur.value - prev.value
    else:
        kind, delta = DeltaKind.OK, cur.value - prev.value
    stuck = saturated and prev.value >= spec.max_value
    rate = delta / elapsed if elapsed > 0 and not stuck else None
    return CounterDelta(cur.value, kind, delta, rate, elapsed, saturated)


class CounterTracker:
    """Remembers the last reading of many counters and counts resets and wraps.

    Counters are keyed by ``(scope, name)``, e.g. ``(("mlx5_0", 1), "symbol_error")``. Specs are
    looked up by name in ``specs``, falling back to ``default``.
    """

    __slots__ = ("_default", "_last", "_specs", "resets", "wraps")

    def __init__(
        self,
        specs: Mapping[str, CounterSpec] = IB_COUNTER_SPECS,
        default: CounterSpec = DEFAULT_SPEC,
    ) -> None:
        """Start with no readings."""
        self._specs = specs
        self._default = default
        self._last: dict[tuple[Hashable, str], CounterSample] = {}
        self.resets = 0
        self.wraps = 0

    def update(
        self, scope: Hashable, values: Mapping[str, int], at: float
    ) -> dict[str, CounterDelta]:
        """Record ``values`` read at ``at`` and return each counter's delta since its last reading.

        A counter absent from ``values`` (e.g. a file that could not be read) keeps its previous
        reading, so the next successful read spans the gap.
        """
        out: dict[str, CounterDelta] = {}
        for name, value in values.items():
            key = (scope, name)
            cur = CounterSample(value, at)
            result = counter_delta(self._last.get(key), cur, self._specs.get(name, self._default))
            self._last[key] = cur
            self.resets += result.kind is DeltaKind.RESET
            self.wraps += result.kind is DeltaKind.WRAPPED
            out[name] = result
        return out

    def forget(self, scope: Hashable) -> None:
        """Drop every reading of ``scope`` (a port or device that went away)."""
        for key in [k for k in self._last if k[0] == scope]:
            del self._last[key]
