"""The simulated pre-flight runners: what they measure, how nodes meet, what could not run."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pytest

from agent.preflight.runners import (
    Collective,
    Group,
    HostBandwidth,
    IbBandwidth,
    LadderStep,
    PairBandwidth,
    Rail,
)
from agent.sim.bandwidth import P2P_GBS, BandwidthModel, Noise
from agent.sim.hardware import SimNode
from agent.sim.preflight import TOOL_SECONDS, SimFabric
from fleetwatch.preflight.vocabulary import Check, Measurement
from fleetwatch.testing import FakeClock

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def _fabric(tmp_path: Path, count: int = 3, meet_wait_s: float = 20.0) -> SimFabric:
    clock = FakeClock()
    nodes = {f"n{i}": SimNode(f"n{i}", tmp_path / f"n{i}", clock) for i in range(count)}
    return SimFabric(nodes, model=BandwidthModel(Noise(seed=3)), meet_wait_s=meet_wait_s)


def _rung(names: tuple[str, ...], ladders: list[LadderStep], tag: str) -> list[Measurement]:
    return _together(
        *(lambda r=r, lad=lad: lad.run(_group(names, r, tag), 10) for r, lad in enumerate(ladders))
    )


def _group(nodes: tuple[str, ...], rank: int, run: str = "r1") -> Group:
    return Group(run, nodes, rank, 8, nodes[0], 29500, 1 << 30, 30.0)


def _together(*calls: Callable[[], Measurement]) -> list[Measurement]:
    """Run the calls at once, each on a thread of its own, as the agents of the nodes would."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


class TestOneNode:
    def test_every_pair_both_ways_and_the_slow_pair(self, tmp_path: Path):
        """nvbandwidth's answer: 56 ordered pairs, 28 pairs both ways; p2p_low shows on its pair."""
        fabric = _fabric(tmp_path, 1)
        fabric.nodes["n0"].p2p_low(2, 6, 0.5)
        pair: PairBandwidth = fabric.runners("n0").pair
        got = pair.measure(range(8), 60.0)
        one_way = {m.component: m.value for m in got if m.check == Check.P2P_BW}
        both = {m.component: m.value for m in got if m.check == Check.P2P_BIDIR_BW}
        assert len(one_way) == 56
        assert len(both) == 28
        low = {c for c, v in one_way.items() if v is not None and v < P2P_GBS * 0.8}
        assert low == {"gpu:2-gpu:6", "gpu:6-gpu:2"}
        assert {c for c, v in both.items() if v is not None and v < 600} == {"gpu:2-gpu:6"}
        assert all(m.unit == "GB/s" and m.ran and "nvbandwidth" in m.evidence for m in got)
        assert (
            fabric.ledger[0].seconds
            == 56 * TOOL_SECONDS["p2p_pair"] + 28 * TOOL_SECONDS["p2p_bidir_pair"]
        )

    def test_host_bandwidth_follows_the_pcie_link(self, tmp_path: Path):
        """A GPU trained at Gen4 x8 copies to and from the host at a quarter of the others."""
        fabric = _fabric(tmp_path, 1)
        fabric.nodes["n0"].pcie_downgrade(5, gen=4, width=8)
        host: HostBandwidth = fabric.runners("n0").host
        got = host.measure(range(8), 60.0)
        assert {(m.check, m.component) for m in got} == {
            (check, f"gpu:{g}") for check in (Check.H2D_BW, Check.D2H_BW) for g in range(8)
        }
        slow = {(m.check, m.component) for m in got if m.value is not None and m.value < 20}
        assert slow == {(Check.H2D_BW, "gpu:5"), (Check.D2H_BW, "gpu:5")}

    def test_a_lost_gpu_could_not_be_measured(self, tmp_path: Path):
        """Pairs with a lost GPU carry an error and no value; the other pairs are measured."""
        fabric = _fabric(tmp_path, 1)
        fabric.nodes["n0"].pci_remove(1)
        pair: PairBandwidth = fabric.runners("n0").pair
        got = pair.measure(range(4), 60.0)
        failed = {m.component for m in got if not m.ran}
        assert failed == {"gpu:0-gpu:1", "gpu:1-gpu:0", "gpu:1-gpu:2", "gpu:2-gpu:1"} | {
            "gpu:1-gpu:3",
            "gpu:3-gpu:1",
        }
        assert all(m.value is None and "GPU 1 of n0 is lost" in m.error for m in got if not m.ran)

    def test_a_crashing_tool_is_an_error_not_a_pass(self, tmp_path: Path):
        """A tool made to fail answers every check with its message and no value."""
        fabric = _fabric(tmp_path, 1)
        fabric.broken["n0", "nvbandwidth"] = "Segmentation fault"
        host: HostBandwidth = fabric.runners("n0").host
        got = host.measure(range(2), 60.0)
        assert [m.error for m in got] == ["nvbandwidth failed: Segmentation fault"] * 4
        assert all(m.value is None for m in got)

    def test_single_node_all_reduce(self, tmp_path: Path):
        """A one-node group is allreduce_node on component node; an NVLink down lowers it."""
        fabric = _fabric(tmp_path, 2)
        collective: Collective = fabric.runners("n0").collective
        healthy = collective.all_reduce(_group(("n0",), 0))
        assert (healthy.check, healthy.component, healthy.unit) == (
            Check.ALLREDUCE_NODE,
            "node",
            "GB/s",
        )
        assert healthy.value is not None
        assert 470 <= healthy.value <= 490
        fabric.nodes["n1"].p2p_low(0, 1, 0.6)
        other: Collective = fabric.runners("n1").collective
        low = other.all_reduce(_group(("n1",), 0))
        assert low.value is not None
        assert low.value < healthy.value * 0.7


class TestAcrossNodes:
    def test_ib_write_bw_server_and_client_agree(self, tmp_path: Path):
        """Both ends of a test answer the same figure, named by rail, server and client."""
        fabric = _fabric(tmp_path)
        server: IbBandwidth = fabric.runners("n0").ib
        client: IbBandwidth = fabric.runners("n1").ib
        rail = Rail("mlx5_2", 1)
        got = _together(
            lambda: server.serve(rail, 18515, 30.0),
            lambda: client.connect(rail, "n0", 18515, 30.0),
        )
        assert {m.component for m in got} == {"rail:mlx5_2/1:n0-n1"}
        assert got[0].value == got[1].value
        assert got[0].value is not None
        assert 385 <= got[0].value <= 400
        assert got[0].unit == "Gb/s"
        assert "BW average" in got[1].evidence

    def test_a_bad_cable_shows_only_between_its_two_nodes(self, tmp_path: Path):
        """n0-n2 on rail 4 is low; n0-n1 and n1-n2 on rail 4 and n0-n2 on rail 3 are not."""
        fabric = _fabric(tmp_path)
        fabric.nodes["n0"].bad_cable("n2", 4, 0.3)
        ib = {n: fabric.runners(n).ib for n in fabric.nodes}

        def test(server: str, client: str, rail: str, port: int) -> float | None:
            r = Rail(rail, 1)
            s, c = ib[server], ib[client]
            assert s is not None
            assert c is not None
            got = _together(
                lambda: s.serve(r, port, 30.0), lambda: c.connect(r, server, port, 30.0)
            )
            return got[1].value

        low = test("n2", "n0", "mlx5_4", 1)
        fine = [
            test("n0", "n1", "mlx5_4", 2),
            test("n1", "n2", "mlx5_4", 3),
            test("n0", "n2", "mlx5_3", 4),
        ]
        assert low is not None
        assert low < 150
        assert all(v is not None and v > 380 for v in fine)

    def test_a_server_without_a_client_could_not_run(self, tmp_path: Path):
        """A server nobody connects to answers an error once the wait is up, never a figure."""
        fabric = _fabric(tmp_path, meet_wait_s=0.05)
        server = fabric.runners("n0").ib
        assert server is not None
        got = server.serve(Rail("mlx5_0", 1), 18515, 30.0)
        assert got.value is None
        assert "only n0 came" in got.error
        client = fabric.runners("n1").ib
        assert client is not None
        nowhere = client.connect(Rail("mlx5_0", 1), "10.9.9.9", 18515, 30.0)
        assert nowhere.value is None
        assert "cannot reach 10.9.9.9" in nowhere.error

    def test_down_port_is_an_error_on_both_ends(self, tmp_path: Path):
        """A port that is not ACTIVE cannot be tested; both ends say which and why."""
        fabric = _fabric(tmp_path)
        fabric.nodes["n1"].ib_port_down(0)
        s, c = fabric.runners("n0").ib, fabric.runners("n1").ib
        assert s is not None
        assert c is not None
        rail = Rail("mlx5_0", 1)
        got = _together(lambda: s.serve(rail, 1, 30.0), lambda: c.connect(rail, "n0", 1, 30.0))
        assert [m.value for m in got] == [None, None]
        assert all("mlx5_0/1 of n1 is DOWN" in m.error for m in got)

    def test_multi_node_all_reduce_meets_and_a_half_rate_port_halves_it(self, tmp_path: Path):
        """Every member answers the same bus bandwidth; a port at 200 Gb/s halves it."""
        fabric = _fabric(tmp_path)
        names = tuple(fabric.nodes)
        coll = [fabric.runners(n).collective for n in names]

        def run(tag: str) -> list[Measurement]:
            calls = []
            for rank, c in enumerate(coll):
                assert c is not None
                calls.append(lambda c=c, rank=rank: c.all_reduce(_group(names, rank, tag)))
            return _together(*calls)

        healthy = run("a")
        assert {(m.check, m.component) for m in healthy} == {(Check.ALLREDUCE_MULTI, "nodes:3")}
        assert len({m.value for m in healthy}) == 1
        fabric.nodes["n2"].ib_rate(5, 200)
        half = run("b")
        assert half[0].value is not None
        assert healthy[0].value is not None
        assert half[0].value == pytest.approx(healthy[0].value / 2, rel=0.03)

    def test_a_member_that_never_comes(self, tmp_path: Path):
        """The members that came answer could-not-run, naming who came."""
        fabric = _fabric(tmp_path, meet_wait_s=0.05)
        c = fabric.runners("n0").collective
        assert c is not None
        got = c.all_reduce(_group(("n0", "n1"), 0))
        assert got.value is None
        assert got.error == "only n0 came in time"

    def test_ladder_rung_throughput_and_utilisation(self, tmp_path: Path):
        """A slow GPU lowers the rung's throughput; the others' utilisation falls below 70%.

        Each GPU shows its busy share while the rung holds it (util_hold_s), idle after.
        """
        fabric = _fabric(tmp_path)
        fabric.util_hold_s = 0.3
        names = tuple(fabric.nodes)
        ladders: list[LadderStep] = [fabric.runners(n).ladder for n in names]

        def rung(tag: str) -> tuple[list[Measurement], dict[tuple[str, int], int]]:
            seen: dict[tuple[str, int], int] = {}
            stop = threading.Event()

            def watch() -> None:  # what NVML would answer, read while the rung runs
                while not stop.wait(0.005):
                    for n in fabric.nodes.values():
                        for g in n.gpus:
                            if g.util_gpu:
                                seen[n.name, g.index] = g.util_gpu

            watcher = threading.Thread(target=watch)
            watcher.start()
            got = _rung(names, ladders, tag)
            stop.set()
            watcher.join()
            return got, seen

        healthy, busy = rung("h")
        assert {(m.check, m.component) for m in healthy} == {(Check.LADDER_THROUGHPUT, "nodes:3")}
        assert len(busy) == 24
        assert min(busy.values()) > 85
        assert all(g.util_gpu == 0 for n in fabric.nodes.values() for g in n.gpus)
        fabric.nodes["n1"].slow(3, 1.5)
        slow, busy = rung("s")
        assert slow[0].value is not None
        assert healthy[0].value is not None
        assert slow[0].value < healthy[0].value * 0.72
        assert busy.pop(("n1", 3)) > 90
        assert max(busy.values()) < 70
        spent = [s for s in fabric.ledger if s.what == "ladder_rung"]
        assert len(spent) == 6
        assert {s.seconds for s in spent} == {TOOL_SECONDS["ladder_rung"]}


def test_runners_answer_quickly_in_real_time(tmp_path: Path):
    """A whole node's standard checks take milliseconds, not the minutes they model."""
    fabric = _fabric(tmp_path, 1)
    runners = fabric.runners("n0")
    done = threading.Event()

    def work() -> None:
        assert runners.pair is not None
        assert runners.host is not None
        runners.pair.measure(range(8), 600.0)
        runners.host.measure(range(8), 600.0)
        done.set()

    threading.Thread(target=work, daemon=True).start()
    assert done.wait(10.0)
    assert sum(s.seconds for s in fabric.ledger) > 100


def test_pairs_behind_one_address_find_their_planned_server(tmp_path: Path):
    """Every agent of one process is 127.0.0.1 to the collector: the planned pairs tell them apart.

    Two pairs test the same rail on the same TCP port at once; n3 is planned as a client of
    both n2 (this round) and n0 (another round), and finds the one that is serving.
    """
    fabric = _fabric(tmp_path, 4)
    fabric.expect_pairs([("n0", "n1"), ("n2", "n3"), ("n1", "n2"), ("n0", "n3")])
    fabric.nodes["n3"].bad_cable("n2", 0, 0.5)
    ib = {n: fabric.runners(n).ib for n in fabric.nodes}
    rail = Rail("mlx5_0", 1)
    got = _together(
        lambda: ib["n0"].serve(rail, 18515, 30.0),
        lambda: ib["n2"].serve(rail, 18515, 30.0),
        lambda: ib["n1"].connect(rail, "127.0.0.1", 18515, 30.0),
        lambda: ib["n3"].connect(rail, "127.0.0.1", 18515, 30.0),
    )
    by_component = {(m.component, m.value) for m in got}
    assert {c for c, _ in by_component} == {"rail:mlx5_0/1:n0-n1", "rail:mlx5_0/1:n2-n3"}
    values = dict(by_component)
    assert values["rail:mlx5_0/1:n2-n3"] is not None
    assert values["rail:mlx5_0/1:n0-n1"] is not None
    assert values["rail:mlx5_0/1:n2-n3"] < values["rail:mlx5_0/1:n0-n1"] * 0.6
    # the next round: n3 is n0's client now, on the same port
    again = _together(
        lambda: ib["n0"].serve(rail, 18515, 30.0),
        lambda: ib["n3"].connect(rail, "127.0.0.1", 18515, 30.0),
    )
    assert {m.component for m in again} == {"rail:mlx5_0/1:n0-n3"}
    assert all(m.value is not None and m.value > 380 for m in again)


@pytest.mark.parametrize("first", ["server", "client"])
def test_either_end_may_come_first(first: str, tmp_path: Path):
    """The figure is the client's measurement whichever end reaches the test last."""
    fabric = _fabric(tmp_path, 2)
    s, c = fabric.runners("n0").ib, fabric.runners("n1").ib
    rail = Rail("mlx5_6", 1)
    box: list[Measurement] = []
    early = threading.Thread(
        target=lambda: box.append(
            s.serve(rail, 7, 30.0) if first == "server" else c.connect(rail, "n0", 7, 30.0)
        )
    )
    early.start()
    while fabric.waiting([("ib", "n0", "mlx5_6", 1, 7)], 0.0) != 0:
        time.sleep(0.001)
    late = c.connect(rail, "n0", 7, 30.0) if first == "server" else s.serve(rail, 7, 30.0)
    early.join()
    assert late.value == box[0].value
    assert late.value is not None
    assert late.value > 380


def test_a_cluster_node_joins_the_fabric_with_every_runner(tmp_path: Path):
    """What SimCluster calls per node: the node joins, and every runner interface is filled."""
    fabric = SimFabric({}, seed=1)
    node = SimNode("gpu-a", tmp_path / "a", FakeClock())
    got = fabric.runners_for("gpu-a", node)
    assert fabric.nodes == {"gpu-a": node}
    assert None not in (got.pair, got.host, got.collective, got.ib, got.ladder)
    assert got.host is not None
    assert len(got.host.measure([0], 10.0)) == 2
