"""Pre-flight against the simulator's model: planted problems are named, healthy nodes pass.

Real agents on simulated nodes, real gRPC, SQLite and webhooks on loopback; the measured checks
run on the simulator's runners (agent/sim/preflight.py), which read the bandwidth model of the
simulated hardware, so what is found is what the planted faults did to the hardware's figures.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from agent.preflight import executor
from agent.sim.cluster import SimCluster
from agent.sim.preflight import MEET_WAIT_S, SimFabric
from agent.sim.scenario import Fault, FaultKind, apply_fault
from cli.demo.preflight import address_by_name
from collector.main import CollectorService
from collector.preflight.plan import PlanTimes
from fleetwatch.clock import SystemClock
from fleetwatch.preflight.vocabulary import Level
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import actions, kinds

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from agent.sim.devices import SimGpu
    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.config import CollectorConfig

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

# Rounds of the executor's utilisation reads that see a rung's GPUs busy before it ends.
BUSY_ROUNDS = 2


class ReadFabric(SimFabric):
    """The simulator's fabric, its ladder rungs held busy for the agents' utilisation reads.

    A simulated rung answers at once where a real one runs minutes. Held for a fixed time (the
    demo's UTIL_HOLD_S), a loaded machine's reader could miss it, or read its GPUs turn busy or
    idle halfway through a round of reads: the idle GPUs of that round lowered the mean, and a
    healthy node's gpu_utilisation (83-95 %) fell below the 70 % bar. Here each round of reads
    is taken whole, a rung's GPUs turn busy and idle only between two rounds, and stay busy
    until BUSY_ROUNDS rounds read them so.
    """

    def __init__(self, *, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__({}, seed=seed)
        self._rounds = threading.Condition()
        self._busy: Counter[str] = Counter()  # rounds that read each GPU (by uuid) busy
        fabric = self

        class WholeRounds(executor._UtilSampler):
            def _read(self) -> None:
                with fabric._rounds:
                    super()._read()
                    with self._lock:
                        last = self._reads[-1]
                    fabric._busy.update(g.uuid for g in self._gpus if last.get(g.index))
                    fabric._rounds.notify_all()

        monkeypatch.setattr(executor, "_UtilSampler", WholeRounds)

    def keep_busy(self, busy: Sequence[tuple[SimGpu, int]], *, hold: bool) -> None:
        with self._rounds:
            for gpu, percent in busy:
                gpu.util_gpu = percent
            wanted = {g.uuid: self._busy[g.uuid] + BUSY_ROUNDS for g, percent in busy if percent}
            if hold:
                self._rounds.wait_for(
                    lambda: all(self._busy[uuid] >= n for uuid, n in wanted.items()),
                    MEET_WAIT_S,  # never read: the rung's utilisation fails, and says so
                )
            for gpu, _ in busy:
                gpu.util_gpu = 0


async def test_planted_problems_are_named_and_only_their_nodes_fail(
    collector_config: Callable[..., CollectorConfig],
    receiver: WebhookReceiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow GPU pair, another driver, an IB port at half rate, a bad cable: each is named
    (pair, node, port, cable), the three nodes with a fault of their own fail, the cable's ends
    and the healthy node do not."""
    config = collector_config(actions=actions(receiver, tmp_path), rules_interval=0.1)
    service = CollectorService(config, SystemClock())
    service.preflight.times = PlanTimes(quick_s=20, node_bandwidth_s=20, ib_s=20, ladder_s=20)
    await service.start()
    fabric = ReadFabric(seed=7, monkeypatch=monkeypatch)
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
        # welcomed: the collector's end of each stream took the Hello, tasks may go out
        await wait_until(
            lambda: all(a.link.connected for a in cluster.agents.values()),
            what="agents welcomed",
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
    monkeypatch: pytest.MonkeyPatch,
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
    fabric = ReadFabric(seed=11, monkeypatch=monkeypatch)
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
        # welcomed: the collector's end of each stream took the Hello, tasks may go out
        await wait_until(
            lambda: all(a.link.connected for a in cluster.agents.values()),
            what="agents welcomed",
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
