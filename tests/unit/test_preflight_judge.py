"""The judge: gates, versions across nodes (the odd one out), the fleet's outliers, the ladder."""

from __future__ import annotations

from collector.preflight.judge import (
    NodeKind,
    add_ladder_efficiency,
    judge_run,
    ladder_efficiency,
    node_verdicts,
)
from fleetwatch.preflight.gates import load_gates
from fleetwatch.preflight.vocabulary import Check, Measurement, Verdict

H100 = NodeKind("NVIDIA H100 80GB HBM3", "NDR")
NODES = [f"gpu-{i:02d}" for i in range(1, 7)]


def test_the_node_with_another_driver_is_named_and_fails():
    results = {
        n: [Measurement(Check.DRIVER_VERSION, "node", None, "", text="570.133.20")] for n in NODES
    }
    results["gpu-04"] = [Measurement(Check.DRIVER_VERSION, "node", None, "", text="550.54.15")]
    judged = judge_run(results, dict.fromkeys(NODES, H100), load_gates())
    verdicts = node_verdicts(judged, NODES)
    assert [n for n, v in verdicts.items() if v is Verdict.FAIL] == ["gpu-04"]
    (odd,) = [j for j in judged if j.node == "gpu-04"]
    assert "550.54.15" in odd.reason
    assert "570.133.20" in odd.reason


def test_a_value_within_its_gate_but_far_below_the_fleet_warns():
    results = {
        n: [Measurement(Check.H2D_BW, f"gpu:{g}", 55.0 + g * 0.1, "GB/s") for g in range(8)]
        for n in NODES
    }
    results["gpu-02"][3] = Measurement(Check.H2D_BW, "gpu:3", 49.0, "GB/s")  # passes 48
    judged = judge_run(results, dict.fromkeys(NODES, H100), load_gates())
    flagged = [(j.node, j.m.component, j.verdict) for j in judged if j.verdict is not Verdict.PASS]
    assert flagged == [("gpu-02", "gpu:3", Verdict.WARN)]


def test_nothing_that_did_not_run_passes():
    results = {"gpu-01": [Measurement(Check.P2P_BW, "node", None, "GB/s", error="no nvbandwidth")]}
    judged = judge_run(results, {"gpu-01": H100}, load_gates())
    assert [j.verdict for j in judged] == [Verdict.COULD_NOT_RUN]


def test_ladder_efficiency_is_against_the_rung_before():
    eff = ladder_efficiency({1: 1000.0, 2: 1900.0, 4: 3000.0})
    assert eff[2][0] == 0.95
    assert eff[4][0] == round(3000 / (2 * 1900), 4)
    results = {
        "gpu-01": [
            Measurement(Check.LADDER_THROUGHPUT, f"nodes:{k}", v, "samples/s")
            for k, v in ((1, 1000.0), (2, 1900.0), (4, 3000.0))
        ]
    }
    add_ladder_efficiency(results)
    judged = judge_run(results, {"gpu-01": H100}, load_gates())
    effs = {j.m.component: j.verdict for j in judged if j.m.check is Check.LADDER_EFFICIENCY}
    assert effs == {"nodes:2": Verdict.PASS, "nodes:4": Verdict.FAIL}  # 0.79 < 0.8
