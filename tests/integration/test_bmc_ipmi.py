"""The IPMI BMC source against OpenIPMI's ``ipmi_sim``, read with the real ``ipmitool``.

The simulator declares fans, temperatures, two supplies and a redundancy sensor
(tests/ipmi_sim_harness.py); the test changes them through its console as a BMC's sensors
change, and the agent's poller, running ``ipmitool -I lanplus`` as the agent does, reports what
changed, once.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any

import pytest

from agent.poll.bmc import BmcPoller
from agent.sources.bmc_ipmi import IpmiBmc
from agent.sources.sel_cursor import SelCursor
from fleetwatch.model import EventKind, Target
from tests.ipmi_sim_harness import IPMITOOL, MC, USER, IpmiSim, free_udp_port

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

NODE = Target.node()

SEL_KINDS = (EventKind.BMC_SEL_ENTRY, EventKind.BMC_SEL_CRITICAL)
pytestmark = pytest.mark.skipif(
    shutil.which("ipmi_sim") is None or shutil.which("ipmitool") is None,
    reason="ipmi_sim (openipmi) or ipmitool missing: make test installs them",
)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[IpmiSim]:
    running = IpmiSim(tmp_path / "ipmi", free_udp_port())
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def poller(sim: IpmiSim, cursor: SelCursor | None = None) -> BmcPoller:
    source = IpmiBmc(
        "127.0.0.1",
        sim.port,
        USER,
        sim.password_file,
        program=IPMITOOL,
        cipher_suite=3,  # ipmi_sim offers no SHA-256 suite
        timeout_s=20.0,
    )
    return BmcPoller(source, cursor=cursor, timeout_s=30.0)


def kinds(events: list[Any]) -> list[tuple[EventKind, str]]:
    return [(e.kind, e.target.device) for e in events]


async def test_sensors_the_bmc_changes_become_samples_and_events(sim: IpmiSim, tmp_path: Path):
    cursor = SelCursor(tmp_path / "sel.json", f"127.0.0.1:{sim.port}")
    p = poller(sim, cursor)
    first = await p.poll(1)
    assert first.events == []  # the SEL's entries from before the agent are history
    s = first.samples
    assert s[NODE, "bmc_up"] == 1
    assert (s[NODE, "bmc_fans"], s[NODE, "bmc_fans_failed"]) == (3, 0)
    assert s[NODE, "bmc_fan_rpm_min"] == pytest.approx(9800)
    assert s[NODE, "bmc_inlet_temperature_celsius"] == pytest.approx(24)
    assert s[NODE, "bmc_outlet_temperature_celsius"] == pytest.approx(46)
    assert (s[NODE, "bmc_psus"], s[NODE, "bmc_psus_working"]) == (2, 2)
    assert s[NODE, "bmc_psu_redundancy_lost"] == 0
    p.commit_sel()

    sim.command(f"sensor_set_value {MC} 0 0x31 0 1")  # FAN1 stops
    sim.command(f"sensor_set_bit {MC} 0 0x51 1 1 1")  # PS2: failure detected
    sim.command(f"sensor_set_bit_clr_rest {MC} 0 0x52 1 1 1")  # redundancy lost
    sim.command(f"sensor_set_value {MC} 0 0x40 45 1")  # inlet past its critical 42
    sim.ipmitool("mc", "info")  # the console's commands are done once it answers again
    second = await p.poll(2)
    got = kinds(second.events)
    for expected in [
        (EventKind.FAN_FAILED, "FAN1"),
        (EventKind.PSU_FAILED, "PS2_Status"),
        (EventKind.PSU_REDUNDANCY_LOST, ""),
        (EventKind.TEMPERATURE_CRITICAL, "Inlet_Temp"),
    ]:
        assert got.count(expected) == 1, (expected, got)
    sel = [e for e in second.events if e.kind in SEL_KINDS]
    assert {e.target.device for e in sel} == {"FAN1", "PS2_Status", "PS_Redundancy", "Inlet_Temp"}
    critical = {e.target.device for e in sel if e.kind == EventKind.BMC_SEL_CRITICAL}
    assert "FAN1" in critical, "a fan below its lower critical threshold is a critical entry"
    assert any("Lower Critical going low" in e.detail for e in sel)
    assert not any("Fully Redundant" in e.detail for e in sel)  # informational: not sent
    s = second.samples
    assert (s[NODE, "bmc_fans_failed"], s[NODE, "bmc_fan_rpm_min"]) == (1, 0)
    assert (s[NODE, "bmc_psus_failed"], s[NODE, "bmc_psu_redundancy_lost"]) == (1, 1)
    assert s[NODE, "bmc_temperatures_critical"] == 1
    assert (await p.poll(3)).events == []  # nothing new

    # A restarted agent with the cursor left where it was reports the entries again (their
    # events were never durable); once committed, it does not.
    again = poller(sim, SelCursor(tmp_path / "sel.json", f"127.0.0.1:{sim.port}"))
    assert len([e for e in (await again.poll(4)).events if e.kind in SEL_KINDS]) == len(sel)
    again.commit_sel()
    fresh = poller(sim, SelCursor(tmp_path / "sel.json", f"127.0.0.1:{sim.port}"))
    assert [e for e in (await fresh.poll(5)).events if e.kind in SEL_KINDS] == []


async def test_wrong_credentials_cost_the_read_and_are_counted(sim: IpmiSim, tmp_path: Path):
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    source = IpmiBmc(
        "127.0.0.1", sim.port, USER, wrong, program=IPMITOOL, cipher_suite=3, timeout_s=10.0
    )
    p = BmcPoller(source, timeout_s=30.0)
    result = await p.poll(1)
    assert result.samples[NODE, "bmc_up"] == 0
    assert result.samples[NODE, "agent_source_errors_bmc"] == 1
    assert result.samples[NODE, "agent_bmc_hung"] == 0  # it failed; it did not hang
