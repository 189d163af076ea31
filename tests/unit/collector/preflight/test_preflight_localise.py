"""Localisation on made-up judged results: the node, GPU, pair, port or cable to blame."""

from __future__ import annotations

from collector.preflight.judge import Judged
from collector.preflight.localise import localise
from fleetwatch.preflight.vocabulary import Check, Measurement, Verdict

NODES = ["a", "b", "c", "d"]
RING = [("a", "b"), ("c", "d"), ("b", "c"), ("a", "d")]


def rail(server: str, client: str, value: float, rail_name: str = "mlx5_0/1") -> list[Judged]:
    verdict = Verdict.PASS if value >= 380 else Verdict.FAIL
    comp = f"rail:{rail_name}:{server}-{client}"
    m = Measurement(Check.IB_WRITE_BW, comp, value, "Gb/s")
    return [Judged(server, m, verdict, "", ""), Judged(client, m, verdict, "", "")]


def blamed(judged: list[Judged]) -> set[tuple[str, str, str]]:
    return {(s.kind, s.node, s.component) for s in localise(judged, NODES)}


def test_a_bad_cable_is_a_low_pair_whose_ends_are_fine_elsewhere():
    judged = [j for s, c in RING for j in rail(s, c, 150.0 if (s, c) == ("b", "c") else 395.0)]
    found = localise(judged, NODES)
    assert [(s.kind, s.node, s.component) for s in found] == [("cable", "", "rail:mlx5_0/1:b-c")]
    assert found[0].nodes == ("b", "c")  # named, but neither node is held out


def test_a_port_low_with_every_partner_blames_that_node():
    judged = [j for s, c in RING for j in rail(s, c, 190.0 if "d" in (s, c) else 395.0)]
    assert blamed(judged) == {("ib_port", "d", "ib:mlx5_0/1")}


def test_two_nodes_cannot_tell_which_end():
    judged = rail("a", "b", 100.0)
    assert blamed(judged) == {("pair", "", "rail:mlx5_0/1:a-b")}


def gpu_pairs(node: str, low: set[tuple[int, int]]) -> list[Judged]:
    out = []
    for i in range(8):
        for j in range(i + 1, 8):
            value = 150.0 if (i, j) in low else 740.0
            verdict = Verdict.FAIL if (i, j) in low else Verdict.PASS
            m = Measurement(Check.P2P_BIDIR_BW, f"gpu:{i}-gpu:{j}", value, "GB/s")
            out.append(Judged(node, m, verdict, "", ""))
    return out


def test_one_low_gpu_pair_is_the_pair():
    assert blamed(gpu_pairs("a", {(2, 5)})) == {("gpu_pair", "a", "gpu:2-gpu:5")}


def test_a_gpu_low_with_most_peers_is_the_gpu():
    low = {(min(3, k), max(3, k)) for k in range(8) if k != 3}
    assert blamed(gpu_pairs("b", low)) == {("gpu", "b", "gpu:3")}


def test_a_failed_ladder_rung_names_the_nodes_it_added():
    m = Measurement(Check.LADDER_EFFICIENCY, "nodes:4", 0.6, "ratio")
    found = localise([Judged("a", m, Verdict.FAIL, "", "")], NODES)
    assert [(s.kind, s.nodes) for s in found] == [("ladder_rung", ("c", "d"))]


def test_a_multi_node_failure_explained_by_a_failing_node():
    own = Measurement(Check.H2D_BW, "gpu:1", 20.0, "GB/s")
    multi = Measurement(Check.ALLREDUCE_MULTI, "nodes:4", 100.0, "GB/s")
    found = localise(
        [Judged("c", own, Verdict.FAIL, "", ""), Judged("a", multi, Verdict.FAIL, "", "")], NODES
    )
    assert [(s.kind, s.nodes) for s in found] == [("explained", ("c",))]


def one_node_rung(node: str, verdict: Verdict, util: dict[int, float]) -> list[Judged]:
    thr = Measurement(Check.LADDER_THROUGHPUT, "nodes:1", 1600.0, "samples/s")
    shown = ", ".join(f"gpu:{g} {p:g}%" for g, p in util.items())
    mean = sum(util.values()) / len(util)
    used = Measurement(
        Check.GPU_UTILISATION, "nodes:1", mean, "percent",
        evidence=f"mean of 12 reads of every GPU while it ran; per GPU: {shown}",
    )  # fmt: skip
    return [Judged(node, thr, verdict, "", "outlier"), Judged(node, used, Verdict.PASS, "", "")]


def test_a_slow_one_node_rung_names_the_gpu_its_peers_waited_for():
    util = dict.fromkeys(range(8), 62.5) | {3: 100.0}
    found = localise(one_node_rung("b", Verdict.FAIL, util), NODES)
    assert [(s.kind, s.node, s.component) for s in found] == [("gpu", "b", "gpu:3")]
    assert "GPU 3" in found[0].reason
    assert any("gpu:3 100%" in e for e in found[0].evidence)


def test_a_slow_one_node_rung_with_no_gpu_standing_out_names_the_node():
    found = localise(one_node_rung("b", Verdict.FAIL, dict.fromkeys(range(8), 97.0)), NODES)
    assert [(s.kind, s.node, s.component) for s in found] == [("node", "b", "node")]


def test_a_passing_one_node_rung_names_nothing():
    util = dict.fromkeys(range(8), 62.5) | {3: 100.0}
    assert localise(one_node_rung("b", Verdict.PASS, util), NODES) == []


def test_a_node_failing_outside_a_failed_group_does_not_explain_it():
    """The 2-node rung (a, b) falls short while d failed on its own: d was not in it."""
    own = Measurement(Check.H2D_BW, "gpu:1", 20.0, "GB/s")
    rung = Measurement(Check.LADDER_EFFICIENCY, "nodes:2", 0.6, "ratio")
    found = localise(
        [Judged("d", own, Verdict.FAIL, "", ""), Judged("a", rung, Verdict.FAIL, "", "")], NODES
    )
    assert [(s.kind, s.nodes) for s in found] == [("ladder_rung", ("b",))]


def test_a_half_of_a_bisection_is_explained_only_by_its_own_nodes():
    """Two halves' all-reduces, (a, b) reported by a and (c, d) by c, both failed; only b failed
    on its own: the first half is explained, the second is not."""
    own = Measurement(Check.H2D_BW, "gpu:1", 20.0, "GB/s")
    half = Measurement(Check.ALLREDUCE_MULTI, "nodes:2", 100.0, "GB/s")
    found = localise(
        [
            Judged("b", own, Verdict.FAIL, "", ""),
            Judged("a", half, Verdict.FAIL, "", ""),
            Judged("c", half, Verdict.FAIL, "", ""),
        ],
        NODES,
    )
    assert [(s.kind, s.nodes) for s in found] == [
        ("explained", ("b",)),
        ("unexplained", tuple(NODES)),
    ]


def test_a_cable_inside_a_failed_group_explains_it_without_a_node():
    judged = [j for s, c in RING for j in rail(s, c, 150.0 if (s, c) == ("b", "c") else 395.0)]
    multi = Measurement(Check.ALLREDUCE_MULTI, "nodes:4", 100.0, "GB/s")
    found = localise([*judged, Judged("a", multi, Verdict.FAIL, "", "")], NODES)
    assert [(s.kind, s.nodes) for s in found] == [("cable", ("b", "c")), ("explained", ())]
    assert "the link b-c" in found[1].reason
