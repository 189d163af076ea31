"""How `fleetwatch reliability` prints the figures: shares, spans, lists, the per-node table."""

import io
from argparse import Namespace

import pytest

from cli import reliability

LAST = {"remediations": 3, "drains": 2, "resets": 1, "reboots": 0, "rma_tickets": 0}
NODE = {
    "node": "n1",
    "gpus": 8,
    "state": "in_repair",
    "incident_episodes": 3,
    "mean_time_between_incidents_s": 5400.0,
    "time_between_incidents_s": [3600.0, 7200.0],
    "repairs": 1,
    "mean_time_to_repair_s": 90.0,
    "time_to_repair_s": [90.0],
    "open_repair_s": 600.0,
    "out_of_service_s": 690.0,
    "gpu_time_lost_ratio": 0.000266,
    "last_7d": {**LAST, "incident_episodes": 3},
    "lemon": False,
    "rules_see": {"remediations_7d": 3, "incidents_7d": 3, "seen_by_person": True},
}


def shown(data, node: str | None, monkeypatch) -> str:
    monkeypatch.setattr(reliability, "call", lambda *_a, **_k: data)
    out = io.StringIO()
    args = Namespace(api="http://c", node=node, window="30d", output="table")
    assert reliability.run(args, out) == 0
    return out.getvalue()


class TestOutput:
    @pytest.mark.parametrize(
        ("ratio", "text"), [(0, "0 %"), (0.00001, "< 0.01 %"), (0.0123, "1.23 %")]
    )
    def test_shares(self, ratio, text):
        assert reliability._share(ratio) == text

    def test_a_long_list_is_cut(self):
        assert reliability._listed([60.0] * 10) == ": " + ", ".join(["1m"] * 8) + " and 2 more"

    def test_one_node(self, monkeypatch):
        text = shown({"window_s": 604800.0, "node": NODE}, "n1", monkeypatch)
        assert text.splitlines() == [
            "n1, last 7 days: in repair, 8 GPUs",
            "  incident episodes: 3; time between incidents: mean 1h30m (2): 1h, 2h",
            "  repairs done: mean 1m30s (1): 1m30s; out of service for 10m now",
            "  out of service 11m30s in all: 0.03 % of its GPU time",
            "last 7 days: 3 remediations (2 drains, 1 reset), 3 incident episodes",
            "lemon: no (the rules see remediations_7d 3, incidents_7d 3, seen_by_person true)",
        ]

    def test_the_fleet(self, monkeypatch):
        fleet = {
            "nodes": 2,
            "gpus": 16,
            "incident_episodes": 3,
            "mean_time_between_incidents_s": None,
            "time_between_incidents_s": [],
            "repairs": 0,
            "mean_time_to_repair_s": None,
            "time_to_repair_s": [],
            "open_repairs": [{"node": "n1", "age_s": 600.0}],
            "gpu_time_lost_ratio": 0.0,
            "last_7d": {**LAST, "incident_episodes": 3},
            "lemon_nodes": [],
        }
        text = shown({"window_s": 2592000.0, "fleet": fleet, "nodes": [NODE]}, None, monkeypatch)
        lines = text.splitlines()
        assert lines[:6] == [
            "fleet, last 30 days: 2 nodes, 16 GPUs",
            "  incident episodes: 3; time between incidents: none",
            "  repairs done: none; 1 under way, the oldest n1 for 10m",
            "  GPU time lost: 0 %",
            "last 7 days: 3 remediations (2 drains, 1 reset), 3 incident episodes",
            "lemon nodes: none",
        ]
        assert lines[7].split() == [
            "NODE",
            "STATE",
            "EPISODES",
            "MTBI",
            "REPAIRS",
            "MTTR",
            "OUT",
            "NOW",
            "GPU",
            "TIME",
            "LOST",
            "REMEDIATIONS",
            "7D",
            "EPISODES",
            "7D",
            "LEMON",
        ]
        assert lines[8].split() == [
            "n1",
            "in",
            "repair",
            "3",
            "1h30m",
            "1",
            "1m30s",
            "10m",
            "0.03",
            "%",
            "3",
            "3",
            "-",
        ]
