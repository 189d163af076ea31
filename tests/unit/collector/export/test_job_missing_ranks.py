"""Jobs that lose ranks, and evidence with thresholds (issue 20, section 5)."""

import pytest

from collector.export.jobs import JobsCollector
from collector.testing import (
    SLOW_RANK,
    JobWorld,
    job_world,
    slow_rank,
    slower_from_60,
    uniform_compute,
)
from fleetwatch.model import Target, sample_to_pb
from fleetwatch.testing import made_up_uuid
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

LOST_RANK = 5  # node-c GPU 1 in the 4 x 2 world


def run_without(
    w: JobWorld,
    steps: range,
    gone: set[int],
    *,
    compute=lambda _s, _r: 0.8,
    step_time=lambda _s: 1.0,
) -> None:
    """Every rank but ``gone`` reports each step (a synchronous job that goes on without them)."""
    for step in steps:
        for rank in range(w.ranks):
            if rank not in gone:
                w.report(
                    rank,
                    step,
                    step_time_s=step_time(step),
                    compute_time_s=compute(step, rank),
                )
        w.clock.advance(step_time(step))


def port_counter(w: JobWorld, node: str, signal: str, value: float) -> None:
    sample = sample_to_pb(Target.ib_port("mlx5_0", 1), signal, value)
    w.fleet.apply_report(node, pb.Report(samples=[sample]))


class TestMissingRanks:
    def test_a_rank_that_stops_reporting_is_missing_and_not_extrapolated(self):
        """Eight ranks of 1,000 tokens a 1 s step make 8,000 tokens/s; once rank 5 stops
        reporting, the job shows it missing (count, node, summary, rank table, metric) and its
        tokens/s is the seven ranks' 7,000, not the 8,000 a scale-up over the world would say."""
        w = job_world()
        w.run(range(30))
        assert w.job()["tokens_per_s"] == pytest.approx(8000.0)
        assert w.job()["ranks_missing"] == 0
        run_without(w, range(30, 60), {LOST_RANK})
        job = w.job()
        assert job["ranks_missing"] == 1
        assert job["missing_nodes"] == ["node-c"]
        assert job["tokens_per_s"] == pytest.approx(7000.0)
        assert job["tokens_per_s_per_gpu"] == pytest.approx(1000.0)
        assert "1 of 8 ranks missing (on node-c)" in job["summary"]
        table = {r["rank"]: r["missing"] for r in w.book.ranks("j")}
        assert table[LOST_RANK] is True
        assert sum(table.values()) == 1
        families = {f.name: f for f in JobsCollector(w.book).collect()}
        (sample,) = families["fleetwatch_job_ranks_missing"].samples
        assert (sample.labels, sample.value) == ({"training_job": "j"}, 1.0)

    def test_a_lost_report_of_a_rank_that_is_there_is_still_scaled_up(self):
        """One report lost now and then is not a missing rank: its step is scaled up as before."""
        w = job_world()
        w.run(range(30))
        run_without(w, range(30, 31), {LOST_RANK})
        w.run(range(31, 40))
        job = w.job()
        assert job["ranks_missing"] == 0
        assert job["tokens_per_s"] == pytest.approx(8000.0)

    def test_a_straggler_that_stops_reporting_is_no_straggler(self):
        """The slow rank's node crashes: within a few steps it is missing and no straggler, and
        its GPU's rank view no longer says it straggles."""
        w = job_world()
        w.run(range(100), step_time=lambda _s: 1.05, compute=slow_rank)
        assert w.job()["stragglers"] == 1
        run_without(w, range(100, 110), {SLOW_RANK}, compute=slow_rank)
        job = w.job()
        assert job["stragglers"] == 0
        assert job["straggler_nodes"] == []
        assert job["ranks_missing"] == 1
        assert w.book.rank_on("node-c", made_up_uuid("node-c", 1))["straggler"] is False

    def test_a_lost_gpu_makes_its_rank_missing_at_once(self):
        """The fleet says the GPU is gone: its rank is missing before any step went by."""
        w = job_world()
        w.run(range(30))
        w.gpu_signal("node-c", 1, "gpu_present", 0)
        job = w.job()
        assert job["ranks_missing"] == 1
        assert job["missing_nodes"] == ["node-c"]


class TestEvidenceThresholds:
    def test_a_handful_of_symbol_errors_makes_no_suspect(self):
        """A drop that slows every rank alike, with five symbol errors on one healthy node's
        port: no suspect (they used to make node-b the drop's suspect)."""
        w = job_world()
        port_counter(w, "node-b", "ib_symbol_error", 10)
        w.run(range(55), step_time=slower_from_60, compute=uniform_compute)
        port_counter(w, "node-b", "ib_symbol_error", 15)
        w.run(range(55, 100), step_time=slower_from_60, compute=uniform_compute)
        job = w.job()
        assert job["drop"] is True
        assert job["suspects"] == []
        assert job["drop_cause"] == "none"

    def test_many_symbol_errors_make_the_node_a_suspect(self):
        """Past the threshold (100 in the window) the same port makes node-b the suspect."""
        w = job_world()
        port_counter(w, "node-b", "ib_symbol_error", 10)
        w.run(range(55), step_time=slower_from_60, compute=uniform_compute)
        port_counter(w, "node-b", "ib_symbol_error", 900)
        w.run(range(55, 100), step_time=slower_from_60, compute=uniform_compute)
        job = w.job()
        assert job["drop_cause"] == "hardware"
        assert job["suspects"] == ["node-b"]
        assert "symbol_error +890" in job["summary"]
