"""Localisation with node names as clusters have them: with dashes (gpu-01, node-05)."""

from __future__ import annotations

from collector.preflight.judge import Judged
from collector.preflight.localise import localise, rail_parts
from fleetwatch.preflight.vocabulary import Check, Measurement, Verdict

NODES = ["node-01", "node-02", "node-03", "node-04"]
RING = [
    ("node-01", "node-02"),
    ("node-03", "node-04"),
    ("node-02", "node-03"),
    ("node-01", "node-04"),
]


def rail(server: str, client: str, value: float) -> list[Judged]:
    verdict = Verdict.PASS if value >= 380 else Verdict.FAIL
    m = Measurement(Check.IB_WRITE_BW, f"rail:mlx5_3/1:{server}-{client}", value, "Gb/s")
    return [Judged(server, m, verdict, "", ""), Judged(client, m, verdict, "", "")]


def test_the_reporting_end_tells_where_a_dashed_pair_splits():
    """Each end's name is whole, whichever end reported the result."""
    comp = "rail:mlx5_3/1:node-05-node-06"
    assert rail_parts(comp, "node-05") == ("mlx5_3/1", "node-05", "node-06")
    assert rail_parts(comp, "node-06") == ("mlx5_3/1", "node-05", "node-06")
    assert rail_parts(comp, "node-07") is None
    assert rail_parts("ib:mlx5_3/1", "node-05") is None


def test_a_bad_cable_between_dashed_nodes():
    """Low between node-02 and node-03 only: the cable, with both names whole (it was a pair
    of "node-02-node" and "03" that nothing else matched)."""
    bad = ("node-02", "node-03")
    judged = [j for s, c in RING for j in rail(s, c, 150.0 if (s, c) == bad else 395.0)]
    found = localise(judged, NODES)
    assert [(s.kind, s.component, s.nodes) for s in found] == [
        ("cable", "rail:mlx5_3/1:node-02-node-03", bad)
    ]


def test_a_port_low_with_both_partners_names_its_dashed_node():
    """node-04 is low with node-03 and node-01: its port (the node was read as "04")."""
    judged = [j for s, c in RING for j in rail(s, c, 190.0 if "node-04" in (s, c) else 395.0)]
    assert {(s.kind, s.node, s.component) for s in localise(judged, NODES)} == {
        ("ib_port", "node-04", "ib:mlx5_3/1")
    }
