"""The simulated hardware's bandwidth model: each fault lowers what it should and nothing else."""

from __future__ import annotations

import itertools
import statistics
from typing import TYPE_CHECKING, Any

import pytest

from agent.sim.bandwidth import (
    ALLREDUCE_NODE_GBS,
    D2H_GBS,
    H2D_GBS,
    P2P_BIDIR_GBS,
    P2P_GBS,
    BandwidthModel,
    ModelError,
    Noise,
)
from agent.sim.hardware import SimNode
from agent.sim.scenario import Fault, FaultKind, apply_fault
from fleetwatch.testing import FakeClock

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

GPUS = range(8)


def _nodes(tmp_path: Path, count: int = 3) -> list[SimNode]:
    clock = FakeClock()
    return [SimNode(f"n{i}", tmp_path / f"n{i}", clock) for i in range(count)]


def _everything(model: BandwidthModel, nodes: list[SimNode]) -> dict[tuple[Any, ...], float]:
    """Every figure the model gives for the nodes, keyed by what it is."""
    out: dict[tuple[Any, ...], float] = {}
    for node in nodes:
        for i, j in itertools.permutations(GPUS, 2):
            out["p2p", node.name, i, j] = model.p2p(node, i, j)
        for i, j in itertools.combinations(GPUS, 2):
            out["p2p_bidir", node.name, i, j] = model.p2p_bidir(node, i, j)
        for g in GPUS:
            out["h2d", node.name, g] = model.h2d(node, g)
            out["d2h", node.name, g] = model.d2h(node, g)
        out["allreduce_node", node.name] = model.allreduce_node(node, GPUS)
        step = model.step([node], 8, "one")
        out["step", node.name] = step.samples_per_s
        for (name, g), util in step.utilisation.items():
            out["util1", name, g] = util
    for a, b in itertools.permutations(nodes, 2):
        for rail in range(8):
            out["ib", a.name, b.name, rail] = model.ib_write(a, b, rail)
    out["allreduce_multi",] = model.allreduce(nodes, 8, "all")
    step = model.step(nodes, 8, "all")
    out["step_all",] = step.samples_per_s
    for (name, g), util in step.utilisation.items():
        out["util", name, g] = util
    return out


def _clean() -> BandwidthModel:
    return BandwidthModel(Noise(sd=0.0))


class TestHealthy:
    def test_figures_of_a_healthy_h100_ndr_node(self, tmp_path: Path):
        """A healthy node measures what an 8xH100 SXM with ConnectX-7 NDR does."""
        a, b = _nodes(tmp_path, 2)
        model = _clean()
        assert model.p2p(a, 0, 7) == pytest.approx(P2P_GBS)
        assert 370 <= P2P_GBS <= 390
        assert 740 <= model.p2p_bidir(a, 3, 4) <= 780
        assert 50 <= model.h2d(a, 2) <= 55
        assert 50 <= model.d2h(a, 2) <= 55
        assert 470 <= model.allreduce_node(a, GPUS) <= 490
        assert 390 <= model.ib_write(a, b, 0) <= 400
        assert 340 <= model.allreduce([a, b], 8, "r") <= 400
        step = model.step([a, b], 8, "r")
        assert min(step.utilisation.values()) > 85

    def test_noise_is_small_seeded_and_spread(self, tmp_path: Path):
        """The same seed gives the same figures; the spread is a fraction of a percent."""
        (a,) = _nodes(tmp_path, 1)
        first = [BandwidthModel(Noise(seed=7)).p2p(a, 0, 1) for _ in range(3)]
        model = BandwidthModel(Noise(seed=7))
        series = [model.p2p(a, 0, 1) for _ in range(200)]
        assert first == [series[0]] * 3
        assert series[1] != series[0]
        assert statistics.mean(series) == pytest.approx(P2P_GBS, rel=0.003)
        assert 0.002 < statistics.stdev(series) / P2P_GBS < 0.012
        assert BandwidthModel(Noise(seed=8)).p2p(a, 0, 1) != series[0]


Key = tuple[Any, ...]
MULTI = {"allreduce_multi", "step_all", "util"}  # the figures of the three-node job


def _nvlink_of_gpu_2(k: Key) -> bool:
    """GPU 2's pairs on n1, n1's own all-reduce and step (IB still bounds the 3-node job)."""
    return (k[0] in {"p2p", "p2p_bidir"} and k[1] == "n1" and 2 in k[2:]) or k[:2] in {
        ("allreduce_node", "n1"),
        ("step", "n1"),
        ("util1", "n1"),
    }


def _pair_2_6(k: Key) -> bool:
    """The pair itself, n1's own figures, and (at half) even the 3-node job's all-reduce."""
    return (
        (k[0] in {"p2p", "p2p_bidir"} and k[1] == "n1" and set(k[2:]) == {2, 6})
        or k[:2] in {("allreduce_node", "n1"), ("step", "n1"), ("util1", "n1")}
        or k[0] in MULTI
    )


def _rail_3_of_n1(k: Key) -> bool:
    return (k[0] == "ib" and "n1" in k[1:3] and k[3] == 3) or k[0] in MULTI


def _cable_n1_n2(k: Key) -> bool:
    return (k[0] == "ib" and set(k[1:3]) == {"n1", "n2"} and k[3] == 3) or k[0] in MULTI


def _slow_gpu_1(k: Key) -> bool:
    """Both steps it is in; every GPU of them but the slow one waits longer (less busy)."""
    return (
        k[0] == "step_all"
        or k[:2] == ("step", "n1")
        or (k[0] == "util" and k[1:] != ("n1", 1))
        or (k[0] == "util1" and k[1] == "n1" and k[2] != 1)
    )


def _h2d_of_gpu_4(k: Key) -> bool:
    return k[0] in {"h2d", "d2h"} and k[1:] == ("n1", 4)


# Each fault on node n1 and the figures it must lower; every other figure must stay as it was.
FAULTS: dict[str, tuple[FaultKind, dict[str, Any], Callable[[Key], bool]]] = {
    "nvlink_down": (FaultKind.NVLINK_DOWN, {"gpu": 2, "link": 5}, _nvlink_of_gpu_2),
    "nvlink_errors": (
        FaultKind.NVLINK_ERRORS,
        {"gpu": 2, "link": 5, "replay": 40, "recovery": 2, "crc": 30},
        _nvlink_of_gpu_2,
    ),
    "p2p_low": (FaultKind.P2P_LOW, {"gpu": 2, "peer": 6, "factor": 0.5}, _pair_2_6),
    "pcie_downgrade": (FaultKind.PCIE_DOWNGRADE, {"gpu": 4, "gen": 4, "width": 8}, _h2d_of_gpu_4),
    "ib_symbol_errors": (FaultKind.IB_SYMBOL_ERRORS, {"port": 3, "count": 3000}, _rail_3_of_n1),
    "ib_congestion": (
        FaultKind.IB_CONGESTION,
        {"port": 3, "xmit_wait_per_s": 50_000.0},
        _rail_3_of_n1,
    ),
    "ib_rate_low": (FaultKind.IB_RATE_LOW, {"port": 3, "rate": 200}, _rail_3_of_n1),
    "bad_cable": (FaultKind.BAD_CABLE, {"peer": "n2", "port": 3, "factor": 0.4}, _cable_n1_n2),
    "slow_gpu": (FaultKind.SLOW_GPU, {"gpu": 1, "factor": 1.5}, _slow_gpu_1),
    "thermal": (FaultKind.THERMAL, {"gpu": 1, "temperature": 92}, _slow_gpu_1),
}


class TestEachFaultLowersWhatItShould:
    @pytest.mark.parametrize("name", sorted(FAULTS))
    def test_fault_lowers_its_figures_and_nothing_else(self, name: str, tmp_path: Path):
        """The figures the fault touches go down; every other figure is unchanged."""
        kind, params, touched = FAULTS[name]
        nodes = _nodes(tmp_path)
        before = _everything(_clean(), nodes)
        apply_fault(Fault(0.0, "n1", kind, params), nodes[1])
        after = _everything(_clean(), nodes)
        lowered = {k for k in before if after[k] < before[k] * 0.999}
        changed = {k for k in before if after[k] != pytest.approx(before[k], rel=1e-12)}
        expected = {k for k in before if touched(k)}
        assert lowered == expected
        # only the slow GPU's own share of the (longer) step grows
        raised = {("util", "n1", 1), ("util1", "n1", 1)} if touched is _slow_gpu_1 else set()
        assert changed == expected | raised

    def test_the_size_of_each_drop(self, tmp_path: Path):
        """The drops follow the fault: a link's share, the PCIe lanes, the rate, the factor."""
        n0, n1, n2 = _nodes(tmp_path)
        model = _clean()
        n1.nvlink_down(2, 5)
        assert model.p2p(n1, 2, 3) == pytest.approx(P2P_GBS * 17 / 18)
        n1.pcie_downgrade(4, gen=4, width=8)
        assert model.h2d(n1, 4) == pytest.approx(H2D_GBS / 4, rel=0.01)
        assert model.d2h(n1, 4) == pytest.approx(D2H_GBS / 4, rel=0.01)
        n1.ib_rate(3, 200)
        assert model.ib_write(n0, n1, 3) == pytest.approx(model.ib_write(n0, n2, 3) / 2)
        n0.bad_cable("n2", 5, 0.4)
        assert model.ib_write(n2, n0, 5) == pytest.approx(model.ib_write(n2, n1, 5) * 0.4)
        n0.p2p_low(1, 0, 0.5)
        assert model.p2p_bidir(n0, 0, 1) == pytest.approx(P2P_BIDIR_GBS / 2)
        assert model.allreduce_node(n0, GPUS) == pytest.approx(ALLREDUCE_NODE_GBS / 2)

    def test_a_half_rate_port_halves_the_multi_node_all_reduce(self, tmp_path: Path):
        """NCCL's channels carry equal shares, so the slowest rail bounds the collective."""
        nodes = _nodes(tmp_path)
        model = _clean()
        healthy = model.allreduce(nodes, 8, "r")
        nodes[1].ib_rate(6, 200)
        assert model.allreduce(nodes, 8, "r") == pytest.approx(healthy / 2)
        # a bad cable matters only where the two nodes are neighbours in the ring
        others = _nodes(tmp_path / "b", 4)
        ring = model.allreduce(others, 8, "r")
        others[0].bad_cable("n2", 1, 0.5)
        assert model.allreduce(others, 8, "r") == pytest.approx(ring)
        assert model.allreduce([others[0], others[2]], 8, "r") < ring * 0.6

    def test_slow_gpu_lowers_the_utilisation_of_the_job(self, tmp_path: Path):
        """A GPU 1.5 times slower makes every other GPU of the step wait (under 70% busy)."""
        nodes = _nodes(tmp_path)
        nodes[1].slow(1, 1.5)
        step = _clean().step(nodes, 8, "r")
        busy = step.utilisation
        assert busy["n1", 1] > 90
        assert max(v for k, v in busy.items() if k != ("n1", 1)) < 70

    def test_lost_gpu_and_down_port_cannot_be_measured(self, tmp_path: Path):
        """What a tool could not measure is an error naming the part, never a number."""
        a, b = _nodes(tmp_path, 2)
        model = _clean()
        a.pci_remove(3)
        with pytest.raises(ModelError, match="GPU 3 of n0 is lost"):
            model.p2p(a, 3, 4)
        with pytest.raises(ModelError, match="GPU 3 of n0 is lost"):
            model.step([a, b], 8, "r")
        b.ib_port_down(2)
        with pytest.raises(ModelError, match="mlx5_2/1 of n1 is DOWN"):
            model.ib_write(a, b, 2)
        assert model.ib_write(a, b, 1) > 0
