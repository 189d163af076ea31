"""Where ``fleetwatch demo --preflight`` starts its job, and how it words each node it avoids.

The runs are judged by the collector's own localisation (``localise``, ``node_verdicts``) from
made-up results, and the drains are rows as the dispatcher journals them.
"""

from __future__ import annotations

from cli.demo.preflight import JobPlacement, place_job, table
from collector.preflight.judge import Judged, node_verdicts
from collector.preflight.localise import localise
from collector.store.incidents import ActionRow
from collector.store.preflight import RunRow
from fleetwatch.preflight.vocabulary import Check, Measurement, Verdict, worst

FOUR = ("node-01", "node-02", "node-03", "node-04")
CAP = "drain cap reached: 1 of 4 nodes drained or draining (cap 1)"


def rail(server: str, client: str, value: float, name: str = "mlx5_3/1") -> list[Judged]:
    """One ib_write_bw pair, as both ends report it."""
    verdict = Verdict.PASS if value >= 380 else Verdict.FAIL
    m = Measurement(Check.IB_WRITE_BW, f"rail:{name}:{server}-{client}", value, "Gb/s")
    return [Judged(server, m, verdict, "", ""), Judged(client, m, verdict, "", "")]


def ring(nodes: tuple[str, ...]) -> list[tuple[str, str]]:
    """The planner's ring: a-b, b-c, ..., and the last back to the first (lower name first)."""
    pairs = [(a, nodes[(i + 1) % len(nodes)]) for i, a in enumerate(nodes)]
    return [(min(a, b), max(a, b)) for a, b in pairs]


def own_fail(node: str) -> Judged:
    m = Measurement(Check.P2P_BIDIR_BW, "gpu:1-gpu:5", 381.0, "GB/s")
    return Judged(node, m, Verdict.FAIL, "", "GPUs 1 and 5 low")


def finished(nodes: tuple[str, ...], judged: list[Judged]) -> RunRow:
    """The run's row as the orchestrator journals it (its verdicts folded with its suspects)."""
    suspects = localise(judged, nodes)
    per_node = node_verdicts(judged, nodes)
    for s in suspects:
        if s.node in per_node:
            per_node[s.node] = worst([per_node[s.node], s.verdict])
    return RunRow(
        "pf-1",
        "full",
        nodes,
        0,
        1,
        verdict=worst(list(per_node.values())).value,
        node_verdicts={n: v.value for n, v in per_node.items()},
        suspects=[s.to_json() for s in suspects],
    )


def cable_run(
    nodes: tuple[str, ...], low: set[tuple[str, str]], failing: tuple[str, ...] = ()
) -> RunRow:
    judged = [j for a, b in ring(nodes) for j in rail(a, b, 150.0 if (a, b) in low else 395.0)]
    return finished(nodes, judged + [own_fail(n) for n in failing])


def drain(node: str, state: str, detail: str = "", at_ms: int = 1) -> ActionRow:
    return ActionRow(
        idempotency_key=f"pf-1:drain_node:{node}",
        incident_id=f"preflight_p2p_bw:{node}:0",
        action="drain_node",
        node=node,
        target=node,
        state=state,
        created_ms=at_ms,
        params={},
        detail=detail,
    )


class TestPlaceJob:
    def test_the_job_never_spans_the_cable_pre_flight_blamed(self):
        """The demo's four nodes: node-02 and node-03 fail on their own, the cable between
        node-01 and node-04 is blamed with both ends passing. The job ran on both ends before;
        now it keeps node-01 and leaves node-04 out, naming the cable."""
        run = cable_run(FOUR, {("node-01", "node-04")}, failing=("node-02", "node-03"))
        cable = [s for s in run.suspects or [] if s["kind"] == "cable"]
        assert [s["nodes"] for s in cable] == [["node-01", "node-04"]]
        placement = place_job(
            run, [drain("node-02", "succeeded"), drain("node-03", "deferred", CAP)]
        )
        assert placement.nodes == ("node-01",)
        assert placement.skip == {"node-02", "node-03", "node-04"}
        assert placement.left_out == (
            ("node-04", "the cable rail:mlx5_3/1:node-01-node-04 joins it to node-01"),
        )

    def test_only_one_end_of_a_cable_is_left_out(self):
        """Six healthy nodes and a bad cable between node-02 and node-03: five nodes run it."""
        nodes = tuple(f"node-{i:02d}" for i in range(1, 7))
        run = cable_run(nodes, {("node-02", "node-03")})
        placement = place_job(run, [])
        assert placement.nodes == ("node-01", "node-02", "node-04", "node-05", "node-06")
        assert [n for n, _ in placement.left_out] == ["node-03"]

    def test_a_node_on_two_blamed_cables_is_left_out_alone(self):
        """node-03 is low with node-02 on one rail and with node-04 on another, each fine with
        its other partner: two cables. Leaving node-03 out breaks both, where leaving out a far
        end of each would cost two nodes."""
        nodes = tuple(f"node-{i:02d}" for i in range(1, 7))
        low = {("mlx5_0/1", "node-02", "node-03"), ("mlx5_1/1", "node-03", "node-04")}
        judged = [
            j
            for name in ("mlx5_0/1", "mlx5_1/1")
            for a, b in ring(nodes)
            for j in rail(a, b, 150.0 if (name, a, b) in low else 395.0, name)
        ]
        run = finished(nodes, judged)
        assert sorted(s["kind"] for s in run.suspects or []) == ["cable", "cable"]
        placement = place_job(run, [])
        assert placement.nodes == ("node-01", "node-02", "node-04", "node-05", "node-06")
        assert placement.left_out == (
            (
                "node-03",
                (
                    "the cable rail:mlx5_0/1:node-02-node-03 joins it to node-02; "
                    "the cable rail:mlx5_1/1:node-03-node-04 joins it to node-04"
                ),
            ),
        )

    def test_a_pair_two_nodes_could_not_tell_apart_is_avoided_too(self):
        """Two nodes, one low pair: no end can be blamed (``pair``); the job runs on one."""
        run = finished(("node-01", "node-02"), rail("node-01", "node-02", 100.0))
        assert [s["kind"] for s in run.suspects or []] == ["pair"]
        placement = place_job(run, [])
        assert placement.nodes == ("node-01",)
        assert placement.left_out[0][1].startswith("the pair rail:mlx5_3/1:node-01-node-02")

    def test_every_node_that_failed_is_avoided_whatever_its_drain(self):
        """Drained, deferred by the cap, refused by a cooldown, or never asked (dry run): the
        job runs on none of them, and each is sorted by what became of its drain."""
        nodes = tuple(f"node-{i:02d}" for i in range(1, 6))
        run = cable_run(nodes, set(), failing=("node-02", "node-03", "node-04", "node-05"))
        actions = [
            drain("node-02", "succeeded"),
            drain("node-03", "deferred", CAP),
            drain("node-04", "skipped", "cooldown: drain_node ran on node-04"),
        ]
        placement = place_job(run, actions)
        assert placement == JobPlacement(
            nodes=("node-01",),
            held_out=("node-02",),
            deferred=("node-03",),
            not_drained=(
                ("node-04", "drain skipped: cooldown: drain_node ran on node-04"),
                ("node-05", "no drain"),
            ),
        )

    def test_no_node_left_says_so(self):
        run = cable_run(
            ("node-01", "node-02", "node-03"), set(), failing=("node-01", "node-02", "node-03")
        )
        placement = place_job(run, [])
        assert placement.nodes == ()
        assert placement.lines()[0] == "the job starts on no node:"


class TestWording:
    def test_a_drain_deferred_by_the_cap_is_not_called_held_out(self):
        """node-03's drain waits for room under the drain cap: the table says so, and only
        node-02, whose drain ran, is held out (before, both were "held out")."""
        run = cable_run(FOUR, {("node-01", "node-04")}, failing=("node-02", "node-03"))
        actions = [
            drain("node-02", "succeeded", at_ms=1),
            drain("node-03", "deferred", CAP, at_ms=2),
        ]
        lines = table(run, [], actions, 1.0)
        about = {n: [line for line in lines if "held out" in line and n in line] for n in FOUR}
        assert about["node-03"] == []
        end = lines[lines.index("the job starts on node-01:") :]
        assert end == [
            "the job starts on node-01:",
            "  not on node-02: failed, held out (drained)",
            "  not on node-03: failed; drain deferred by the cap (not drained yet)",
            (
                "  not on node-04: passed, but the cable rail:mlx5_3/1:node-01-node-04 joins it "
                "to node-01"
            ),
        ]

    def test_the_cables_reason_is_printed_whole(self):
        """The cable's reason is longer than the 110 characters the table kept before."""
        run = cable_run(FOUR, {("node-01", "node-04")})
        reason = next(str(s["reason"]) for s in run.suspects or [] if s["kind"] == "cable")
        assert len(reason) > 110
        assert f"    {reason}" in table(run, [], [], 1.0)
