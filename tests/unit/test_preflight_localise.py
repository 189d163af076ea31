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
