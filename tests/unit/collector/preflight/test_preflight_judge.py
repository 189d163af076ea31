"""The judge: gates, versions across nodes (the odd one out), the fleet's outliers, the ladder."""

from __future__ import annotations

from collector.preflight.judge import (
    NodeKind,
    add_ladder_efficiency,
    judge_run,
    ladder_efficiency,
    node_verdicts,
)
from fleetwatch.preflight.vocabulary import Check, Measurement, Verdict
from rules.gates_file import load_gates

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


def one_node_rung(throughput: dict[str, float]) -> dict[str, list[Measurement]]:
    return {
        n: [Measurement(Check.LADDER_THROUGHPUT, "nodes:1", v, "samples/s")]
        for n, v in throughput.items()
    }


def test_a_node_whose_one_node_rung_is_slow_against_the_fleet_fails_on_its_own():
    """The one-node rung is the node's own result (not a group's), judged against the other
    nodes' one-node rungs: a 1.6x slower GPU fails its node, the healthy ones pass."""
    spread = [1.0, 1.004, 0.996, 1.008, 0.992, 1.0]
    results = one_node_rung({n: 2560.0 * f for n, f in zip(NODES, spread, strict=True)})
    results["gpu-05"] = one_node_rung({"gpu-05": 2560.0 / 1.6})["gpu-05"]
    judged = judge_run(results, dict.fromkeys(NODES, H100), load_gates())
    (slow,) = [j for j in judged if j.node == "gpu-05"]
    assert not slow.shared
    assert slow.verdict is Verdict.FAIL
    assert "below the fleet median" in slow.reason
    verdicts = node_verdicts(judged, NODES)
    assert [n for n, v in verdicts.items() if v is Verdict.FAIL] == ["gpu-05"]


def test_rungs_of_different_sizes_are_not_compared_with_each_other():
    """The larger rungs have far higher throughputs than the one-node rung; compared together
    (four one-node figures, five larger ones) the one-node figures would fail as slow."""
    four = NODES[:4]
    results = one_node_rung(dict.fromkeys(four, 2560.0))
    results["gpu-01"] += [
        Measurement(Check.LADDER_THROUGHPUT, f"nodes:{k}", 2560.0 * k, "samples/s")
        for k in (2, 4, 8, 16, 32)
    ]
    judged = judge_run(results, dict.fromkeys(four, H100), load_gates())
    assert {j.verdict for j in judged} == {Verdict.PASS}
