"""``fleetwatch preflight run`` as people read it: progress per round, folded lines, estimates.

The plans come from the real planner, the run in progress from the orchestrator's own
``LiveRun`` and the finished run from the API's ``run_detail``: only the HTTP hop is left out.
"""

from __future__ import annotations

import io
from typing import Any

import pytest

from cli import preflight as cli_preflight
from cli.preflight import estimate_line, fold_names, plan_time, print_detail, print_plan
from collector.api.preflight import run_detail
from collector.preflight.orchestrator import LiveRun
from collector.preflight.plan import NodeFacts, Plan, plan_run
from collector.store.preflight import RunRow
from fleetwatch.preflight.vocabulary import Level

RAILS = tuple((f"mlx5_{i}", 1) for i in range(8))
H100 = "NVIDIA H100 80GB HBM3"


def facts(n: int) -> list[NodeFacts]:
    return [
        NodeFacts(f"node-{i:02d}", f"10.0.0.{i}", 8, H100, RAILS, 400.0) for i in range(1, n + 1)
    ]


def plan_of(level: Level, n: int) -> Plan:
    return plan_run("pf-20261202T030000-abcd", level, facts(n))


class TestFoldNames:
    @pytest.mark.parametrize(
        ("names", "folded"),
        [
            ([f"node-{i:02d}" for i in range(1, 15)], "node-01..14"),
            (["node-03", "node-01", "node-02", "node-05"], "node-01..03, node-05"),
            (["gpu-9", "gpu-10", "gpu-11"], "gpu-9..11"),  # no padding: 9 and 10 follow
            (["n09", "n10"], "n09..10"),  # the same width
            (["n9", "n010"], "n9, n010"),  # written differently: not one run
            (["n01", "n1"], "n1, n01"),  # the same number twice, written two ways
            (["rack1-gpu2", "rack2-gpu2", "rack1-gpu3"], "rack1-gpu2..3, rack2-gpu2"),
            (["login", "node-02", "admin", "node-01"], "admin, login, node-01..02"),
            (["node-01", "node-01", "node-02"], "node-01..02"),  # a name twice counts once
            (["17", "18", "20"], "17..18, 20"),  # all digits: an empty prefix
            (["a..b1", "a..b2"], "a..b1..2"),  # dots in the prefix are the prefix's
            (["gpu-099", "gpu-100", "gpu-1000"], "gpu-099..100, gpu-1000"),
            (
                ["node-01.example.com", "node-02.example.com"],
                "node-01.example.com, node-02.example.com",
            ),
            (["solo"], "solo"),
            ([], ""),
        ],
    )
    def test_sorted_names_with_consecutive_numbers_fold_into_ranges(self, names, folded):
        """A run needs one prefix and numbers that follow one another written alike; anything
        else stays as it is, in order."""
        assert folded == fold_names(names)


class TestEstimate:
    def test_a_full_plan_adds_up_its_rounds_and_names_the_bisection_it_may_add(self):
        """16 nodes at full: quick 60 s, node bandwidth 900 s, two ib_write_bw rounds of 180 s,
        the all-reduce 600 s and five ladder rounds of 900 s (the planner's PlanTimes); an
        unexplained slow all-reduce halves 16 -> 8 -> 4 -> 2 nodes: three more rounds of 600 s."""
        plan = plan_of(Level.FULL, 16).to_json()
        assert plan_time(plan) == (60 + 900 + 2 * 180 + 600 + 5 * 900, 3, 600.0)
        assert estimate_line(plan) == (
            "estimate: at most 1 h 47 min for 10 rounds (each round's time added up; a round "
            "ends as soon as every node answered); if the multi-node all-reduce fails with "
            "nothing to blame, up to 3 bisection rounds more (30 min)"
        )

    def test_quick_and_standard_have_no_bisection(self):
        """Only a multi-node all-reduce is bisected: quick and standard have none."""
        assert plan_time(plan_of(Level.QUICK, 1).to_json()) == (60.0, 0, 0.0)
        assert plan_time(plan_of(Level.STANDARD, 64).to_json()) == (960.0, 0, 0.0)

    def test_three_nodes_are_not_bisected(self):
        """Three ib_write_bw rounds for an odd ring; fewer than four nodes are never halved."""
        total, halvings, _ = plan_time(plan_of(Level.FULL, 3).to_json())
        assert (total, halvings) == (60 + 900 + 3 * 180 + 600 + 2 * 900, 0)

    def test_dry_run_prints_each_rounds_time_and_the_estimate_last(self):
        """``--dry-run`` says each round's time in words and ends with the estimate."""
        out = io.StringIO()
        print_plan(plan_of(Level.STANDARD, 2).to_json(), out)
        lines = out.getvalue().splitlines()
        assert lines[0] == "plan pf-20261202T030000-abcd: level standard, 2 nodes, 2 rounds"
        assert "round 2: node bandwidth (up to 15 min)" in lines
        assert lines[-1].startswith("estimate: at most 16 min for 2 rounds")


def finished_detail(plan: Plan, results: list[dict[str, Any]], **row: Any) -> dict[str, Any]:
    verdicts = dict.fromkeys(plan.nodes, "pass") | row.pop("node_verdicts", {})
    run = RunRow(plan.run_id, plan.level.value, plan.nodes, 1, 2, node_verdicts=verdicts, **row)
    return run_detail(run, results)


def result(
    node: str, check: str, verdict: str, *, component: str = "node", **kw: Any
) -> dict[str, Any]:
    return {"node": node, "check": check, "component": component, "verdict": verdict, **kw}


class FakeApi:
    """The collector's answers, in order: the POST's plan, then what each GET finds."""

    def __init__(self, plan: Plan, polls: list[dict[str, Any]]) -> None:
        self.plan = plan
        self.polls = polls
        self.asked: list[tuple[str, str]] = []

    def call(self, _api: str, method: str, path: str, *_body: Any, **_kw: Any) -> Any:
        self.asked.append((method, path))
        if method == "POST":
            return {"run_id": self.plan.run_id, "plan": self.plan.to_json()}
        return self.polls.pop(0)


def live(plan: Plan, round_index: int, **extra: Any) -> dict[str, Any]:
    return {
        "run": LiveRun(plan, 1, round_index=round_index).to_json() | extra,
        "nodes": {},
        "results": [],
    }


class FakeClock:
    """Time that moves only when the command sleeps between polls."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run_cli(monkeypatch: pytest.MonkeyPatch, fake: FakeApi) -> tuple[int, list[str]]:
    monkeypatch.setattr(cli_preflight, "call", fake.call)
    clock = FakeClock()
    out = io.StringIO()
    code = cli_preflight.run(
        "http://collector:9470",
        level=fake.plan.level.value,
        nodes="all",
        dry_run=False,
        out=out,
        sleep=clock.sleep,
        monotonic=clock.monotonic,
    )
    assert fake.polls == []  # every answer was asked for
    return code, out.getvalue().splitlines()


class TestProgress:
    def test_each_round_gets_a_line_as_it_completes_with_the_pairs_done(self, monkeypatch):
        """Full on four nodes (8 rounds): the collector is seen in rounds 1, 4 and 6, then done.
        Each round finished since the last poll gets its own line, once; the ib_write_bw
        rounds count the ring's pairs (two a round, four in all); then the table."""
        plan = plan_of(Level.FULL, 4)
        polls = [
            live(plan, 0),
            live(plan, 3),
            live(plan, 5),
            finished_detail(plan, [], verdict="pass"),
        ]
        code, lines = run_cli(monkeypatch, FakeApi(plan, polls))
        assert code == 0
        assert lines[0] == (
            "pre-flight pf-20261202T030000-abcd started: level full, 4 nodes, 8 rounds, "
            "at most 1 h 17 min"
        )
        pairs = "ib_write_bw pairs {} of 4 done; failures so far: none"
        none = "; failures so far: none"
        assert lines[1:9] == [
            "[    1 s] round 1 of 8 done: quick, 4 nodes" + none,
            "[    1 s] round 2 of 8 done: node bandwidth, 4 nodes" + none,
            "[    1 s] round 3 of 8 done: ib_write_bw 1/2, 4 nodes, 2 pairs; " + pairs.format(2),
            "[    2 s] round 4 of 8 done: ib_write_bw 2/2, 4 nodes, 2 pairs; " + pairs.format(4),
            "[    2 s] round 5 of 8 done: all-reduce on 4 nodes, 4 nodes" + none,
            "[    3 s] round 6 of 8 done: ladder on 1 node, every node, 4 nodes",
            "[    3 s] round 7 of 8 done: ladder on 2 nodes, 2 nodes",
            "[    3 s] round 8 of 8 done: ladder on 4 nodes, 4 nodes",
        ]
        assert lines[9] == "pre-flight pf-20261202T030000-abcd (full, 4 nodes): PASS"

    def test_failures_so_far_are_shown_when_the_collector_reports_them(self, monkeypatch):
        """A collector whose run in progress also says how many rounds are done
        (``rounds_done``) and which nodes fail so far (``failing``, each node's worst verdict):
        each line says so, the nodes folded into ranges; the last line leaves it to the table."""
        plan = plan_of(Level.STANDARD, 6)
        failing = {"node-02": "fail", "node-03": "fail", "node-05": "could_not_run"}
        polls = [
            live(plan, 1, rounds_done=1, failing=failing),
            finished_detail(plan, [], verdict="fail", node_verdicts=dict.fromkeys(failing, "fail")),
        ]
        code, lines = run_cli(monkeypatch, FakeApi(plan, polls))
        assert code == 1
        assert lines[1] == (
            "[    0 s] round 1 of 2 done: quick, 6 nodes; failures so far: "
            "node-02..03 fail; node-05 could_not_run"
        )
        assert lines[2] == "[    1 s] round 2 of 2 done: node bandwidth, 6 nodes"

    def test_a_run_cut_short_does_not_claim_its_last_rounds(self, monkeypatch):
        """A run the collector stopped in its second round: only the first is said done."""
        plan = plan_of(Level.STANDARD, 2)
        cut = "cut short: the collector running it stopped before it finished"
        polls = [live(plan, 1), finished_detail(plan, [], verdict="could_not_run", detail=cut)]
        code, lines = run_cli(monkeypatch, FakeApi(plan, polls))
        assert code == 2
        assert [line for line in lines if " done: " in line] == [
            "[    0 s] round 1 of 2 done: quick, 2 nodes; failures so far: none"
        ]

    def test_json_prints_only_the_apis_answer(self, monkeypatch):
        """A script reading ``--json`` gets one JSON document, no progress lines."""
        plan = plan_of(Level.QUICK, 2)
        fake = FakeApi(plan, [live(plan, 0), finished_detail(plan, [], verdict="pass")])
        monkeypatch.setattr(cli_preflight, "call", fake.call)
        out = io.StringIO()
        code = cli_preflight.run(
            "http://c:1",
            level="quick",
            nodes="all",
            dry_run=False,
            out=out,
            as_json=True,
            sleep=lambda _s: None,
        )
        assert code == 0
        assert out.getvalue().lstrip().startswith("{")
        assert " done: " not in out.getvalue()


REFUSED = (
    "node {} refused: a job is running here: job 'pretrain' reported a step through the job "
    "socket 3 s ago"
)
CABLE = (
    "ib_write_bw on mlx5_3/1 between node-01 and node-04 is low while both test fine with other "
    "partners: the link between them (cable, transceiver or switch port)"
)


class TestDetail:
    def test_nodes_refused_for_the_same_reason_share_one_line(self):
        """14 of 16 nodes refuse every check because a job runs there: one line for them all,
        their names folded, the reason said once for every check; the others keep their own."""
        plan = plan_of(Level.QUICK, 16)
        checks = list(plan.rounds[0].tasks["node-01"].checks)
        results = [
            result(n, c, "could_not_run", error=REFUSED.format(n))
            for n in plan.nodes[:14]
            for c in checks
        ]
        results += [result(n, c, "pass") for n in plan.nodes[14:] for c in checks]
        detail = finished_detail(
            plan,
            results,
            verdict="could_not_run",
            node_verdicts=dict.fromkeys(plan.nodes[:14], "could_not_run"),
        )
        out = io.StringIO()
        assert print_detail(detail, out) == 2
        lines = out.getvalue().splitlines()
        assert lines[1].split() == ["NODE", "VERDICT", "CHECKS", "WHAT"]
        assert lines[2].split()[:3] == ["node-01..14", "could_not_run", f"0/{len(checks)}"]
        assert lines[2].endswith(
            f"every check ({len(checks)}): the node refused: a job is running here: job "
            "'pretrain' reported a step through the job socket 3 s ago"
        )
        assert lines[3].split() == [
            "node-15..16",
            "pass",
            f"{len(checks)}/{len(checks)}",
            "pass",
            "-",
        ]
        assert len(lines) == 4

    def test_a_node_alone_keeps_its_name_in_its_reason(self):
        """A line of one node reads as the collector wrote it, the node's name in it."""
        plan = plan_of(Level.QUICK, 2)
        results = [result("node-02", "gpu_count", "could_not_run", error=REFUSED.format("node-02"))]
        detail = finished_detail(
            plan, results, verdict="could_not_run", node_verdicts={"node-02": "could_not_run"}
        )
        out = io.StringIO()
        print_detail(detail, out)
        assert "gpu_count node: " + REFUSED.format("node-02") in out.getvalue()

    def test_blame_and_long_reasons_are_printed_whole(self):
        """What was found and blamed is never cut, however long (the table cut at 90 before)."""
        plan = plan_of(Level.FULL, 4)
        low = "p2p_bidir_bw gpu:3-gpu:6: 240 GB/s, needs >= 670 GB/s (H100 gate); " + "x" * 80
        results = [result("node-02", "p2p_bidir_bw", "fail", component="gpu:3-gpu:6", reason=low)]
        cable = {
            "kind": "cable",
            "node": "",
            "nodes": ["node-01", "node-04"],
            "component": "rail:mlx5_3/1:node-01-node-04",
            "reason": CABLE,
        }
        detail = finished_detail(
            plan, results, verdict="fail", node_verdicts={"node-02": "fail"}, suspects=[cable]
        )
        out = io.StringIO()
        print_detail(detail, out)
        text = out.getvalue()
        assert low in text
        assert f"  cable rail:mlx5_3/1:node-01-node-04 (node-01, node-04): {CABLE}" in text

    def test_results_shared_by_several_nodes_are_folded_too(self):
        """The same result of a group on several nodes is one line naming them as ranges."""
        plan = plan_of(Level.FULL, 4)
        why = "all-reduce on 4 nodes not started: node-03 not connected"
        results = [
            result(n, "allreduce_multi", "could_not_run", component="nodes:4", error=why)
            for n in ("node-01", "node-02", "node-04")
        ]
        detail = finished_detail(plan, results, verdict="could_not_run")
        out = io.StringIO()
        print_detail(detail, out)
        assert (
            f"  node-01..02, node-04: allreduce_multi nodes:4: {why}" in out.getvalue().splitlines()
        )
