"""The BMC's scenario faults, played on a simulated node and read by the agent's BMC poller.

The same table test as tests/unit/agent/sim/test_scenario.py, for the faults its sampler does not
read: each fault's events appear exactly once, in order, with its evidence in the node's samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from agent.poll.bmc import BmcPoller
from agent.sim.bmc import SimRedfishService
from agent.sim.hardware import SimNode
from agent.sim.scenario import Fault, FaultKind, ScenarioError, apply_fault, parse_scenario
from agent.sources.bmc_redfish import RedfishBmc
from fleetwatch.model import Target
from fleetwatch.testing import FakeClock
from tests.unit.agent.sim.bmc_faults import BMC_EXPECTED, EVIDENCE, PARAMS

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize("kind", sorted(BMC_EXPECTED))
async def test_bmc_fault_shows_up_as_the_right_events_exactly_once(kind, tmp_path: Path):
    node = SimNode("node-01", tmp_path / "sys", FakeClock())
    poller = BmcPoller(RedfishBmc(SimRedfishService(node.bmc), "node-01-bmc"))
    await poller.poll(1)
    apply_fault(Fault(0.0, "node-01", kind, PARAMS[kind]), node)
    result = await poller.poll(2)
    events = list(result.events)
    for at in range(3, 6):  # nothing more may come of it
        events += (await poller.poll(at)).events
    assert [(e.kind, e.target.device) for e in events] == BMC_EXPECTED[kind]
    if kind in EVIDENCE:
        signal, value = EVIDENCE[kind]
        assert result.samples[Target.node(), signal] == pytest.approx(value)
    if kind == FaultKind.PSU_REDUNDANCY_LOST:
        assert result.samples[Target.node(), "bmc_psus_failed"] == 0  # a feed, not a supply


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("{at: 1, node: node-01, fault: fan_failure, fan: 10}", "fan must be 0 to 9"),
        ("{at: 1, node: node-01, fault: psu_failure, psu: 6}", "psu must be 0 to 5"),
        ("{at: 1, node: node-01, fault: inlet_hot, celsius: 500}", "celsius must be above 0"),
        (
            "{at: 1, node: node-01, fault: sel_event, severity: Fatal, sensor: x, message: y}",
            "severity must be one of OK, Warning, Critical",
        ),
        (
            '{at: 1, node: node-01, fault: sel_event, severity: OK, sensor: "", message: y}',
            "sensor must be 1 to 120 printable characters",
        ),
        ("{at: 1, node: node-01, fault: psu_redundancy_lost, psu: 1}", "(unknown: psu)"),
    ],
)
def test_bad_bmc_faults_are_refused_naming_the_key(fault: str, message: str):
    text = f"version: 1\nduration: 10\nnodes: 1\nfaults:\n  - {fault}\n"
    with pytest.raises(ScenarioError, match="fault 1") as caught:
        parse_scenario(text)
    assert message in str(caught.value)
