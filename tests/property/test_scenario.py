"""Scenario files: any text loads into a bounded scenario or raises ScenarioError naming the file
and the fault, never anything else (and a flap or a fleet size cannot blow up memory)."""

from __future__ import annotations

import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from agent.sim.scenario import MAX_FLAPS, MAX_NODES, ScenarioError, parse_scenario
from tests.property.hostile import NUMBERS, SCALARS, alias_bomb, assert_clear, deep, nested, tried

TARGET = "scenario"
VALUES = st.one_of(SCALARS, nested())
FAULT_KEYS = ["at", "node", "fault", "gpu", "xid", "port", "times", "every", "link", "factor", 5]
FAULTS = ["xid", "gpu_lost", "ib_flap", "nvlink_down", "slow_gpu", "node_crash", "meteor"]


@st.composite
def scenario_texts(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(max_size=200))
    faults = []
    for _ in range(draw(st.integers(0, 3))):
        fault: dict[object, object] = {
            "at": 1,
            "node": "node-01",
            "fault": draw(st.sampled_from(FAULTS)),
        }
        for key in draw(st.lists(st.sampled_from(FAULT_KEYS), max_size=5)):
            fault[key] = draw(st.one_of(NUMBERS, VALUES))
        faults.append(fault)
    doc = {
        "version": 1,
        "duration": draw(st.one_of(st.just(60), NUMBERS)),
        "nodes": draw(st.one_of(st.just(2), NUMBERS, VALUES)),
        "faults": faults,
    }
    return yaml.safe_dump(doc, allow_unicode=True)


class TestScenario:
    @given(scenario_texts())
    @example(
        "version: 1\nduration: 10\nnodes: 1\n"
        "faults: [{fault: xid, at: 1, node: node-01, gpu: " + "9" * 400 + ", xid: 1}]"
    )  # float() overflow
    @example(
        "version: 1\nduration: 10\nnodes: 1\n"
        "faults: [{fault: xid, at: 1, node: node-01, gpu: 0, xid: 1, 5: 1, z: 2}]"
    )  # sorting int and str keys
    @example("version: 1\nduration: 10\nnodes: 1000000000\n")  # a billion node names
    @example(
        "version: 1\nduration: 10\nnodes: 1\n"
        "faults: [{fault: ib_flap, at: 1, node: node-01, port: 1, times: 1000000000, every: 1}]"
    )  # a billion flaps in the timeline
    @example(deep(20_000))
    @example(alias_bomb() + "version: 1\nduration: 10\nnodes: 1\nfaults: [{fault: *a9}]\n")
    @example(alias_bomb() + "version: 1\nduration: *a9\nnodes: 1\n")
    def test_any_scenario_loads_or_raises_scenario_error(self, text):
        """Any text: a bounded Scenario whose timeline expands, or ScenarioError naming where."""
        tried(TARGET)
        try:
            scenario = parse_scenario(text, "fuzz.yaml")
        except ScenarioError as exc:
            assert_clear(exc, "fuzz.yaml")
            return
        assert 0 < len(scenario.nodes) <= MAX_NODES
        for fault in scenario.faults:
            assert fault.params.get("times", 0) <= MAX_FLAPS
            fault.describe()
        scenario.timeline()
