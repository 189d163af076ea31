"""What a node may answer: what its plan asked of it, each (check, component) once."""

from __future__ import annotations

from collector.preflight.answers import screen_answer
from collector.preflight.plan import NodeFacts
from fleetwatch.preflight.vocabulary import Check, Measurement
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

FACTS = NodeFacts("gpu-01", "10.0.0.1", gpus=2, rails=(("mlx5_0", 1),))


def m(check: Check, component: str, value: float | None = 1.0, error: str = "") -> Measurement:
    return Measurement(check, component, value, "", error=error)


def screened(task: pb.PreflightTask, *ms: Measurement) -> tuple[list[str], list[str]]:
    out = screen_answer("gpu-01", task, FACTS, ms)
    return (
        [f"{k.check}:{k.component}" for k in out.kept],
        [why.split(":", 1)[0] for _, why in out.refused],
    )


def test_only_the_nodes_own_gpus_ports_and_nics():
    task = pb.PreflightTask(checks=["ecc_mode", "ib_port", "nic_firmware", "gpu_count"])
    kept, refused = screened(
        task,
        m(Check.ECC_MODE, "gpu:1"),
        m(Check.ECC_MODE, "gpu:2"),  # it has two GPUs
        m(Check.IB_PORT, "ib:mlx5_0/1"),
        m(Check.IB_PORT, "ib:mlx5_9/1"),
        m(Check.NIC_FIRMWARE, "nic:mlx5_0"),
        m(Check.GPU_COUNT, "node"),
        m(Check.GPU_COUNT, "node"),  # once
        m(Check.P2P_BW, "gpu:0-gpu:1"),  # not asked
    )
    assert kept == ["ecc_mode:gpu:1", "ib_port:ib:mlx5_0/1", "nic_firmware:nic:mlx5_0",
                    "gpu_count:node"]  # fmt: skip
    assert refused == ["not_planned", "not_planned", "duplicate", "not_asked"]


def test_rails_are_the_plans_not_the_reporters():
    test = pb.PreflightIbTest(device="mlx5_0", port=1, server=True, peer="gpu-02")
    task = pb.PreflightTask(checks=["ib_write_bw"], ib_tests=[test])
    kept, refused = screened(
        task,
        m(Check.IB_WRITE_BW, "rail:mlx5_0/1:gpu-01-gpu-02"),
        m(Check.IB_WRITE_BW, "rail:mlx5_0/1:gpu-02-gpu-01"),  # it served; it was not the client
        m(Check.IB_WRITE_BW, "rail:mlx5_0/1:gpu-02-gpu-03"),  # two other nodes
    )
    assert kept == ["ib_write_bw:rail:mlx5_0/1:gpu-01-gpu-02"]
    assert refused == ["not_planned", "not_planned"]


def test_groups_and_a_check_that_could_not_run():
    group = pb.PreflightGroup(check="ladder_throughput", nodes=["gpu-01", "gpu-02"])
    task = pb.PreflightTask(checks=["ladder_throughput", "p2p_bw"], groups=[group])
    kept, refused = screened(
        task,
        m(Check.LADDER_THROUGHPUT, "nodes:2"),
        m(Check.LADDER_THROUGHPUT, "nodes:4"),  # no such rung for it
        m(Check.GPU_UTILISATION, "nodes:2"),
        m(Check.P2P_BW, "node", None, "no p2p runner"),  # said on the node: kept
        m(Check.LADDER_EFFICIENCY, "nodes:2"),  # the collector works that out itself
    )
    assert kept == ["ladder_throughput:nodes:2", "gpu_utilisation:nodes:2", "p2p_bw:node"]
    assert refused == ["not_planned", "not_asked"]
