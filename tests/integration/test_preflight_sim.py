"""Pre-flight against the simulator's model: planted problems are named, healthy nodes pass.

Real agents on simulated nodes, real gRPC, SQLite and webhooks on loopback; the measured checks
run on the simulator's runners (agent/sim/preflight.py), which read the bandwidth model of the
simulated hardware, so what is found is what the planted faults did to the hardware's figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from agent.sim.cluster import SimCluster
from agent.sim.preflight import SimFabric
from agent.sim.scenario import Fault, FaultKind, apply_fault
from collector.main import CollectorService
from collector.preflight.plan import PlanTimes
from fleetwatch.clock import SystemClock
from fleetwatch.demo.preflight import UTIL_HOLD_S, address_by_name
from fleetwatch.preflight.vocabulary import Level
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import actions, kinds

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from collector.config import CollectorConfig
    from fleetwatch.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.integration

NODES = [f"gpu-0{i}" for i in range(1, 7)]
# On a ring of six, gpu-05 and gpu-06 are neighbours: the plan pairs them, and each has one
# other partner (gpu-04, gpu-01) to test fine with.
PLANTED = [
    Fault(0.0, "gpu-02", FaultKind.P2P_LOW, {"gpu": 1, "peer": 5, "factor": 0.5}),
    Fault(0.0, "gpu-03", FaultKind.DRIVER_VERSION, {"version": "535.183.01"}),
    Fault(0.0, "gpu-04", FaultKind.IB_RATE_LOW, {"port": 2, "rate": 200}),
    Fault(0.0, "gpu-05", FaultKind.BAD_CABLE, {"peer": "gpu-06", "port": 6, "factor": 0.4}),
]


async def test_planted_problems_are_named_and_only_their_nodes_fail(
    collector_config: Callable[..., CollectorConfig],
    receiver: WebhookReceiver,
    tmp_path: Path,
) -> None:
    """A slow GPU pair, another driver, an IB port at half rate, a bad cable: each is named
    (pair, node, port, cable), the three nodes with a fault of their own fail, the cable's ends
    and the healthy node do not."""
    config = collector_config(actions=actions(receiver, tmp_path), rules_interval=0.1)
    service = CollectorService(config, SystemClock())
    service.preflight.times = PlanTimes(quick_s=20, node_bandwidth_s=20, ib_s=20, ladder_s=20)
    await service.start()
    fabric = SimFabric({}, seed=7, util_hold_s=UTIL_HOLD_S)
    cluster = SimCluster(
        NODES,
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.2,
        heartbeat_interval=0.5,
        preflight=fabric.runners_for,
    )
    for fault in PLANTED:
        apply_fault(fault, cluster.nodes[fault.node])
    cluster.start()
    try:
        await wait_until(
            lambda: sum(n.connected for n in service.fleet.snapshot().values()) == len(NODES),
            what="agents connected",
        )
        plan = service.preflight.plan(Level.FULL, "gpu-[01-06]")
        address_by_name(plan)  # every agent here is 127.0.0.1 to the collector
        run = await service.preflight.execute(plan)
        results = service.preflight.latest_results
    finally:
        await cluster.stop()
        await service.stop(grace=0)
    suspects: list[dict[str, Any]] = run.suspects or []
    named = {(s["kind"], s["node"], s["component"]) for s in suspects}
    assert ("gpu_pair", "gpu-02", "gpu:1-gpu:5") in named
    assert ("ib_port", "gpu-04", "ib:mlx5_2/1") in named
    cables = [s for s in suspects if s["kind"] == "cable"]
    assert [(s["component"], s["nodes"]) for s in cables] == [
        ("rail:mlx5_6/1:gpu-05-gpu-06", ["gpu-05", "gpu-06"])
    ]
    odd = [r for r in results if r.check == "driver_version" and r.verdict == "fail"]
    assert [r.node for r in odd] == ["gpu-03"]
    verdicts = run.node_verdicts or {}
    assert {n for n, v in verdicts.items() if v == "fail"} == {"gpu-02", "gpu-03", "gpu-04"}
    assert {verdicts[n] for n in ("gpu-01", "gpu-05", "gpu-06")} <= {"pass", "warn"}
    # every measured check ran: nothing could not run on the simulator
    assert [r for r in results if r.verdict == "could_not_run"] == []
    # the figures are the model's: a healthy pair near 380 GB/s, the planted pair at half
    p2p = {(r.node, r.component): r.value for r in results if r.check == "p2p_bw"}
    assert p2p["gpu-02", "gpu:1-gpu:5"] is not None
    assert p2p["gpu-01", "gpu:1-gpu:5"] is not None
    assert p2p["gpu-02", "gpu:1-gpu:5"] < 0.6 * p2p["gpu-01", "gpu:1-gpu:5"]


async def test_a_slow_gpu_is_named_by_the_one_node_rung_and_only_its_node_fails(
    collector_config: Callable[..., CollectorConfig],
    receiver: WebhookReceiver,
    tmp_path: Path,
) -> None:
    """GPU 6 of gpu-05 computes 1.5 times slower, which no counter shows and no all-reduce
    feels. Every node runs the one-node ladder rung at once; gpu-05's throughput is far below
    the fleet's, so gpu-05 fails and is held out, and GPU 6 (busy while its peers waited) is
    named. gpu-05 is outside the first four nodes: the ladder's larger rungs alone never
    named it. No healthy node fails."""
    config = collector_config(actions=actions(receiver, tmp_path), rules_interval=0.1)
    service = CollectorService(config, SystemClock())
    service.preflight.times = PlanTimes(quick_s=20, node_bandwidth_s=20, ib_s=20, ladder_s=20)
    await service.start()
    fabric = SimFabric({}, seed=11, util_hold_s=UTIL_HOLD_S)
    cluster = SimCluster(
        NODES,
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.2,
        heartbeat_interval=0.5,
        preflight=fabric.runners_for,
    )
    apply_fault(
        Fault(0.0, "gpu-05", FaultKind.SLOW_GPU, {"gpu": 6, "factor": 1.5}),
        cluster.nodes["gpu-05"],
    )
    cluster.start()
    try:
        await wait_until(
            lambda: sum(n.connected for n in service.fleet.snapshot().values()) == len(NODES),
            what="agents connected",
        )
        plan = service.preflight.plan(Level.FULL, "gpu-[01-06]")
        address_by_name(plan)
        run = await service.preflight.execute(plan)
        results = service.preflight.latest_results
        await wait_until(
            lambda: ("drain_request", "gpu-05") in kinds(receiver),
            timeout=60.0,  # a loaded shared host delivers slowly; the condition is what counts
            what="gpu-05 drained",
        )
        drained = {node for kind, node in kinds(receiver) if kind == "drain_request"}
    finally:
        await cluster.stop()
        await service.stop(grace=0)
    suspects: list[dict[str, Any]] = run.suspects or []
    assert ("gpu", "gpu-05", "gpu:6") in {(s["kind"], s["node"], s["component"]) for s in suspects}
    verdicts = run.node_verdicts or {}
    assert {n for n, v in verdicts.items() if v == "fail"} == {"gpu-05"}
    assert drained == {"gpu-05"}
    one_node = {
        r.node: r for r in results if r.check == "ladder_throughput" and r.component == "nodes:1"
    }
    assert set(one_node) == set(NODES)  # every node ran the one-node rung
    assert one_node["gpu-05"].verdict == "fail"
    assert {one_node[n].verdict for n in NODES if n != "gpu-05"} == {"pass"}
