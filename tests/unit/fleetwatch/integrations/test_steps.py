"""Steps are timed by GPU events read once the GPU passed them, never by waiting on it in a step,
and reported to a real agent job socket; nothing reaches the training loop when that fails."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from fleetwatch import jobclient
from fleetwatch.integrations.steps import (
    StepReporter,
    StepTimer,
    TimedStep,
    batch_tokens,
    rank_and_world,
)
from fleetwatch.testing import wait_until
from tests.job_node import open_job_socket

ROOT = Path(__file__).resolve().parents[4]
ENV = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "RANK")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    jobclient._unsent[0] = 0
    for name in (*ENV, "WORLD_SIZE", "FLEETWATCH_JOB_SOCKET"):
        monkeypatch.delenv(name, raising=False)


class FakeGpu:
    """A GPU stream the test moves on by hand: events pass when it has run up to them."""

    def __init__(self) -> None:
        self.queued = 0.0  # ms of work queued so far (the test adds it)
        self.done = 0.0  # ms the GPU has run
        self.waits = 0  # synchronize() calls

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.at: float | None = None

    def record(self) -> None:
        self.at = self.gpu.queued

    def query(self) -> bool:
        assert self.at is not None
        return self.gpu.done >= self.at

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query(), "elapsed_time before the GPU passed the begin"
        assert end.query(), "elapsed_time before the GPU passed the end: CUDA would raise"
        assert end.at is not None
        assert self.at is not None
        return end.at - self.at

    def synchronize(self) -> None:
        assert self.at is not None
        self.gpu.waits += 1
        self.gpu.done = max(self.gpu.done, self.at)


def gpu_step(timer: StepTimer, gpu: FakeGpu, step: int, compute_ms: float, rest_ms: float):
    timer.begin()
    gpu.queued += compute_ms
    timer.compute_done()
    gpu.queued += rest_ms
    timer.end(step, tokens=64)


class TestStepTimer:
    def test_a_step_is_read_once_the_gpu_passed_it_without_waiting(self):
        """The host queues step 2 while the GPU still runs step 1: step 1 is not ready, and
        nothing waits; once the GPU finished it, its GPU times (not the host's) come out."""
        gpu = FakeGpu()
        timer = StepTimer(event=gpu.event, clock=lambda: 0.0)
        gpu_step(timer, gpu, 1, compute_ms=300, rest_ms=100)
        gpu_step(timer, gpu, 2, compute_ms=300, rest_ms=100)
        assert timer.ready(keep=1) == []
        gpu.done = 400  # step 1 done, step 2 running
        assert timer.ready(keep=1) == [TimedStep(1, 64, 0.4, 0.3)]
        assert (timer.held, gpu.waits) == (1, 0)

    def test_flush_waits_once_for_the_steps_held(self):
        gpu = FakeGpu()
        timer = StepTimer(event=gpu.event, clock=lambda: 0.0)
        for step in (1, 2):
            gpu_step(timer, gpu, step, compute_ms=30, rest_ms=20)
        assert timer.flush() == [TimedStep(1, 64, 0.05, 0.03), TimedStep(2, 64, 0.05, 0.03)]
        assert gpu.done == 100
        assert timer.held == 0

    def test_a_host_far_ahead_is_told_by_its_own_clock(self):
        """Past ``max_held`` steps the GPU has not reached, the oldest is timed by the host's
        clock, without a compute time, rather than waited for."""
        gpu = FakeGpu()
        ticks = iter(range(100))
        timer = StepTimer(event=gpu.event, clock=lambda: float(next(ticks)), max_held=2)
        for step in (1, 2, 3):
            gpu_step(timer, gpu, step, compute_ms=10, rest_ms=10)
        assert timer.ready() == [TimedStep(1, 64, 2.0, None)]
        assert (timer.held, gpu.waits) == (2, 0)

    def test_on_the_cpu_the_host_clock_times_both_spans(self):
        ticks = iter([10.0, 10.5, 10.75])
        timer = StepTimer(cuda=False, clock=lambda: next(ticks))
        timer.begin()
        timer.compute_done()
        timer.end(7, tokens=32)
        assert not timer.on_gpu
        assert timer.ready() == [TimedStep(7, 32, 0.75, 0.5)]

    def test_no_compute_mark_means_no_compute_time(self):
        gpu = FakeGpu()
        timer = StepTimer(event=gpu.event)
        timer.begin()
        gpu.queued += 5
        timer.end(1)
        gpu.done = 5
        assert timer.ready() == [TimedStep(1, 0.0, 0.005, None)]

    def test_an_end_without_a_begin_is_no_step(self):
        timer = StepTimer(cuda=False)
        assert not timer.end(1)
        assert timer.held == 0

    def test_max_held_must_be_positive(self):
        with pytest.raises(ValueError, match="max_held must be at least 1"):
            StepTimer(cuda=False, max_held=0)

    def test_cuda_is_not_used_where_this_process_has_not_started_it(self):
        """Auto-detection asks torch whether CUDA is initialised; a CPU job never makes events."""
        assert not StepTimer().on_gpu


class TestRankAndTokens:
    def test_rank_and_world_come_from_the_environment_without_torch_distributed(self, monkeypatch):
        monkeypatch.setenv("RANK", "5")
        monkeypatch.setenv("WORLD_SIZE", "16")
        monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
        assert rank_and_world() == (5, 16)

    def test_without_either_it_is_rank_0_of_1(self, monkeypatch):
        monkeypatch.setenv("RANK", "not-a-number")
        assert rank_and_world() == (0, 1)

    def test_tokens_are_the_input_ids_element_count(self):
        class Ids:
            def numel(self) -> int:
                return 96

        class Encoding:
            input_ids = Ids()

        assert batch_tokens({"input_ids": Ids(), "labels": Ids()}) == 96
        assert batch_tokens(Encoding()) == 96
        assert batch_tokens((Ids(), Ids())) == 0
        assert batch_tokens({"input_ids": None}) == 0


async def test_each_step_reaches_a_real_agent_socket_one_step_later():
    """A step leaves when the next one ends and the GPU has passed it, with the rank and world
    size from the environment; close waits for the last one, the only wait."""
    gpu = FakeGpu()
    async with open_job_socket() as (path, queue):
        reporter = StepReporter("steps-test", params=1e6, socket_path=str(path))
        reporter.timer = StepTimer(event=gpu.event)
        for step in (1, 2, 3):
            reporter.begin()
            gpu.queued += 80
            reporter.compute_done()
            gpu.queued += 20
            gpu.done = gpu.queued - 50  # the GPU runs half a step behind the host
            reporter.end(step, 64)
            assert reporter.sent == step - 1
        reporter.close()
        await wait_until(lambda: queue.received == 3, 10, "three reports")
        steps = queue.take()
    assert [s.step for s in steps] == [1, 2, 3]
    assert {(s.job_id, s.rank, s.world_size, s.params) for s in steps} == {
        ("steps-test", 0, 1, 1e6)
    }
    assert [(s.tokens, round(s.step_time_s, 6), round(s.compute_time_s, 6)) for s in steps] == [
        (64.0, 0.1, 0.08)
    ] * 3
    assert (reporter.sent, reporter.lost, reporter.errors, gpu.waits) == (3, 0, 0, 1)


async def test_the_environment_s_rank_and_world_size_are_reported(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    async with open_job_socket() as (path, queue):
        reporter = StepReporter("env-test", cuda=False, socket_path=str(path))
        reporter.begin()
        reporter.end(1, 16)
        reporter.close()
        await wait_until(lambda: queue.received == 1, 10, "the report")
        [step] = queue.take()
    assert (step.rank, step.world_size, step.tokens) == (3, 8, 16.0)
    assert 0 <= step.compute_time_s <= step.step_time_s  # no compute mark: measured begin to end


async def test_a_checkpoint_sends_the_steps_held_marked_and_its_time_follows():
    async with open_job_socket() as (path, queue):
        reporter = StepReporter("ckpt-test", cuda=False, socket_path=str(path))
        for step in (1, 2, 3):
            reporter.begin()
            reporter.compute_done()
            reporter.end(step, 8, checkpointing=step == 2)
            if step == 2:
                reporter.checkpoint_done()
        reporter.close()
        await wait_until(lambda: queue.received == 3, 10, "three reports")
        steps = queue.take()
    assert [(s.step, s.checkpointing) for s in steps] == [(1, False), (2, True), (3, False)]
    start, end = steps[2].checkpoint_start_unix_ms, steps[2].checkpoint_end_unix_ms
    assert 0 < start <= end
    assert steps[1].checkpoint_start_unix_ms == 0


def test_a_missing_socket_is_counted_and_logged_once(tmp_path, caplog):
    reporter = StepReporter("gone", cuda=False, socket_path=str(tmp_path / "no-agent.sock"))
    with caplog.at_level(logging.WARNING, logger="fleetwatch.integrations"):
        for step in range(1, 6):
            reporter.begin()
            reporter.end(step, 1)
        reporter.close()
    assert (reporter.sent, reporter.lost, reporter.errors) == (0, 5, 0)
    [record] = caplog.records
    assert "did not reach the agent" in record.getMessage()
    assert "no socket there" in record.getMessage()


def test_our_own_failure_never_reaches_the_loop(caplog):
    """An event that raises (a broken CUDA context, say) is counted and logged once."""

    def broken() -> FakeEvent:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    reporter = StepReporter("broken", cuda=False)
    reporter.timer = StepTimer(event=broken)
    with caplog.at_level(logging.WARNING, logger="fleetwatch.integrations"):
        for step in range(1, 4):
            reporter.begin()
            reporter.compute_done()
            reporter.end(step, 1)
        reporter.close()
    assert (reporter.errors, reporter.sent) == (3, 0)  # each begin failed; no step to end
    assert len(caplog.records) == 1
    assert "step reporting failed" in caplog.records[0].getMessage()


def test_the_daemons_import_no_framework_and_the_timer_no_torch():
    """Only a training process imports the integrations: the agent, collector and command load
    none of them, nor transformers or Lightning; steps.py loads no torch."""
    code = (
        "import sys, agent.main, collector.main, cli.main\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('transformers', 'pytorch_lightning', 'lightning') or m.startswith('fleetwatch.integ')]\n"
        "assert not bad, bad\n"
        "import fleetwatch.integrations.steps\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_a_timer_on_a_loop_that_never_reports_costs_no_wait():
    """Reading ready steps is a query, never a wait, however many steps are held."""
    gpu = FakeGpu()
    timer = StepTimer(event=gpu.event, max_held=64)
    for step in range(1, 33):
        gpu_step(timer, gpu, step, compute_ms=1, rest_ms=1)
        timer.ready(keep=1)
    assert (timer.held, gpu.waits) == (32, 0)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_distributed_wins_over_the_environment(monkeypatch):
    """Once a process group is initialised, its rank and size are the ones reported."""
    dist = importlib.import_module("torch.distributed")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "16")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert rank_and_world() == (0, 1)
    finally:
        dist.destroy_process_group()
    assert rank_and_world() == (5, 16)
