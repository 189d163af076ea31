"""A real Lightning Trainer run on the CPU (tests/jobs/lightning_train.py: a tiny next-token
model) reports each optimizer step through the callback to a real agent job socket."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging

import pytest

from fleetwatch import jobclient
from fleetwatch.testing import wait_until
from tests.job_node import open_job_socket

# As the torch job's tests (tests/unit/collector/jobs/test_torch_job.py): skipped where `make
# unit` has not installed the library, and imported only by the tests that train (seconds).
pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("pytorch_lightning") is None,
        reason="pytorch-lightning is not installed (make unit does it)",
    ),
    # Lightning asks whether it runs under Slurm wherever `srun` is installed (this machine has
    # it, for the Slurm tests) and warns that it was not used.
    pytest.mark.filterwarnings("ignore:The `srun` command is available on your system:UserWarning"),
    # pytorch-lightning 2.6.6 flattens batches with torch's pytree the way torch 2.13 deprecates.
    pytest.mark.filterwarnings(
        r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"
    ),
]
STEPS = 4
ACCUMULATION = 2


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    jobclient._unsent[0] = 0
    for name in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "LOCAL_RANK", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def lightning():
    """The training job and the callback module (importing Lightning takes seconds)."""
    job = importlib.import_module("tests.jobs.lightning_train")
    return job, importlib.import_module("fleetwatch.integrations.lightning")


async def test_each_optimizer_step_is_reported(lightning, tmp_path):
    """Steps 1-4, each of two accumulated batches of 4 x 16 token ids (128 tokens), rank 0 of 1,
    the module's parameter count, and on the CPU the host's step and compute times."""
    job, integration = lightning
    async with open_job_socket() as (path, queue):
        callback = integration.FleetwatchCallback("pl-test", socket_path=str(path))
        module = await asyncio.to_thread(
            job.train, callback, tmp_path, steps=STEPS, accumulation=ACCUMULATION
        )
        await wait_until(lambda: queue.received == STEPS, 10, "a report per step")
        steps = queue.take()
    assert [s.step for s in steps] == list(range(1, STEPS + 1))
    assert {(s.job_id, s.rank, s.world_size) for s in steps} == {("pl-test", 0, 1)}
    assert {s.tokens for s in steps} == {float(job.BATCH * job.SEQUENCE * ACCUMULATION)}
    assert {s.params for s in steps} == {float(sum(p.numel() for p in module.parameters()))}
    assert all(0 < s.compute_time_s <= s.step_time_s < 10 for s in steps)
    assert not any(s.checkpointing or s.checkpoint_start_unix_ms for s in steps)
    assert (callback.reporter.sent, callback.reporter.lost, callback.reporter.errors) == (4, 0, 0)


async def test_a_given_token_count_and_a_checkpoint_are_reported(lightning, tmp_path):
    """``tokens_per_step`` replaces the count; the step a checkpoint follows is marked
    checkpointing, and the checkpoint's time comes with the next report."""
    job, integration = lightning
    async with open_job_socket() as (path, queue):
        callback = integration.FleetwatchCallback(
            "pl-save", tokens_per_step=1000, params=5e5, socket_path=str(path)
        )
        await asyncio.to_thread(job.train, callback, tmp_path, steps=3, save_steps=2)
        await wait_until(lambda: queue.received == 3, 10, "a report per step")
        steps = queue.take()
    assert [(s.step, s.checkpointing) for s in steps] == [(1, False), (2, True), (3, False)]
    assert {(s.tokens, s.params) for s in steps} == {(1000.0, 5e5)}
    assert 0 < steps[2].checkpoint_start_unix_ms <= steps[2].checkpoint_end_unix_ms
    assert list(tmp_path.glob("*step=2.ckpt"))


def test_training_goes_on_without_an_agent(lightning, tmp_path, caplog):
    """No socket: every report is counted lost, one line is logged, and all steps train."""
    job, integration = lightning
    callback = integration.FleetwatchCallback("pl-none", socket_path=str(tmp_path / "no.sock"))
    with caplog.at_level(logging.WARNING, logger="fleetwatch.integrations"):
        job.train(callback, tmp_path, steps=3)
    assert (callback.reporter.sent, callback.reporter.lost, callback.reporter.errors) == (0, 3, 0)
    assert [r.getMessage()[:40] for r in caplog.records if r.name.startswith("fleetwatch")] == [
        "fleetwatch: the report of step 1 did not"
    ]
