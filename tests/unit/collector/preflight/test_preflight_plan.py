"""The planner: rounds, ib_write_bw pairing, groups and the ladder."""

from __future__ import annotations

import pytest

from collector.preflight.plan import NodeFacts, ladder_rungs, plan_run, ring_pair_rounds
from fleetwatch.preflight.vocabulary import Check, Level
from fleetwatch.wire.validate_preflight import validate_task

RAILS = tuple((f"mlx5_{i}", 1) for i in range(8))


def facts(n: int) -> list[NodeFacts]:
    return [
        NodeFacts(f"gpu-{i:02d}", f"10.0.0.{i}", 8, "NVIDIA H100 80GB HBM3", RAILS, 400.0)
        for i in range(1, n + 1)
    ]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16, 17])
def test_ring_pairs_are_disjoint_per_round_and_give_every_node_two_partners(n: int):
    names = [f"n{i:02d}" for i in range(n)]
    rounds = ring_pair_rounds(names)
    assert len(rounds) == (1 if n == 2 else 2 if n % 2 == 0 else 3)
    partners: dict[str, set[str]] = {name: set() for name in names}
    for pairs in rounds:
        busy = [node for pair in pairs for node in pair]
        assert len(busy) == len(set(busy)), "a node twice in one round"
        for server, client in pairs:
            assert server < client  # the lower name serves
            partners[server].add(client)
            partners[client].add(server)
    expected = 1 if n == 2 else 2
    assert all(len(p) == expected for p in partners.values())


def test_ladder_is_the_powers_of_two_available():
    assert ladder_rungs(1) == [1]
    assert ladder_rungs(6) == [1, 2, 4]
    assert ladder_rungs(40) == [1, 2, 4, 8, 16]


def test_quick_is_one_round_of_every_node():
    plan = plan_run("pf-1", Level.QUICK, facts(3))
    assert [r.name for r in plan.rounds] == ["quick"]
    assert set(plan.rounds[0].tasks) == {"gpu-01", "gpu-02", "gpu-03"}
    task = plan.rounds[0].tasks["gpu-02"]
    assert Check.ECC_MODE.value in task.checks
    validate_task(task)


def test_full_plans_ib_rounds_with_roles_and_ports_then_collective_and_ladder():
    plan = plan_run("pf-2", Level.FULL, facts(4))
    names = [r.name for r in plan.rounds]
    assert names == [
        "quick",
        "node bandwidth",
        "ib_write_bw 1/2",
        "ib_write_bw 2/2",
        "all-reduce on 4 nodes",
        "ladder on 1 node, every node",
        "ladder on 2 nodes",
        "ladder on 4 nodes",
    ]
    first = plan.rounds[2]
    assert set(first.tasks) == {"gpu-01", "gpu-02", "gpu-03", "gpu-04"}  # all pairs at once
    server = first.tasks["gpu-01"].ib_tests
    client = first.tasks["gpu-02"].ib_tests
    assert [t.server for t in server] == [True] * 8
    assert [t.server for t in client] == [False] * 8
    assert {t.peer for t in client} == {"gpu-01"}
    assert {t.server_addr for t in client} == {"10.0.0.1"}
    assert [t.tcp_port for t in client] == [t.tcp_port for t in server]
    assert len({t.tcp_port for t in client}) == 8  # one port per rail: they run at once
    multi = plan.rounds[4].tasks["gpu-03"].groups[0]
    assert list(multi.nodes) == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    assert multi.node_rank == 2
    assert multi.master_addr == "10.0.0.1"
    rung = plan.rounds[6]
    assert set(rung.tasks) == {"gpu-01", "gpu-02"}
    for rnd in plan.rounds:
        for task in rnd.tasks.values():
            validate_task(task)
    assert plan.ib_pairs == (
        (("gpu-01", "gpu-02"), ("gpu-03", "gpu-04")),
        (("gpu-02", "gpu-03"), ("gpu-01", "gpu-04")),
    )


def test_the_one_node_rung_runs_on_every_node_at_once_each_its_own_group():
    """A slow GPU slows only its own node's step: every node runs the one-node rung, in one
    round, so each node's throughput can be judged against the fleet's."""
    plan = plan_run("pf-3", Level.FULL, facts(16))
    ladders = [r for r in plan.rounds if r.name.startswith("ladder")]
    assert [r.name for r in ladders] == [
        "ladder on 1 node, every node",
        "ladder on 2 nodes",
        "ladder on 4 nodes",
        "ladder on 8 nodes",
        "ladder on 16 nodes",
    ]
    one = ladders[0]
    assert set(one.tasks) == {f"gpu-{i:02d}" for i in range(1, 17)}
    for node, task in one.tasks.items():
        assert set(task.checks) == {"ladder_throughput", "gpu_utilisation"}
        (group,) = task.groups
        assert list(group.nodes) == [node]
        assert (group.node_rank, group.master_addr) == (0, "127.0.0.1")
        validate_task(task)
    assert set(ladders[2].tasks) == {"gpu-01", "gpu-02", "gpu-03", "gpu-04"}
    assert plan.ladder == (1, 2, 4, 8, 16)
