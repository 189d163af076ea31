"""Parsing what ipmitool prints.

``tests/fixtures/ipmitool/`` holds what ipmitool 1.8.19 printed against OpenIPMI's ipmi_sim
(tests/ipmi_sim_harness.py) with FAN1 stopped, PS1's input lost, PS2 failed, redundancy lost and
the inlet at 45 °C; the few lines written here follow the same format for cases the simulator
did not show (an empty slot, a sensor without an SDR).
"""

from __future__ import annotations

from pathlib import Path

from agent.sources.bmc import Health, Severity
from agent.sources.bmc_ipmi import (
    parse_power_supplies,
    parse_sel_list,
    parse_sensor_list,
    sel_severity,
    split_sensor,
)

CAPTURED = Path(__file__).resolve().parents[3] / "fixtures" / "ipmitool"


def captured(name: str) -> str:
    return (CAPTURED / name).read_text()


def test_fans_and_temperatures_with_their_thresholds():
    fans, temps = parse_sensor_list(captured("sensor.txt"))
    assert [(f.name, f.rpm, f.lower_critical, f.failed) for f in fans] == [
        ("FAN0", 9800.0, 1000.0, False),
        ("FAN1", 0.0, 1000.0, True),
        ("FAN2", 9800.0, 1000.0, False),
    ]
    assert fans[1].health == Health.CRITICAL
    inlet, exhaust = temps  # the discrete supply sensors are not temperatures or fans
    assert (inlet.name, inlet.place.value, inlet.celsius, inlet.critical) == (
        "Inlet_Temp",
        "inlet",
        45.0,
        True,
    )
    assert (exhaust.place.value, exhaust.upper_critical, exhaust.critical) == ("outlet", 75, False)


def test_supplies_their_states_and_the_redundancy_sensor():
    psus, redundancy = parse_power_supplies(captured("sdr-type-power-supply.txt"))
    assert [(p.name, p.present, p.failed, p.input_lost, p.working) for p in psus] == [
        ("PS1_Status", True, False, True, False),
        ("PS2_Status", True, True, False, False),
    ]
    assert redundancy is False
    empty = "PS3 Status       | 53h | ns  | 10.1 | Disabled\n"
    assert [p.present for p in parse_power_supplies(empty)[0]] == [False]


def test_sel_entries_with_their_sensor_and_severity():
    entries = parse_sel_list(captured("sel-elist.txt"))
    assert [(e.key, e.sensor_type, e.sensor, e.severity) for e in entries] == [
        (1, "Power Supply", "PS Redundancy", Severity.OK),
        (2, "Fan", "FAN1", Severity.WARNING),
        (3, "Fan", "FAN1", Severity.CRITICAL),
        (4, "Power Supply", "PS2 Status", Severity.CRITICAL),
        (5, "Power Supply", "PS1 Status", Severity.CRITICAL),
        (6, "Power Supply", "PS Redundancy", Severity.OK),
        (7, "Power Supply", "PS Redundancy", Severity.CRITICAL),
        (8, "Temperature", "Inlet Temp", Severity.WARNING),
        (9, "Temperature", "Inlet Temp", Severity.CRITICAL),
    ]
    assert entries[2].message == (
        "Lower Critical going low Asserted (Reading 0 < Threshold 1000 RPM)"
    )
    assert entries[2].created == "Pre-Init 0000010851"
    (battery,) = parse_sel_list("  1a | 11/25/2026 | 23:50:01 | Battery #0x61 | Low | Asserted\n")
    assert (battery.key, battery.sensor_type, battery.sensor) == (0x1A, "Battery", "Battery #0x61")
    assert battery.severity == Severity.WARNING


def test_severity_and_sensor_names():
    assert sel_severity("Redundancy Lost", "Asserted") == Severity.CRITICAL
    assert sel_severity("Lower Critical going low", "Deasserted") == Severity.OK
    assert sel_severity("Uncorrectable ECC", "Asserted") == Severity.CRITICAL
    assert sel_severity("Correctable ECC", "Asserted") == Severity.WARNING
    assert sel_severity("Failed", "Asserted", "Battery") == Severity.CRITICAL
    assert split_sensor("Power Unit Pwr Unit Status") == ("Power Unit", "Pwr Unit Status")
    assert split_sensor("Drive Slot / Bay HDD0") == ("Drive Slot / Bay", "HDD0")
    assert split_sensor("OEM #0x12") == ("OEM", "OEM #0x12")
