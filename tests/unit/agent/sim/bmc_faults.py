"""The BMC's scenario faults: the parameters each is played with, and what the agent reports.

Shared by tests/unit/agent/sim/test_scenario_bmc.py (which plays them) and
tests/unit/agent/sim/test_scenario.py (which checks every fault kind has an expectation).
"""

from __future__ import annotations

from typing import Any

from agent.sim.scenario import FaultKind
from fleetwatch.model import EventKind

PARAMS: dict[FaultKind, dict[str, Any]] = {
    FaultKind.FAN_FAILURE: {"fan": 3},
    FaultKind.PSU_FAILURE: {"psu": 1},
    FaultKind.PSU_REDUNDANCY_LOST: {},
    FaultKind.INLET_HOT: {"celsius": 45.0},
    FaultKind.SEL_EVENT: {"severity": "Critical", "sensor": "Battery", "message": "CMOS low"},
}
# (event kind, the target's device) in the order the agent sends them.
BMC_EXPECTED: dict[FaultKind, list[tuple[EventKind, str]]] = {
    FaultKind.FAN_FAILURE: [(EventKind.FAN_FAILED, "Fan_3"), (EventKind.BMC_SEL_CRITICAL, "Fan")],
    FaultKind.PSU_FAILURE: [
        (EventKind.PSU_FAILED, "PSU1"),
        (EventKind.BMC_SEL_CRITICAL, "Power_Supply"),
    ],
    FaultKind.PSU_REDUNDANCY_LOST: [
        (EventKind.PSU_FAILED, "PSU4"),  # unfed, not broken: detail says "input lost"
        (EventKind.PSU_FAILED, "PSU5"),
        (EventKind.PSU_REDUNDANCY_LOST, ""),
        (EventKind.BMC_SEL_ENTRY, "Power_Supply"),  # unfed supplies: warning entries
        (EventKind.BMC_SEL_ENTRY, "Power_Supply"),
    ],
    FaultKind.INLET_HOT: [
        (EventKind.TEMPERATURE_CRITICAL, "Inlet_Temp"),
        (EventKind.BMC_SEL_CRITICAL, "Temperature"),
    ],
    FaultKind.SEL_EVENT: [(EventKind.BMC_SEL_CRITICAL, "Battery")],
}
EVIDENCE: dict[FaultKind, tuple[str, object]] = {
    FaultKind.FAN_FAILURE: ("bmc_fans_failed", 1),
    FaultKind.PSU_FAILURE: ("bmc_psus_failed", 1),
    FaultKind.PSU_REDUNDANCY_LOST: ("bmc_psu_redundancy_lost", 1),
    FaultKind.INLET_HOT: ("bmc_inlet_temperature_celsius", 45.0),
}
