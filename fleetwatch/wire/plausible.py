"""What a value may be before the collector believes it: one table of ranges, per signal.

The wire checks (:mod:`fleetwatch.wire.validate`) say whether a sample is well formed; this
module says whether its value could be true. A GPU at 1e12 °C, a board drawing -5 W, a link
"up" with the value 7 or an error counter below zero is a broken source or a hostile sender, and
believing it would draw wrong conclusions (and wrong actions). The collector refuses such a
sample on its own, counts it by reason, and keeps the signal's last good value.

A signal's rule is found by its exact name first, then by its suffix, then by its prefix; a
signal nobody listed may hold any finite number or short text (newer agents may send signals
this collector does not know yet).

Times: an event stamped before 2000 comes from a clock that was never set, and one stamped more
than :data:`FUTURE_SLACK_MS` ahead of the collector from a clock that is wrong; see
:func:`time_problem`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from fleetwatch.model import SampleValue

Shape = Literal["number", "counter", "flag", "text", "any"]

# Rejection reasons (metric label values) this module gives.
NEGATIVE: Final = "negative"
OUT_OF_RANGE: Final = "out_of_range"
WRONG_TYPE: Final = "wrong_type"


@dataclass(frozen=True, slots=True)
class Plausible:
    """The shape a signal's value has and the range it can hold.

    ``counter``: a hardware count that only grows (until a reset); ``flag``: 0 or 1;
    ``number``: a reading between ``low`` and ``high``; ``text``: a short string; ``any``: a
    signal with no rule.
    """

    shape: Shape
    low: float = -math.inf
    high: float = math.inf

    def problem(self, value: SampleValue) -> tuple[str, str] | None:
        """(reason, what is wrong) when ``value`` cannot be right for this signal, else None."""
        if self.shape == "any":
            return None
        if isinstance(value, str) or self.shape == "text":
            return self._type_problem(value)
        if value < 0 <= self.low:
            return NEGATIVE, f"{value:g} is negative"
        if self.shape == "flag" and value not in (0, 1):
            return OUT_OF_RANGE, f"{value:g} is neither 0 nor 1"
        if not self.low <= value <= self.high:
            return OUT_OF_RANGE, f"{value:g} is outside {self.low:g}..{self.high:g}"
        return None

    def fits(self, value: SampleValue) -> bool:
        """``problem(value) is None``, without the words: every sample of a report asks it."""
        shape = self.shape
        if shape == "any":
            return True
        if isinstance(value, str):
            return shape == "text"
        if shape == "text":
            return False
        return (
            not (value < 0 <= self.low)
            and self.low <= value <= self.high
            and (shape != "flag" or value in (0, 1))
        )

    def _type_problem(self, value: SampleValue) -> tuple[str, str] | None:
        is_text = isinstance(value, str)
        if is_text == (self.shape == "text"):
            return None
        if is_text:
            return WRONG_TYPE, f"text {str(value)[:40]!r} where a number belongs"
        return WRONG_TYPE, f"number {value} where text belongs"


ANY: Final = Plausible("any")
TEXT: Final = Plausible("text")
FLAG: Final = Plausible("flag", 0, 1)
PERCENT: Final = Plausible("number", 0, 100)
NON_NEGATIVE: Final = Plausible("number", 0)
# A 64-bit hardware counter; IB data counters count 4-byte words and are reported in bytes.
COUNTER: Final = Plausible("counter", 0, float(1 << 66))
# Per-second rates of counters: 10x an 800 Gb/s port's bytes per second is past anything real.
RATE: Final = Plausible("number", 0, 1e12)
PCIE_WIDTH: Final = Plausible("number", 0, 32)
PCIE_GEN: Final = Plausible("number", 0, 10)
PCIE_SPEED_GTS: Final = Plausible("number", 0, 256)
# The node's BMC: counts of its parts, and readings no working machine goes past.
BMC_PARTS: Final = Plausible("number", 0, 1000)
BMC_TEMPERATURE: Final = Plausible("number", -60, 200)
IB_RATE_GBPS: Final = Plausible("number", 0, 100_000)  # 12X XDR is 2,400 Gb/s

EXACT: Final[dict[str, Plausible]] = {
    "temperature_celsius": Plausible("number", -40, 150),
    "power_watts": Plausible("number", 0, 5_000),  # a GB200 superchip is ~2.7 kW
    "sm_clock_mhz": Plausible("number", 0, 10_000),
    "utilization_gpu_percent": PERCENT,
    "utilization_memory_percent": PERCENT,
    "clock_event_reasons": Plausible("number", 0, float(1 << 64)),  # a bit mask
    "pcie_link_gen": PCIE_GEN,
    "pcie_link_gen_max": PCIE_GEN,
    "pcie_link_width": PCIE_WIDTH,
    "pcie_link_width_max": PCIE_WIDTH,
    "pcie_sysfs_link_width": PCIE_WIDTH,
    "pcie_sysfs_link_width_max": PCIE_WIDTH,
    "pcie_sysfs_link_speed_gts": PCIE_SPEED_GTS,
    "pcie_sysfs_link_speed_gts_max": PCIE_SPEED_GTS,
    "gpu_present": FLAG,
    "nvlink_up": FLAG,
    "remap_pending": FLAG,
    "remap_failure": FLAG,
    "pcie_link_width_degraded": FLAG,
    "ib_state": TEXT,
    "ib_phys_state": TEXT,
    "ib_link_downed": COUNTER,
    "bmc_up": FLAG,
    "agent_bmc_hung": FLAG,
    "bmc_fans": BMC_PARTS,
    "bmc_fans_failed": BMC_PARTS,
    "bmc_fan_rpm_min": Plausible("number", 0, 100_000),
    "bmc_psus": BMC_PARTS,
    "bmc_psus_working": BMC_PARTS,
    "bmc_psus_failed": BMC_PARTS,
    "bmc_psus_needed": BMC_PARTS,
    "bmc_psu_redundancy_lost": FLAG,
    "bmc_power_watts": Plausible("number", 0, 200_000),
    "bmc_inlet_temperature_celsius": BMC_TEMPERATURE,
    "bmc_outlet_temperature_celsius": BMC_TEMPERATURE,
    "bmc_temperature_max_celsius": BMC_TEMPERATURE,
    "bmc_temperatures_critical": BMC_PARTS,
    # heat, and links read every counter interval (not counters: the "ib_" prefix would say so)
    "temperature_slowdown_celsius": Plausible("number", -40, 150),
    "clocks_hw_slowdown": FLAG,
    "clocks_sw_thermal_slowdown": FLAG,
    "clocks_hw_thermal_slowdown": FLAG,
    "clocks_hw_power_brake": FLAG,
    "ib_rate_gbps": IB_RATE_GBPS,
    "ib_rate_expected_gbps": IB_RATE_GBPS,
    "ib_link_width": Plausible("number", 0, 32),
    "ib_rate_low": FLAG,
    "roce_v2_gids": Plausible("number", 0, 65_536),
    "roce_gid_missing": FLAG,
    "nic_pcie_link_width": PCIE_WIDTH,
    "nic_pcie_link_width_max": PCIE_WIDTH,
    "nic_pcie_link_speed_gts": PCIE_SPEED_GTS,
    "nic_pcie_link_speed_gts_max": PCIE_SPEED_GTS,
    "nic_pcie_link_degraded": FLAG,
    "nvswitch_pcie_links_degraded": Plausible("number", 0, 1_000),
    "nvml_read_failures": NON_NEGATIVE,
    "gpus_unidentified": Plausible("number", 0, 1_000),
}
# Checked in order, before the prefixes: a rate of an IB counter is a rate, not a counter.
SUFFIXES: Final[tuple[tuple[str, Plausible], ...]] = (
    ("_per_second", RATE),
    ("_saturated", FLAG),
    ("_percent", PERCENT),
    ("_total", COUNTER),
    ("_count", COUNTER),
    ("_errors", COUNTER),
)
PREFIXES: Final[tuple[tuple[str, Plausible], ...]] = (
    ("agent_", NON_NEGATIVE),  # the agent's own counts and gauges (they restart with it)
    ("remapped_rows_", COUNTER),
    ("ib_", COUNTER),  # ib_<counter> and ib_hw_<counter>
)

EARLIEST_MS: Final = 946_684_800_000  # 2000-01-01T00:00:00Z
FUTURE_SLACK_MS: Final = 10 * 60 * 1000


@lru_cache(maxsize=4096)
def rule_for(signal: str) -> Plausible:
    """The rule of ``signal``: by exact name, else suffix, else prefix, else :data:`ANY`."""
    exact = EXACT.get(signal)
    if exact is not None:
        return exact
    for suffix, rule in SUFFIXES:
        if signal.endswith(suffix):
            return rule
    for prefix, rule in PREFIXES:
        if signal.startswith(prefix):
            return rule
    return ANY


def value_problem(signal: str, value: SampleValue) -> tuple[str, str] | None:
    """(reason, what is wrong) when ``value`` cannot be right for ``signal``, else None."""
    return rule_for(signal).problem(value)


def is_counter(signal: str) -> bool:
    """Whether ``signal`` is a hardware counter (a decrease is a reset, not a reading)."""
    return rule_for(signal).shape == "counter"


def time_problem(time_ms: int, now_ms: int) -> str | None:
    """``"past"`` for a time before 2000, ``"future"`` for one too far ahead of ``now_ms``."""
    if time_ms < EARLIEST_MS:
        return "past"
    if time_ms > now_ms + FUTURE_SLACK_MS:
        return "future"
    return None
