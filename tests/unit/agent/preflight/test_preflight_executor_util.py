"""The executor's GPU utilisation while a ladder rung runs: per GPU, and a final reading."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.preflight import executor as executor_module
from agent.preflight.executor import PreflightExecutor
from agent.preflight.runners import Group, PreflightRunners
from fleetwatch.preflight.vocabulary import Check, Measurement
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    import pytest


@dataclass(frozen=True)
class Gpu:
    index: int


@dataclass
class Inventory:
    gpus: list[Gpu]


@dataclass
class Sampler:
    inventory: Inventory

    async def compute_processes(self, gpu: Gpu) -> list[int]:  # noqa: ARG002 - idle GPUs
        return []


@dataclass
class Reading:
    gpu_util_pct: int | None


@dataclass
class Nvml:
    """GPU 2 busy at every step, the others waiting for it."""

    busy: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(4), 60) | {2: 100})

    def read(self, gpu: Gpu) -> Reading:
        return Reading(self.busy[gpu.index])


class QuickRung:
    """A rung far shorter than the sampling period: done before the first periodic read."""

    def run(self, group: Group, steps: int) -> Measurement:  # noqa: ARG002 - one figure
        return Measurement(Check.LADDER_THROUGHPUT, "nodes:1", 1000.0, "samples/s")


def task() -> pb.PreflightTask:
    t = pb.PreflightTask(
        run_id="pf-1",
        task_id="pf-1.n1.ladder1",
        level="full",
        checks=["ladder_throughput", "gpu_utilisation"],
        timeout_s=30.0,
    )
    t.groups.append(
        pb.PreflightGroup(
            check="ladder_throughput",
            nodes=["n1"],
            node_rank=0,
            gpus_per_node=4,
            master_addr="127.0.0.1",
            master_port=29503,
            size_bytes=1 << 20,
            steps=5,
        ),
    )
    return t


def test_a_rung_shorter_than_the_sampling_period_still_has_a_utilisation_per_gpu(
    monkeypatch: pytest.MonkeyPatch,
):
    """With the period far longer than the rung, no periodic read happens: the reading taken
    when the rung stops gives the figure (without it: could not run), and each GPU's share is
    in the evidence, where localisation finds the GPU the others waited for."""
    monkeypatch.setattr(executor_module, "UTIL_EVERY_S", 30.0)
    gpus = [Gpu(i) for i in range(4)]
    executor = PreflightExecutor(
        node="n1",
        sampler=Sampler(Inventory(gpus)),  # type: ignore[arg-type]
        nvml=Nvml(),  # type: ignore[arg-type]
        quick=None,  # type: ignore[arg-type]
        runners=PreflightRunners(ladder=QuickRung()),
    )
    result = asyncio.run(executor.run(task()))
    by_check = {m.check: m for m in result.measurements}
    util = by_check["gpu_utilisation"]
    assert not util.error
    assert util.value == 70.0  # (100 + 3 x 60) / 4
    assert "per GPU: gpu:0 60%, gpu:1 60%, gpu:2 100%, gpu:3 60%" in util.evidence
    assert by_check["ladder_throughput"].value == 1000.0


@dataclass
class ScriptedNvml:
    """Each read of GPU 0 starts a new row of the script: idle, busy twice (one dip), idle (the
    last row is the final reading when the rung stops)."""

    script: list[int] = field(default_factory=lambda: [0, 0, 90, 30, 90, 0, 0])
    calls: int = 0

    def read(self, gpu: Gpu) -> Reading:
        row = self.calls // 2
        self.calls += 1
        return Reading(self.script[row] if gpu.index == 0 else self.script[row] // 3)


def test_idle_reads_before_and_after_the_rung_are_left_out_and_dips_inside_count():
    """The first read may come before the rung's GPUs are busy and the last after they went
    idle (a short rung on a loaded host): those are its start-up and tear-down. A dip while it
    trains is its utilisation and counts."""
    sampler = executor_module._UtilSampler(
        ScriptedNvml(),  # type: ignore[arg-type]
        Sampler(Inventory([Gpu(0), Gpu(1)])),  # type: ignore[arg-type]
    )
    for _ in range(6):
        sampler._read()
    mean = sampler.stop()
    assert sampler.per_gpu() == {0: 70.0, 1: 23.3}  # (90 + 30 + 90) / 3, (30 + 10 + 30) / 3
    assert mean == 46.67
    assert "mean of 3 reads" in sampler.evidence()
    assert sampler.reads == 7  # six periodic, one final
    assert "4 idle at its start or end left out" in sampler.evidence()
