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
from tests.integration.fleet_harness import actions

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
