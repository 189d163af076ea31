"""The BMC poller over the simulated BMC's Redfish documents, read by the real Redfish reader."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import pytest

from agent.poll.bmc import BmcPoller
from agent.sim.bmc import SimBmc, SimRedfishService
from agent.sources.bmc import BmcError, SelEntry, Severity, new_entries
from agent.sources.bmc_redfish import RedfishBmc, parse_fan, parse_psu, parse_sel_entry
from agent.sources.sel_cursor import SelCursor
from fleetwatch.model import EventKind, Target
from fleetwatch.testing import wait_until

if TYPE_CHECKING:
    from pathlib import Path

    from agent.poll.findings import PollResult

NODE = Target.node()


def poller(bmc: SimBmc, cursor: SelCursor | None = None, timeout_s: float = 5.0) -> BmcPoller:
    return BmcPoller(
        RedfishBmc(SimRedfishService(bmc), "sim-bmc"), cursor=cursor, timeout_s=timeout_s
    )


def kinds(result: PollResult) -> list[tuple[EventKind, str]]:
    return [(e.kind, e.target.device) for e in result.events]


class TestReadings:
    async def test_a_healthy_node_reads_as_samples_and_no_events(self):
        result = await poller(SimBmc()).poll(1)
        s = result.samples
        assert result.events == []
        assert s[NODE, "bmc_up"] == 1
        assert (s[NODE, "bmc_fans"], s[NODE, "bmc_fans_failed"]) == (10, 0)
        assert s[NODE, "bmc_fan_rpm_min"] == pytest.approx(9800)
        assert (s[NODE, "bmc_psus"], s[NODE, "bmc_psus_working"]) == (6, 6)
        assert (s[NODE, "bmc_psus_needed"], s[NODE, "bmc_psu_redundancy_lost"]) == (4, 0)
        assert s[NODE, "bmc_inlet_temperature_celsius"] == pytest.approx(24)
        assert s[NODE, "bmc_outlet_temperature_celsius"] == pytest.approx(46)
        assert s[NODE, "bmc_temperatures_critical"] == 0

    async def test_a_fan_that_stops_is_reported_once_naming_the_fan(self):
        bmc = SimBmc()
        p = poller(bmc)
        await p.poll(1)
        bmc.fail_fan(3)
        first = await p.poll(2)
        again = await p.poll(3)
        assert (EventKind.FAN_FAILED, "Fan_3") in kinds(first)
        assert first.samples[NODE, "bmc_fans_failed"] == 1
        assert first.samples[NODE, "bmc_fan_rpm_min"] == 0
        assert again.events == []  # edge-triggered
        detail = next(e.detail for e in first.events if e.kind == EventKind.FAN_FAILED)
        assert "0 RPM" in detail
        assert "critical at 1000" in detail

    async def test_a_fan_that_turns_again_is_reported_recovered(self):
        bmc = SimBmc()
        p = poller(bmc)
        bmc.fail_fan(0)
        await p.poll(1)
        bmc.fans[0].rpm, bmc.fans[0].failed = 9000.0, False
        assert kinds(await p.poll(2)) == [(EventKind.FAN_RECOVERED, "Fan_0")]

    async def test_one_failed_supply_of_six_keeps_redundancy_two_lose_it(self):
        bmc = SimBmc()
        p = poller(bmc)
        await p.poll(1)
        bmc.fail_psu(1)
        one = await p.poll(2)
        assert (EventKind.PSU_FAILED, "PSU1") in kinds(one)
        assert one.samples[NODE, "bmc_psus_failed"] == 1
        assert one.samples[NODE, "bmc_psu_redundancy_lost"] == 0
        bmc.fail_psu(2)
        two = await p.poll(3)
        assert (EventKind.PSU_FAILED, "PSU2") in kinds(two)
        assert (EventKind.PSU_REDUNDANCY_LOST, "") in kinds(two)
        assert two.samples[NODE, "bmc_psu_redundancy_lost"] == 1
        assert two.samples[NODE, "bmc_psus_working"] == 4

    async def test_a_supply_off_its_feed_is_down_but_not_failed(self):
        bmc = SimBmc()
        p = poller(bmc)
        await p.poll(1)
        bmc.unplug_psu(0)
        result = await p.poll(2)
        event = next(e for e in result.events if e.kind == EventKind.PSU_FAILED)
        assert "input lost" in event.detail
        assert result.samples[NODE, "bmc_psus_failed"] == 0
        assert result.samples[NODE, "bmc_psus_working"] == 5

    async def test_a_hot_inlet_crosses_its_critical_threshold_once(self):
        bmc = SimBmc()
        p = poller(bmc)
        await p.poll(1)
        bmc.heat_inlet(45.0)
        hot = await p.poll(2)
        assert kinds(hot) == [
            (EventKind.TEMPERATURE_CRITICAL, "Inlet_Temp"),
            (EventKind.BMC_SEL_CRITICAL, "Temperature"),  # the BMC logs the crossing too
        ]
        assert hot.samples[NODE, "bmc_inlet_temperature_celsius"] == pytest.approx(45)
        assert hot.samples[NODE, "bmc_temperatures_critical"] == 1
        bmc.heat_inlet(25.0)
        assert kinds(await p.poll(3)) == [(EventKind.TEMPERATURE_NORMAL, "Inlet_Temp")]

    async def test_the_psus_needed_setting_overrides_the_bmc(self):
        bmc = SimBmc()
        p = BmcPoller(RedfishBmc(SimRedfishService(bmc), "b"), psus_needed=5)
        bmc.fail_psu(0)
        result = await p.poll(1)
        assert result.samples[NODE, "bmc_psus_needed"] == 5
        assert result.samples[NODE, "bmc_psu_redundancy_lost"] == 1


class TestSel:
    async def test_entries_before_the_first_read_are_history_later_ones_events(self):
        bmc = SimBmc()
        bmc.log("Critical", "Memory", "old uncorrectable ECC")
        p = poller(bmc)
        assert (await p.poll(1)).events == []
        bmc.log("Critical", "Battery", "CMOS battery low")
        bmc.log("OK", "System Event", "log area cleared")  # informational: no event
        result = await p.poll(2)
        assert kinds(result) == [(EventKind.BMC_SEL_CRITICAL, "Battery")]
        assert "CMOS battery low" in result.events[0].detail

    async def test_warning_and_critical_entries_are_told_apart(self):
        """A warning (a low CMOS battery) and a critical entry (a failed board) are two kinds, so
        the critical one pages on its own while the warning's incident still fires."""
        bmc = SimBmc()
        p = poller(bmc)
        await p.poll(1)
        bmc.log("Warning", "Battery", "CMOS battery low")
        bmc.log("Critical", "System Board", "board failure")
        assert kinds(await p.poll(2)) == [
            (EventKind.BMC_SEL_ENTRY, "Battery"),
            (EventKind.BMC_SEL_CRITICAL, "System_Board"),
        ]

    async def test_the_cursor_survives_a_restart_and_moves_only_when_committed(
        self, tmp_path: Path
    ):
        bmc = SimBmc()
        path = tmp_path / "sel.json"
        first = poller(bmc, SelCursor(path, "sim-bmc"))
        await first.poll(1)
        first.commit_sel()
        bmc.log("Critical", "Power Supply", "PSU3 failure")
        assert len((await first.poll(2)).events) == 1
        # Not committed (the agent died before the events were on disk): reported again.
        second = poller(bmc, SelCursor(path, "sim-bmc"))
        assert kinds(await second.poll(3)) == [(EventKind.BMC_SEL_CRITICAL, "Power_Supply")]
        second.commit_sel()
        third = poller(bmc, SelCursor(path, "sim-bmc"))
        assert (await third.poll(4)).events == []
        assert json.loads(path.read_text())["key"] == 1

    async def test_a_cursor_of_another_bmc_is_not_trusted(self, tmp_path: Path):
        path = tmp_path / "sel.json"
        path.write_text(json.dumps({"version": 1, "bmc": "other", "key": 0}))
        bmc = SimBmc()
        bmc.log("Critical", "Fan", "old")
        assert (await poller(bmc, SelCursor(path, "sim-bmc")).poll(1)).events == []

    def test_a_cleared_log_makes_every_entry_in_it_new(self):
        entries = [SelEntry(k, Severity.CRITICAL, "s", "m") for k in (1, 2)]
        assert [e.key for e in new_entries(entries, 40).entries] == [1, 2]
        assert new_entries([], 40).last_key == 0
        assert new_entries(entries, None).entries == []


class TestHangs:
    async def test_a_hung_bmc_costs_its_values_not_the_loop(self):
        bmc = SimBmc()
        p = poller(bmc, timeout_s=0.2)
        await p.poll(1)
        bmc.set_hang(hang=True)
        ticks = 0

        async def tick() -> None:  # counts the loop's turns: thousands while it is free
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        hung = await p.poll(2)
        skipped = await p.poll(3)  # the stuck read has not returned: not stacked behind it
        ticker.cancel()
        assert ticks > 5  # the loop ran while the read hung
        assert hung.samples[NODE, "bmc_up"] == 0
        assert hung.samples[NODE, "agent_bmc_hung"] == 1
        assert skipped.samples[NODE, "agent_source_errors_bmc"] == 2
        bmc.set_hang(hang=False)
        await wait_until(lambda: not p.hung, what="the stuck read returned")
        back = await p.poll(4)
        assert back.samples[NODE, "bmc_up"] == 1
        assert back.samples[NODE, "agent_bmc_hung"] == 0


class TestRedfishParsing:
    def test_a_fan_below_its_critical_speed_is_failed_even_if_health_says_ok(self):
        fan = parse_fan(
            {"Name": "Fan 2", "Reading": 400, "LowerThresholdCritical": 500, "Status": {}}, 0
        )
        assert fan.failed
        assert fan.name == "Fan_2"

    def test_an_absent_fan_is_not_failed(self):
        assert not parse_fan({"Status": {"State": "Absent", "Health": "Critical"}}, 4).failed

    def test_newer_fan_speed_and_supply_shapes(self):
        fan = parse_fan({"Name": "F", "SpeedPercent": {"Reading": 40, "SpeedRPM": 7000}}, 0)
        assert fan.rpm == 7000
        psu = parse_psu({"Name": "PS 1", "Status": {"State": "UnavailableOffline"}}, 0)
        assert psu.input_lost
        assert not psu.working

    def test_a_sel_entry_without_a_numeric_id_is_skipped(self):
        assert parse_sel_entry({"Id": "abc", "Severity": "Critical"}) is None
        entry = parse_sel_entry(
            {"Id": "7", "Severity": "Critical", "SensorType": "Fan", "SensorNumber": 48}
        )
        assert entry is not None
        assert entry.sensor == "Fan #0x30"

    async def test_a_missing_document_is_a_bmc_error(self):
        with pytest.raises(BmcError, match="404"):
            SimRedfishService(SimBmc()).get("/redfish/v1/Nothing")


class DictService:
    """A Redfish service of the newer shape (ThermalSubsystem, PowerSubsystem, Sensors), paged."""

    def __init__(self, docs: dict[str, dict[str, object]]) -> None:
        self.docs = docs

    def get(self, path: str) -> dict[str, object]:
        if path not in self.docs:
            msg = f"GET {path}: HTTP 404"
            raise BmcError(msg)
        return self.docs[path]


def newer_shape() -> dict[str, dict[str, object]]:
    c = "/redfish/v1/Chassis/GPU_Board"
    fans = f"{c}/ThermalSubsystem/Fans"
    psus = f"{c}/PowerSubsystem/PowerSupplies"
    sensors = f"{c}/Sensors"
    return {
        "/redfish/v1/": {"Chassis": {"@odata.id": "/redfish/v1/Chassis"}},
        "/redfish/v1/Chassis": {"Members": [{"@odata.id": c}]},
        c: {
            "ThermalSubsystem": {"@odata.id": f"{c}/ThermalSubsystem"},
            "PowerSubsystem": {"@odata.id": f"{c}/PowerSubsystem"},
            "Sensors": {"@odata.id": sensors},
        },
        f"{c}/ThermalSubsystem": {"Fans": {"@odata.id": fans}},
        fans: {
            "Members": [{"@odata.id": f"{fans}/0"}],
            "Members@odata.nextLink": f"{fans}?$skip=1",
        },
        f"{fans}?$skip=1": {"Members": [{"@odata.id": f"{fans}/1"}]},
        f"{fans}/0": {"Name": "Fan 0", "SpeedPercent": {"Reading": 60, "SpeedRPM": 11000}},
        f"{fans}/1": {
            "Name": "Fan 1",
            "SpeedPercent": {"Reading": 0, "SpeedRPM": 0},
            "Status": {"State": "Enabled", "Health": "Critical"},
        },
        f"{c}/PowerSubsystem": {"PowerSupplies": {"@odata.id": psus}},
        psus: {"Members": [{"@odata.id": f"{psus}/0"}, {"@odata.id": f"{psus}/1"}]},
        f"{psus}/0": {"Name": "PSU 0", "Status": {"State": "Enabled", "Health": "OK"}},
        f"{psus}/1": {"Name": "PSU 1", "Status": {"State": "Enabled", "Health": "Critical"}},
        sensors: {"Members": [{"@odata.id": f"{sensors}/inlet"}, {"@odata.id": f"{sensors}/v"}]},
        f"{sensors}/inlet": {
            "Name": "Inlet Temp",
            "ReadingType": "Temperature",
            "Reading": 31.5,
            "PhysicalContext": "Intake",
            "Thresholds": {"UpperCritical": {"Reading": 45}},
        },
        f"{sensors}/v": {"Name": "12V", "ReadingType": "Voltage", "Reading": 12.1},
    }


async def test_the_newer_subsystems_and_paged_collections_are_read():
    reading = RedfishBmc(DictService(newer_shape()), "b").read()
    assert [(f.name, f.rpm, f.failed) for f in reading.fans] == [
        ("Fan_0", 11000, False),
        ("Fan_1", 0, True),
    ]
    assert [(p.name, p.failed) for p in reading.psus] == [("PSU_0", False), ("PSU_1", True)]
    (inlet,) = reading.temperatures  # the voltage sensor is not a temperature
    assert (inlet.name, inlet.celsius, inlet.upper_critical, inlet.place.value) == (
        "Inlet_Temp",
        31.5,
        45,
        "inlet",
    )
    service = DictService(newer_shape())
    poller = BmcPoller(RedfishBmc(service, "b"))
    result = await poller.poll(1)
    # two supplies, one failed: all but one needed, so no spare is left
    assert result.samples[NODE, "bmc_psu_redundancy_lost"] == 1
    # A service without an SEL is no error, and is not searched again.
    assert result.samples[NODE, "agent_source_errors_bmc"] == 0
    del service.docs["/redfish/v1/"]["Chassis"]  # the root is only read to find the SEL now
    assert (await poller.poll(2)).samples[NODE, "bmc_up"] == 1


def test_a_sel_entry_is_named_by_its_sensor_not_its_generic_name():
    entry = parse_sel_entry(
        {"Id": "3", "Name": "Log Entry 3", "Severity": "Warning", "SensorType": "Battery"}
    )
    assert entry is not None
    assert entry.sensor == "Battery"
    assert entry.describe().startswith("SEL 3 warning: Battery: ")  # the type is not repeated
    unnamed = parse_sel_entry({"Id": "4", "Name": "Log Entry 4", "Severity": "Critical"})
    assert unnamed is not None
    assert unnamed.sensor == "SEL"
