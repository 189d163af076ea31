from typing import Any

import pytest

from collector.exceptions import ConfigError
from collector.export.jobs import JobsCollector
from collector.jobs.config import JobsConfig
from collector.jobs.peak_flops import PEAK_BF16_FLOPS
from collector.testing import (
    PARAMS,
    SLOW_RANK,
    JobWorld,
    job_world,
    slow_rank,
    slower_from_60,
    uniform_compute,
)
from fleetwatch import PROTOCOL_VERSION
from fleetwatch.model import Target, sample_to_pb
from fleetwatch.testing import made_up_uuid
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

# ---- gathering steps --------------------------------------------------------------------------


def test_step_finishes_once_every_rank_reported():
    """A step is not finished while a rank of the world is missing, and is once it reports."""
    w = job_world(nodes=("node-a",), gpus=4)
    for rank in range(3):
        w.report(rank, 0)
    job = w.book.jobs["j"]
    assert list(job.steps) == []
    w.report(3, 0)
    (step,) = job.steps
    assert (step.step, step.ranks, step.tokens) == (0, 4, 4000.0)


def test_lost_report_finishes_the_step_two_steps_later_with_tokens_scaled():
    """A step one rank never reports finishes when the job is two steps past it, tokens scaled."""
    w = job_world(nodes=("node-a",), gpus=4)
    for rank in range(3):  # rank 3's report of step 0 is lost
        w.report(rank, 0, tokens=900.0)
    for rank in range(4):
        w.report(rank, 1)
    job = w.book.jobs["j"]
    assert list(job.steps) == []  # step 1 is complete but waits for step 0
    w.report(0, 2)
    assert [s.step for s in job.steps] == [0, 1]
    first = job.steps[0]
    assert first.ranks == 3
    assert first.tokens == pytest.approx(3 * 900.0 * 4 / 3)


def test_late_report_for_a_finished_step_is_ignored():
    """A report for a step already finished adds nothing to it and is no restart."""
    w = job_world(nodes=("node-a",), gpus=2)
    w.run(range(20))
    job = w.book.jobs["j"]
    before = [(s.step, s.tokens) for s in job.steps]
    w.report(0, 15, tokens=1e6)
    assert [(s.step, s.tokens) for s in job.steps] == before
    assert job.restarts == 0


# ---- figures ----------------------------------------------------------------------------------


def test_throughput_and_mfu_figures():
    """tokens_per_s is tokens over step time; MFU uses 6 x params and the H100's peak."""
    w = job_world(nodes=("node-a",), gpus=8)
    w.run(range(30), step_time=lambda _s: 2.0, tokens=1000.0)
    job = w.job()
    assert job["gpus"] == 8
    assert job["nodes"] == 1
    assert job["step"] == 29
    assert job["step_time_s"] == 2.0
    assert job["tokens_per_s"] == pytest.approx(4000.0)
    assert job["tokens_per_s_per_gpu"] == pytest.approx(500.0)
    expected = 4000.0 * 6 * PARAMS / (8 * 989.4e12)
    assert PEAK_BF16_FLOPS["H100 SXM"] == 989.4e12
    assert job["mfu"] == pytest.approx(expected, rel=1e-6)
    assert "4,000 tokens/s" in job["summary"]


def test_flops_per_token_overrides_params():
    """A declared flops_per_token is used instead of 6 x params."""
    w = job_world(nodes=("node-a",), gpus=8)
    w.run(range(10), step_time=lambda _s: 2.0, flops_per_token=1e11)
    assert w.job()["mfu"] == pytest.approx(4000.0 * 1e11 / (8 * 989.4e12), rel=1e-6)


def test_ettr_is_near_one_without_gaps():
    """A job stepping back to back has an effective training time ratio close to 1."""
    w = job_world()
    w.run(range(100))
    assert w.job()["ettr"] == pytest.approx(1.0, abs=0.02)


def test_ettr_halves_after_a_pause_as_long_as_the_run():
    """A silence as long as the run so far halves the ratio."""
    w = job_world()
    w.run(range(50), step_time=lambda _s: 2.0)
    assert w.job()["ettr"] > 0.95
    w.clock.advance(100.0)
    assert w.job()["ettr"] == pytest.approx(0.5, abs=0.02)


def test_goodput_counts_the_tokens_of_forward_steps_over_wall_time():
    """Goodput is the throughput while stepping, halved by a pause as long as the run."""
    w = job_world()
    w.run(range(50), step_time=lambda _s: 2.0)
    stepping = w.job()["goodput_tokens_per_s"]
    assert stepping == pytest.approx(w.job()["tokens_per_s"], rel=0.03)
    w.clock.advance(100.0)
    assert w.job()["goodput_tokens_per_s"] == pytest.approx(stepping / 2, rel=0.03)


def test_restart_is_counted_and_redone_steps_are_not_productive():
    """Steps going back more than 10 count a restart; re-done steps add no productive time."""
    w = job_world()
    w.run(range(60))
    w.run(range(45, 80))  # back to a checkpoint at step 45
    job = w.job()
    assert job["restarts"] == 1
    assert job["step"] == 79
    state = w.book.jobs["j"]
    assert state.productive_s == pytest.approx(80.0)
    assert job["ettr"] == pytest.approx(80.0 / 96.0, abs=0.01)


def test_going_back_ten_steps_or_fewer_is_no_restart():
    """A report within 10 steps behind the finished ones is late, not a restart."""
    w = job_world()
    w.run(range(60))
    w.run(range(49, 70))
    assert w.job()["restarts"] == 0


# ---- stragglers -------------------------------------------------------------------------------


def test_straggler_rank_view():
    """The slow rank's GPU shows a 25 % slowdown costing 8 x (1 - 1/1.25) GPU-hours per hour."""
    w = job_world()
    w.run(range(100), step_time=lambda _s: 1.05, compute=slow_rank)
    rank = w.book.rank_on("node-c", made_up_uuid("node-c", 1))
    assert rank["job"] == "j"
    assert rank["rank"] == SLOW_RANK
    assert rank["straggler"] is True
    assert rank["slowdown"] == pytest.approx(0.25, abs=0.01)
    assert rank["lost_gpu_hours_per_hour"] == pytest.approx(1.6, abs=0.01)
    assert rank["job_gpus"] == 8
    other = w.book.rank_on("node-c", made_up_uuid("node-c", 0))
    assert other["straggler"] is False
    assert other["lost_gpu_hours_per_hour"] == 0.0
    assert w.book.rank_on("node-c", "GPU-elsewhere") == {}


def test_no_straggler_before_the_slow_rank_fills_half_its_window():
    """Right after the rank slows down it is not flagged yet; a window later it is."""
    w = job_world()
    w.run(range(45), step_time=lambda _s: 1.05, compute=slow_rank)
    assert w.book.rank_on("node-c", made_up_uuid("node-c", 1))["straggler"] is False
    w.run(range(45, 70), step_time=lambda _s: 1.05, compute=slow_rank)
    assert w.book.rank_on("node-c", made_up_uuid("node-c", 1))["straggler"] is True


def test_straggler_summary_names_node_rank_and_cost():
    """The summary names node and rank, how much slower, and the GPU-hours lost."""
    w = job_world()
    w.run(range(100), step_time=lambda _s: 1.05, compute=slow_rank)
    text = w.book.straggler_summary("j", SLOW_RANK)
    assert "node-c" in text
    assert f"rank {SLOW_RANK}" in text
    assert "25%" in text
    assert "1.6 GPU-hours" in text
    assert "hardware: none found" in text
    assert "throttled" not in text
    assert w.book.straggler_summary("j", 99) == ""
    assert w.book.straggler_summary("nope", 0) == ""


def test_straggler_summary_shows_a_thermally_throttled_gpu():
    """When the rank's GPU is throttled for heat the summary says so, with its temperature."""
    w = job_world()
    w.throttle("node-c", 1)
    w.run(range(100), step_time=lambda _s: 1.05, compute=slow_rank)
    text = w.book.straggler_summary("j", SLOW_RANK)
    assert "throttled" in text
    assert "hw thermal" in text
    assert "91 °C" in text


def test_publish_counts_stragglers_and_their_nodes():
    """The job map counts straggling ranks, names their nodes and what they cost."""
    w = job_world()
    w.run(range(100), step_time=lambda _s: 1.05, compute=slow_rank)
    job = w.job()
    assert job["stragglers"] == 1
    assert job["straggler_nodes"] == ["node-c"]
    assert job["lost_gpu_hours_per_hour"] == pytest.approx(1.6, abs=0.01)
    (table_row,) = [r for r in w.book.ranks("j") if r["rank"] == SLOW_RANK]
    assert table_row["straggler"] is True
    assert table_row["node"] == "node-c"
    assert table_row["gpu"] == 1
    assert table_row["compute_ratio"] == pytest.approx(1.25, abs=0.01)


def test_on_change_is_told_the_gpu_of_a_rank_that_starts_straggling():
    """The callback gets (node, uuid) of the rank when it is first flagged, and only then."""
    w = job_world()
    told: list[tuple[str, list[tuple[str, str]]]] = []
    w.book.on_change = lambda job, gpus: told.append((job, gpus))
    w.run(range(100), step_time=lambda _s: 1.05, compute=slow_rank)
    with_gpus = [t for t in told if t[1]]
    assert with_gpus == [("j", [("node-c", made_up_uuid("node-c", 1))])]
    assert len(told) > len(with_gpus)  # every finished step is told, with no GPU most times


def test_on_change_is_told_when_the_rank_recovers():
    """A straggler that catches up is told again, so its GPU is looked at once more."""
    w = job_world()
    told: list[list[tuple[str, str]]] = []
    w.book.on_change = lambda _job, gpus: told.append(gpus)
    w.run(range(100), step_time=lambda _s: 1.05, compute=slow_rank)
    w.run(range(100, 160), step_time=lambda _s: 1.05)
    assert [g for g in told if g] == [[("node-c", made_up_uuid("node-c", 1))]] * 2
    assert w.job()["stragglers"] == 0


# ---- throughput drops and their causes ---------------------------------------------------------


def test_uniform_slowdown_is_a_drop_without_hardware_cause():
    """Every rank slowing alike is a drop whose cause is 'none', with no suspects."""
    w = job_world()
    w.run(range(100), step_time=slower_from_60, compute=uniform_compute)
    job = w.job()
    assert job["drop"] is True
    assert job["drop_share"] == pytest.approx(1 - 1 / 1.3, abs=0.02)
    assert job["drop_cause"] == "none"
    assert job["suspects"] == []
    assert job["stragglers"] == 0
    assert "no hardware cause found" in job["summary"]
    assert "throughput down" in job["summary"]


def test_no_drop_while_throughput_holds():
    """A steady job shows no drop and no cause."""
    w = job_world()
    w.run(range(100))
    job = w.job()
    assert job["drop"] is False
    assert job["drop_cause"] == ""


def test_throttled_straggling_node_is_the_hardware_suspect():
    """A drop with one node's GPU throttled and its rank slower blames that node first."""
    w = job_world()
    w.throttle("node-b", 0)

    def compute(step: int, rank: int) -> float:
        return 1.04 if rank == 2 and step >= 60 else 0.8  # rank 2 is node-b GPU 0

    w.run(range(100), step_time=slower_from_60, compute=compute)
    job = w.job()
    assert job["drop"] is True
    assert job["drop_cause"] == "hardware"
    assert job["suspects"][0] == "node-b"
    assert job["straggler_nodes"] == ["node-b"]
    assert "suspects: node-b" in job["summary"]
    assert "hw thermal" in job["summary"]


def test_throttled_gpu_whose_rank_keeps_pace_is_no_suspect():
    """A throttled GPU that computes as fast as the rest is not what slowed the job."""
    w = job_world()
    w.throttle("node-c", 1)
    w.run(range(100), step_time=slower_from_60, compute=uniform_compute)
    job = w.job()
    assert job["drop"] is True
    assert job["drop_cause"] == "none"
    assert job["suspects"] == []


# ---- fabric -----------------------------------------------------------------------------------


def test_congestion_on_three_of_four_nodes_is_the_fabric():
    """IB congestion on most of the job's nodes marks the job as fabric-bound, naming them."""
    w = job_world()
    for node in ("node-b", "node-c", "node-d"):
        w.congest(node)
    w.run(range(40))
    job = w.job()
    assert job["fabric"] is True
    assert job["fabric_nodes"] == ["node-b", "node-c", "node-d"]


def test_congestion_on_two_nodes_is_not_yet_the_fabric():
    """Two congested nodes are below fabric_min_nodes (3): each is its own node's business."""
    w = job_world()
    w.congest("node-b")
    w.congest("node-d")
    w.run(range(40))
    assert w.job()["fabric"] is False


def test_congestion_on_one_node_is_not_the_fabric():
    """One congested node is that node's business, not the fabric's."""
    w = job_world()
    w.congest("node-b")
    w.run(range(40))
    job = w.job()
    assert job["fabric"] is False
    assert job["fabric_nodes"] == []


def test_drop_with_fabric_signs_blames_the_fabric_and_no_node():
    """A drop while the fabric shows congestion has cause 'fabric' and no suspects."""
    w = job_world()
    for node in ("node-b", "node-c", "node-d"):
        w.congest(node)
    w.run(range(100), step_time=slower_from_60, compute=uniform_compute)
    job = w.job()
    assert job["drop"] is True
    assert job["drop_cause"] == "fabric"
    assert job["suspects"] == []
    assert "fabric: congestion or IB errors on 3 of 4 nodes" in job["summary"]


def test_drop_with_one_congested_node_suspects_that_node():
    """Congestion on a single node of a slowed job makes that node a suspect."""
    w = job_world()
    w.congest("node-b")
    w.run(range(100), step_time=slower_from_60, compute=uniform_compute)
    job = w.job()
    assert job["drop_cause"] == "hardware"
    assert job["suspects"] == ["node-b"]


# ---- checkpoints ------------------------------------------------------------------------------


def checkpoint_fields(w: JobWorld, cost_s: float) -> dict[str, Any]:
    end = w.clock.now()
    return {
        "checkpoint_start_unix_ms": int((end - cost_s) * 1000),
        "checkpoint_end_unix_ms": int(end * 1000),
    }


def test_checkpoint_sets_cost_and_interval():
    """A reported checkpoint gives its cost, its age and a positive recommended interval."""
    w = job_world()
    w.run(range(5))
    w.run(range(5, 6), **checkpoint_fields(w, 60.0))
    w.run(range(6, 20))
    job = w.job()
    assert job["checkpoint_cost_s"] == pytest.approx(60.0, abs=0.01)
    assert job["checkpoint_interval_s"] > 60.0
    assert job["checkpoint_age_s"] == pytest.approx(15.0, abs=0.01)
    assert job["checkpoint_overdue"] is False
    assert len(w.book.jobs["j"].checkpoints) == 1  # every rank told of the same checkpoint
    assert "recommended every" in job["summary"]


def test_no_checkpoint_no_interval():
    """Without a checkpoint the cost and interval stay 0 and nothing is overdue."""
    w = job_world()
    w.run(range(20))
    job = w.job()
    assert job["checkpoint_cost_s"] == 0.0
    assert job["checkpoint_interval_s"] == 0.0
    assert job["checkpoint_overdue"] is False


def test_node_failures_shorten_the_interval():
    """Failures noted on a node of the job shorten the recommended interval."""
    w = job_world()
    w.run(range(1), **checkpoint_fields(w, 60.0))
    before = w.job()["checkpoint_interval_s"]
    for _ in range(100):
        w.book.note_failure("node-a")
    after = w.job()["checkpoint_interval_s"]
    assert 0 < after < before / 3


def test_failures_on_other_nodes_do_not_change_the_interval():
    """A failing node the job does not run on leaves its advice alone."""
    w = job_world(nodes=("node-a", "node-b"), gpus=2)
    w.fleet.on_hello(
        pb.Hello(node="node-z", boot_id="b", protocol_version=PROTOCOL_VERSION),
        w.clock.monotonic(),
        w.clock.now(),
    )
    w.run(range(1), **checkpoint_fields(w, 60.0))
    before = w.job()["checkpoint_interval_s"]
    for _ in range(100):
        w.book.note_failure("node-z")
    assert w.job()["checkpoint_interval_s"] == pytest.approx(before)


def test_checkpoint_overdue_after_three_intervals():
    """With no new checkpoint, overdue turns True once the age passes 3 x the interval."""
    w = job_world(nodes=("node-a",), gpus=2)
    w.run(range(1), **checkpoint_fields(w, 60.0))
    for _ in range(100):
        w.book.note_failure("node-a")
    seen = []
    step = 1
    while True:
        job = w.job()
        seen.append(job["checkpoint_overdue"])
        assert job["checkpoint_overdue"] == (
            job["checkpoint_age_s"] > 3 * job["checkpoint_interval_s"]
        )
        if job["checkpoint_overdue"] or step > 200:
            break
        w.clock.advance(300.0)
        w.run(range(step, step + 1))
        step += 1
    assert seen[-1] is True
    assert seen.count(False) >= 10  # it took more than a few reports to get there
    assert "last checkpoint" in job["summary"]


# ---- idle and forgotten jobs ------------------------------------------------------------------


def test_idle_job_is_inactive_and_its_stragglers_vanish():
    """A job silent past idle_after_s is inactive; its straggler flags leave publish and rank_on."""
    w = job_world()
    w.run(range(100), step_time=lambda _s: 1.05, compute=slow_rank)
    assert w.job()["stragglers"] == 1
    w.clock.advance(w.book.config.idle_after_s + 1)
    job = w.job()
    assert job["active"] is False
    assert job["stragglers"] == 0
    assert job["straggler_nodes"] == []
    assert job["lost_gpu_hours_per_hour"] == 0.0
    assert job["fabric"] is False
    assert w.book.rank_on("node-c", made_up_uuid("node-c", 1)) == {}


def test_silent_job_is_forgotten_and_a_live_one_kept():
    """expire() forgets a job silent past forget_after_s and keeps one still reporting."""
    w = job_world(config=JobsConfig(idle_after_s=60.0, forget_after_s=300.0))
    w.run(range(10), job="old")
    for step in range(10, 17):
        w.clock.advance(50.0)
        w.run(range(step, step + 1), job="live")
        w.book.expire()
    assert sorted(w.book.jobs) == ["live"]
    assert [m["id"] for m in w.book.publish()] == ["live"]
    assert w.book.rank_on("node-a", made_up_uuid("node-a", 0))["job"] == "live"


def test_expire_keeps_a_job_before_forget_after():
    """A job silent for less than forget_after_s is still known (inactive)."""
    w = job_world()
    w.run(range(10))
    w.clock.advance(w.book.config.forget_after_s - 1)
    w.book.expire()
    assert w.job()["active"] is False


# ---- limits and configuration -----------------------------------------------------------------


def test_reports_for_new_jobs_beyond_max_jobs_are_refused():
    """With max_jobs=1 a second job's reports are refused and counted; the first goes on."""
    w = job_world(config=JobsConfig(max_jobs=1))
    w.run(range(3), job="first")
    w.run(range(3), job="second")
    assert sorted(w.book.jobs) == ["first"]
    assert w.book.reports_refused == 3 * 8
    assert w.book.reports == 3 * 8
    w.run(range(3, 5), job="first")
    assert w.book.reports == 5 * 8
    assert w.job("first")["step"] == 4


def test_a_forgotten_job_frees_its_place():
    """Once the old job is forgotten a new one is accepted under max_jobs=1."""
    w = job_world(config=JobsConfig(max_jobs=1))
    w.run(range(3), job="first")
    w.clock.advance(w.book.config.forget_after_s + 1)
    w.book.expire()
    w.run(range(3), job="second")
    assert sorted(w.book.jobs) == ["second"]
    assert w.book.reports_refused == 0


# ---- who may report: owners, ranks that hold their node, each uid's share ----------------------


def send(w: JobWorld, node: str, rank: int, step: int, *, job: str = "j", **fields: Any) -> None:
    """One step of ``rank`` as ``node``'s agent forwards it (with what it learned of the sender)."""
    values: dict[str, Any] = {
        "job_id": job,
        "rank": rank,
        "step": step,
        "time_unix_ms": int(w.clock.now() * 1000),
        "step_time_s": 1.0,
        "compute_time_s": 0.8,
        "tokens": 1000.0,
        "gpu_uuid": made_up_uuid(node, rank % w.gpus),
        "world_size": w.ranks,
    }
    values.update(fields)
    w.book.ingest(node, pb.JobReport(steps=[pb.JobStep(**values)]))


def run_as(w: JobWorld, steps: range, uid: int, **fields: Any) -> None:
    """Every rank reports each step from its own node, sent by processes of ``uid``."""
    for step in steps:
        for rank in range(w.ranks):
            send(w, w.place(rank)[0], rank, step, sender_uid=uid, **fields)
        w.clock.advance(1.0)


def test_another_uid_cannot_report_for_a_job_and_is_counted():
    """The impersonation of issue 18: uid 2002's reports for ranks of uid 2001's job, with half
    the step time, from a node the job does not run on, are refused; nothing moves, nobody
    straggles, and the attacker alone cannot keep the job active after it stopped."""
    w = job_world(nodes=("node-a", "node-b"), gpus=4)
    run_as(w, range(30), uid=2001)
    for step in range(30, 60):
        for rank in range(4):  # node-b's ranks, claimed from node-a at twice the speed
            send(w, "node-a", rank, step, sender_uid=2002, compute_time_s=0.4, step_time_s=0.5)
        for rank in range(8):
            send(w, w.place(rank)[0], rank, step, sender_uid=2001)
        w.clock.advance(1.0)
    job = w.book.jobs["j"]
    assert w.book.refused == {"owner_mismatch": 30 * 4}
    assert {r: job.ranks[r].node for r in range(4)} == dict.fromkeys(range(4), "node-a")
    assert w.job()["stragglers"] == 0
    assert job.owner == "uid 2001"
    assert w.book.refusals() == {"owner_mismatch": 120}
    for step in range(60, 60 + 700):  # the owner stopped; the attacker goes on
        send(w, "node-b", 4, step, sender_uid=2002)
        w.clock.advance(1.0)
    assert w.job()["active"] is False


def test_a_rank_does_not_move_to_another_node_mid_job():
    """A report for a rank another node holds is refused (rank_held), even from the same uid."""
    w = job_world(nodes=("node-a", "node-b"), gpus=2)
    run_as(w, range(5), uid=2001)
    send(w, "node-b", 0, 5, sender_uid=2001)
    assert w.book.refused == {"rank_held": 1}
    assert w.book.jobs["j"].ranks[0].node == "node-a"
    assert w.book.rank_on("node-a", made_up_uuid("node-a", 0))["rank"] == 0


def test_a_restart_with_a_new_world_size_may_move_ranks():
    w = job_world(nodes=("node-a", "node-b"), gpus=2)
    run_as(w, range(5), uid=2001)
    send(w, "node-b", 0, 0, sender_uid=2001, world_size=2)
    assert w.book.refused == {}
    assert w.book.jobs["j"].ranks[0].node == "node-b"


def test_a_rank_process_started_after_the_holders_last_report_may_move():
    """The agent stamps each step with its sender's start (from the kernel): a rank process that
    started after the holder last reported is the job restarted elsewhere; one that ran all the
    while is not."""
    w = job_world(nodes=("node-a", "node-b"), gpus=2)
    run_as(w, range(5), uid=2001)
    last = w.book.jobs["j"].ranks[0].last_report_ms
    send(w, "node-b", 0, 5, sender_uid=2001, sender_start_unix_ms=last - 60_000)
    assert w.book.refused == {"rank_held": 1}
    w.clock.advance(30.0)
    send(w, "node-b", 0, 0, sender_uid=2001, sender_start_unix_ms=last + 20_000)
    assert w.book.jobs["j"].ranks[0].node == "node-b"
    assert w.book.refused == {"rank_held": 1}


def test_a_rank_whose_holder_went_quiet_may_move():
    w = job_world(nodes=("node-a", "node-b"), gpus=2)
    run_as(w, range(5), uid=2001)
    for rank in (1, 2, 3):
        send(w, w.place(rank)[0], rank, 5, sender_uid=2001)
    w.clock.advance(w.book.config.idle_after_s + 1)
    send(w, "node-b", 0, 6, sender_uid=2001)
    assert w.book.jobs["j"].ranks[0].node == "node-b"
    assert w.book.refused == {}


def test_a_slurm_job_takes_its_id_back_from_a_uid_that_reported_it_first():
    """A uid outside the Slurm job reported job id 1234 first; the job's own reports (the agent
    read Slurm job 1234 in their cgroup) start it afresh, and the uid is refused from then on."""
    w = job_world(nodes=("node-a", "node-b"), gpus=2)
    run_as(w, range(3), uid=2002, job_id="1234")
    slurm = {"sender_uid": 2001, "scheduler_job": "slurm:1234"}
    began = w.clock.monotonic()
    run_as(w, range(3), uid=2001, job_id="1234", scheduler_job="slurm:1234")
    job = w.book.jobs["1234"]
    assert job.owner == "Slurm job 1234"
    assert job.first_seen == began  # afresh: nothing of the uid's reports is kept
    send(w, "node-a", 0, 3, job="1234", sender_uid=2002)
    send(w, "node-a", 0, 3, job="1234", sender_uid=2001)  # the user, outside the job
    assert w.book.refused == {"owner_mismatch": 2}
    send(w, "node-a", 0, 3, job="1234", **slurm)
    assert w.book.refused == {"owner_mismatch": 2}


def test_one_uid_holds_at_most_its_share_of_max_jobs():
    """uid_job_share of max_jobs (2 of 20 here): the flood's third job is refused; another uid's
    job still gets in; a report from an agent too old to say who sent it is not held to it."""
    w = job_world(config=JobsConfig(max_jobs=20, uid_job_share=0.1))
    for i in range(1100):
        send(w, "node-a", 0, 1, job=f"fake-{i}", sender_uid=2002)
    assert sorted(w.book.jobs) == ["fake-0", "fake-1"]
    assert w.book.refused == {"uid_jobs": 1098}
    send(w, "node-a", 1, 1, job="real", sender_uid=2001)
    send(w, "node-a", 1, 1, job="old-agent")
    assert sorted(w.book.jobs) == ["fake-0", "fake-1", "old-agent", "real"]


def test_a_forgotten_job_gives_its_uid_its_share_back():
    w = job_world(config=JobsConfig(max_jobs=10, uid_job_share=0.1))
    send(w, "node-a", 0, 1, job="first", sender_uid=2002)
    send(w, "node-a", 0, 1, job="second", sender_uid=2002)
    assert w.book.refused == {"uid_jobs": 1}
    w.clock.advance(w.book.config.forget_after_s + 1)
    w.book.expire()
    send(w, "node-a", 0, 1, job="second", sender_uid=2002)
    assert sorted(w.book.jobs) == ["second"]


def test_refusals_are_exported_by_reason():
    w = job_world(config=JobsConfig(max_jobs=1))
    send(w, "node-a", 0, 1, job="a", sender_uid=2001)
    send(w, "node-a", 0, 1, job="b", sender_uid=2001)
    send(w, "node-b", 0, 2, job="a", sender_uid=2001)
    families = {f.name: f for f in JobsCollector(w.book).collect()}
    refused = families["fleetwatch_job_reports_refused"]
    assert {s.labels["reason"]: s.value for s in refused.samples if s.name.endswith("_total")} == {
        "max_jobs": 1.0,
        "uid_jobs": 0.0,
        "owner_mismatch": 0.0,
        "rank_held": 1.0,
        "beyond_world": 0.0,
        "node_ranks": 0.0,
    }


def test_a_rank_beyond_the_declared_world_size_is_refused():
    """The job declared 8 ranks: rank 8 and above, in a report that names no world size of its
    own, are refused and counted; nothing of the job changes."""
    w = job_world(nodes=("node-a", "node-b"), gpus=4)
    run_as(w, range(3), uid=2001)
    for rank in range(8, 40):
        send(w, "node-a", rank, 3, sender_uid=2001, world_size=0)
    assert w.book.refused == {"beyond_world": 32}
    assert sorted(w.book.jobs["j"].ranks) == list(range(8))


def test_a_nodes_reports_hold_at_most_ranks_per_node_ranks():
    """One node made up 5,000 ranks of a job that declares no world size (a compromised agent,
    or a local user's job): it keeps ranks_per_node of them, the rest are refused and counted,
    and another node's real job is still taken whole."""
    w = job_world(nodes=("node-a", "node-b"), gpus=4, config=JobsConfig(ranks_per_node=16))
    for rank in range(5000):
        send(w, "node-a", rank, 1, job="made-up", sender_uid=65534, world_size=0)
    assert len(w.book.jobs["made-up"].ranks) == 16
    assert w.book.refused == {"node_ranks": 5000 - 16}
    for rank in range(4, 8):  # node-b's own job
        send(w, "node-b", rank, 1, job="real", sender_uid=2001, world_size=8)
    assert sorted(w.book.jobs["real"].ranks) == [4, 5, 6, 7]
    assert w.book.refused == {"node_ranks": 5000 - 16}
    w.book.publish()
    families = {f.name: f for f in JobsCollector(w.book).collect()}
    series = families["fleetwatch_job_rank_step_time_seconds"].samples
    assert sum(s.labels["node"] == "node-a" for s in series) == 16


def test_ranks_a_node_held_are_its_own_again_when_the_job_goes_or_shrinks():
    """A forgotten job gives its node its ranks back; a restart with a smaller world size drops
    the ranks above it (and the node's count with them); a rank that moved counts where it is."""
    w = job_world(nodes=("node-a", "node-b"), gpus=4, config=JobsConfig(ranks_per_node=8))
    for rank in range(8):
        send(w, "node-a", rank, 1, job="first", sender_uid=2001, world_size=8)
    send(w, "node-a", 0, 1, job="second", sender_uid=2001, world_size=2)
    assert w.book.refused == {"node_ranks": 1}
    send(w, "node-a", 0, 0, job="first", sender_uid=2001, world_size=4)  # restarted smaller
    assert sorted(w.book.jobs["first"].ranks) == [0, 1, 2, 3]
    for rank in range(2):
        send(w, "node-a", rank, 1, job="second", sender_uid=2001, world_size=2)
    assert sorted(w.book.jobs["second"].ranks) == [0, 1]
    w.clock.advance(w.book.config.idle_after_s + 1)  # first's rank 3 went quiet: it may move
    send(w, "node-b", 3, 1, job="first", sender_uid=2001, world_size=4)
    assert w.book.jobs["first"].ranks[3].node == "node-b"
    for rank in range(2, 4):  # node-a holds 5 now: room for 3 more
        send(w, "node-a", rank, 1, job="third", sender_uid=2001, world_size=8)
    assert w.book.refused == {"node_ranks": 1}
    w.clock.advance(w.book.config.forget_after_s + 1)
    w.book.expire()
    for rank in range(8):
        send(w, "node-a", rank, 1, job="fourth", sender_uid=2001, world_size=8)
    assert len(w.book.jobs["fourth"].ranks) == 8
    assert w.book.refused == {"node_ranks": 1}


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"straggler_margin": 1.5}, "straggler_margin"),
        ({"straggler_margin": 0}, "straggler_margin"),
        ({"straggler_window_steps": 0}, "straggler_window_steps"),
        ({"min_drop": 1.0}, "min_drop"),
        ({"fabric_share": -0.1}, "fabric_share"),
        ({"idle_after_s": True}, "idle_after_s"),
        ({"max_jobs": 2.5}, "max_jobs"),
        ({"max_ranks": "10"}, "max_ranks"),
        ({"ranks_per_node": 0}, "ranks_per_node"),
        ({"uid_job_share": 0}, "uid_job_share"),
        ({"uid_job_share": 1.5}, "uid_job_share"),
    ],
)
def test_jobs_config_refuses_bad_values_naming_the_key(values, key):
    """A value that cannot work is refused with a ConfigError naming its key."""
    with pytest.raises(ConfigError, match=key):
        JobsConfig(**values)


def test_jobs_config_from_table_refuses_unknown_keys():
    """An unknown key in the table is an error that names it and lists the known ones."""
    with pytest.raises(ConfigError, match="unknown keys bogus") as caught:
        JobsConfig.from_table({"bogus": 1, "max_jobs": 5})
    assert "straggler_margin" in str(caught.value)


def test_jobs_config_from_table_takes_known_keys():
    """Known keys from the table override the defaults."""
    config = JobsConfig.from_table({"max_jobs": 5, "straggler_margin": 0.2})
    assert (config.max_jobs, config.straggler_margin) == (5, 0.2)
    assert config.idle_after_s == JobsConfig().idle_after_s


# ---- hung, failed, finished (collector/jobs/liveness.py) ---------------------------------------


def describe(
    w: JobWorld,
    states: dict[int, str],
    job: str = "j",
    wchans: dict[int, str] | None = None,
    silent: frozenset[str] = frozenset(),
) -> None:
    """Each node's agent describes its ranks' processes (every rank, as ``states`` says or
    sleeping, waiting where ``wchans`` says or in the collective's socket read), but the agents
    of ``silent`` nodes, which say nothing."""
    by_node: dict[str, list[pb.RankProcess]] = {}
    for rank in range(w.ranks):
        node, _ = w.place(rank)
        if node in silent:
            continue
        state = states.get(rank, "sleeping")
        wchan = (wchans or {}).get(rank, "unix_stream_read_generic")
        process = pb.RankProcess(
            job_id=job, rank=rank, state=state, cpu_s=1.0, pid=100 + rank, wchan=wchan
        )
        by_node.setdefault(node, []).append(process)
    for node, processes in by_node.items():
        w.book.ingest(node, pb.JobReport(processes=processes))


def silent_for(w: JobWorld, seconds: int, states: dict[int, str] | None = None) -> dict[str, Any]:
    """No steps for ``seconds`` while the agents describe the processes each second."""
    for _ in range(seconds):
        w.clock.advance(1.0)
        describe(w, states or {})
    return w.job()


def test_a_job_whose_processes_are_there_but_step_no_more_is_hung_after_its_deadline():
    """Steps of 1 s: the deadline is the 30 s floor (5 x 1 s is less). Rank 5's process is
    stopped: it is named, with its node and GPU."""
    w = job_world()
    w.run(range(20))
    describe(w, {})
    assert w.job()["state"] == "running"
    assert silent_for(w, 25, {5: "stopped"})["state"] == "running"
    job = silent_for(w, 10, {5: "stopped"})
    assert (job["state"], job["hang_deadline_s"]) == ("hung", 30.0)
    assert job["culprits"] == ["rank 5 on node-c GPU 1: its process is stopped"]
    assert job["culprit_nodes"] == ["node-c"]
    assert "hung: no step finished for" in job["summary"]
    w.run(range(20, 22))  # it steps again
    assert w.job()["state"] == "running"


def test_the_deadline_follows_the_jobs_own_step_times():
    """Steps of 10 s: hung only after 5 x 10 s (the run's last 10 s already passed)."""
    w = job_world()
    w.run(range(10), step_time=lambda _s: 10.0)
    assert silent_for(w, 35)["state"] == "running"
    assert silent_for(w, 10)["state"] == "hung"


def test_a_job_is_not_judged_before_it_finished_a_few_steps():
    """Starting up (NCCL init, loading data) takes as long as it takes."""
    w = job_world()
    w.run(range(3))
    assert silent_for(w, 600)["state"] == "running"


def test_no_hang_without_processes_described_after_the_deadline():
    """An agent that stopped describing (too old, or gone) says nothing: not hung."""
    w = job_world()
    w.run(range(20))
    describe(w, {})
    w.clock.advance(300.0)
    assert w.job()["state"] != "hung"


def describe_ended(w: JobWorld, ended: dict[int, str]) -> None:
    """Every second for 15 s: the ranks in ``ended`` gone, saying ``ended[rank]``."""
    for _ in range(15):
        w.clock.advance(1.0)
        processes: dict[str, list[pb.RankProcess]] = {}
        for rank in range(w.ranks):
            node, _ = w.place(rank)
            word = ended.get(rank)
            state = "sleeping" if word is None else "exited"
            process = pb.RankProcess(job_id="j", rank=rank, state=state, farewell=word or "")
            processes.setdefault(node, []).append(process)
        for node, theirs in processes.items():
            w.book.ingest(node, pb.JobReport(processes=theirs))


def test_a_rank_killed_while_the_others_wait_fails_the_job_and_is_named_first():
    """Rank 2 ended without a word (killed); rank 3 in an exception (what rank 2's end did to
    it): failed once exit_grace_s passed with no step, rank 2 named first."""
    w = job_world()
    w.run(range(20))
    describe(w, {2: "exited"})
    w.clock.advance(5.0)
    describe(w, {2: "exited"})
    assert w.job()["state"] == "running"  # within exit_grace_s
    describe_ended(w, {2: "", 3: "error"})
    job = w.job()
    assert (job["state"], job["ranks_gone"]) == ("failed", 2)
    assert job["culprits"] == [
        "rank 2 on node-b GPU 0: its process ended without a word (killed?)",
        "rank 3 on node-b GPU 1: its process ended in an uncaught exception",
    ]


def test_every_rank_ending_with_ok_finishes_the_job_and_some_ending_ok_fails_nothing():
    w = job_world()
    w.run(range(20))
    describe_ended(w, {0: "ok"})  # rank 0 done first (the others finish a last save)
    assert w.job()["state"] == "running"
    describe_ended(w, dict.fromkeys(range(8), "ok"))
    job = w.job()
    assert (job["state"], job["culprits"]) == ("finished", [])


def test_every_rank_gone_with_one_killed_is_failed_not_finished():
    """gloo's way: the killed rank's peers raise and exit too; the job did not finish."""
    w = job_world()
    w.run(range(20))
    ended = dict.fromkeys(range(8), "error")
    ended[6] = ""
    describe_ended(w, ended)
    job = w.job()
    assert job["state"] == "failed"
    assert (
        job["culprits"][0] == "rank 6 on node-d GPU 0: its process ended without a word (killed?)"
    )


@pytest.mark.parametrize("leaving", ["exited", "sleeping"])
def test_a_job_whose_ranks_are_on_their_way_out_is_not_hung_until_they_linger(leaving: str):
    """The job's last step, then a slow teardown (gloo's takes seconds): rank 0 said ok 27 s
    after the last step (exited, or still exiting: an interpreter with torch takes seconds to
    end) while the others are still there past the 30 s deadline: ending, not hung. Still there
    exit_grace_s (10 s) after rank 0 said so: hung after all."""
    w = job_world()
    w.run(range(20))
    silent_for(w, 26)

    def ending(seconds: int) -> dict[str, Any]:
        for _ in range(seconds):
            w.clock.advance(1.0)
            by_node: dict[str, list[pb.RankProcess]] = {}
            for rank in range(w.ranks):
                state, word = (leaving, "ok") if rank == 0 else ("sleeping", "")
                process = pb.RankProcess(
                    job_id="j", rank=rank, state=state, farewell=word, pid=100 + rank, cpu_s=1.0
                )
                by_node.setdefault(w.place(rank)[0], []).append(process)
            for node, processes in by_node.items():
                w.book.ingest(node, pb.JobReport(processes=processes))
        return w.job()

    assert ending(8)["state"] == "running"  # 34 s after the last step, 7 s after rank 0 went
    job = ending(5)
    assert job["state"] == "hung"


def test_ranks_ended_by_the_failure_later_are_not_its_culprits():
    """Rank 2 died (an exception: its GPU fell off); 30 s later NCCL's watchdog ended the others
    (without a word): only rank 2 is named, not the ranks the watchdog killed."""
    w = job_world()
    w.run(range(20))
    describe_ended(w, {2: "error"})
    assert w.job()["state"] == "failed"
    w.clock.advance(15.0)
    describe_ended(w, {r: "error" if r == 2 else "" for r in range(w.ranks)})
    job = w.job()
    assert (job["state"], job["ranks_gone"]) == ("failed", 8)
    assert job["culprits"] == ["rank 2 on node-b GPU 0: its process ended in an uncaught exception"]


def test_a_crashed_node_hangs_the_job_within_its_deadline_and_its_ranks_are_named():
    """node-c crashed: its agent went silent and nobody tells that its ranks are gone; the
    others wait in the collective. Hung once the deadline passed (not once node-c's ranks went
    stale), node-c's ranks named first."""
    w = job_world()
    w.run(range(20))
    crashed = frozenset({"node-c"})
    w.fleet.view()["node-c"].reachable = False  # what FleetModel.overdue does to a silent node
    for _ in range(35):
        w.clock.advance(1.0)
        describe(w, {}, silent=crashed)
    job = w.job()
    assert job["state"] == "hung"
    assert job["culprits"][:2] == [
        "rank 4 on node-c GPU 0: its node node-c stopped answering (unreachable)",
        "rank 5 on node-c GPU 1: its node node-c stopped answering (unreachable)",
    ]


def nvlink_down(w: JobWorld, node: str, index: int) -> None:
    """The GPU reports one of its NVLinks down."""
    uuid = made_up_uuid(node, index)
    sample = sample_to_pb(Target.nvlink(uuid, 3), "nvlink_up", 0)
    w.fleet.apply_report(node, pb.Report(samples=[sample]))


def test_a_hang_where_every_rank_waits_alike_names_the_rank_whose_gpu_faulted():
    """Every rank waits in the collective, no process stands out; node-c GPU 1's NVLink went
    down: its rank (5) is named, with the evidence. A throttled GPU alone names nobody: it slows
    a collective, it does not stop one."""
    w = job_world()
    w.run(range(20))
    w.throttle("node-a", 0)
    job = silent_for(w, 35)
    assert (job["state"], job["culprits"]) == ("hung", [])
    nvlink_down(w, "node-c", 1)
    job = silent_for(w, 1)
    said = "every rank waits alike, and its node or GPU shows faults"
    assert job["culprits"] == [f"rank 5 on node-c GPU 1: {said}; hardware: GPU 1: 1 NVLink down"]


def test_a_fault_on_most_of_the_jobs_gpus_names_none_of_them():
    w = job_world()
    w.run(range(20))
    for rank in range(5):
        node, _ = w.place(rank)
        nvlink_down(w, node, rank % w.gpus)
    job = silent_for(w, 35)
    assert (job["state"], job["culprits"]) == ("hung", [])


def test_beside_a_silent_node_the_ranks_its_end_ended_are_not_named():
    """node-c crashed and NCCL's watchdog then ended the other ranks (without a word): failed,
    and only node-c's ranks are named, not the ones the watchdog ended."""
    w = job_world()
    w.run(range(20))
    w.fleet.view()["node-c"].reachable = False
    ended = {r: "" for r in range(w.ranks) if w.place(r)[0] != "node-c"}
    describe_ended(w, ended)
    job = w.job()
    assert job["state"] == "failed"
    assert [c.split(":")[0] for c in job["culprits"]] == [
        "rank 4 on node-c GPU 0",
        "rank 5 on node-c GPU 1",
    ]


def test_ranks_gone_before_a_restart_do_not_fail_the_restarted_job():
    """Rank 2's process died and the job failed; it restarted without it (the others' new
    processes step on). Running, not failed; and hung again when its steps stop."""
    w = job_world()
    w.run(range(20))
    describe_ended(w, {2: "error"})
    assert w.job()["state"] == "failed"
    for step in range(20, 30):  # the restart: new steps from the other ranks
        w.clock.advance(1.0)
        for rank in range(w.ranks):
            if rank != 2:
                w.report(rank, step)
    describe_ended(w, {2: "error"})
    assert w.job()["state"] == "running"
    job = silent_for(w, 35, {2: "exited"})
    assert (job["state"], job["culprits"]) == ("hung", [])  # rank 2's old process is not one


def test_a_node_describes_only_the_ranks_it_holds_and_a_live_successor_wins():
    """node-a says rank 7 (node-d's) exited: ignored. After a restart the old process of rank 0
    (exited) and its successor (running) come in one report: the successor counts."""
    w = job_world()
    w.run(range(20))
    w.book.ingest(
        "node-a", pb.JobReport(processes=[pb.RankProcess(job_id="j", rank=7, state="exited")])
    )
    w.book.ingest(
        "node-a",
        pb.JobReport(
            processes=[
                pb.RankProcess(job_id="j", rank=0, state="running", pid=9),
                pb.RankProcess(job_id="j", rank=0, state="exited", pid=5),
            ]
        ),
    )
    job = w.book.jobs["j"]
    assert 7 not in job.processes
    assert (job.processes[0].state, job.processes[0].pid) == ("running", 9)


def test_an_announced_checkpoint_extends_the_deadline_while_it_is_written():
    """Rank 0 says it writes a checkpoint after step 19: 200 s without a step is no hang (the
    deadline grows by the 600 s floor, the job's checkpoints having been short); past that it
    is. A job that announced nothing is hung after 30 s."""
    w = job_world()
    w.run(range(19))
    w.report(0, 19, checkpointing=True)
    w.clock.advance(0.5)  # the step finishes after the announcement came
    for rank in range(1, w.ranks):
        w.report(rank, 19)
    assert silent_for(w, 200)["state"] == "running"
    assert w.job()["hang_deadline_s"] == 630.0
    assert silent_for(w, 440)["state"] == "hung"
    w.run(range(20, 30))  # the next steps: the announcement is spent
    assert silent_for(w, 35)["state"] == "hung"


def test_a_rank_waiting_elsewhere_than_the_others_is_named_in_a_hang():
    """No process stands out by its state, but rank 6 sleeps in hrtimer_nanosleep while the 7
    others wait in the collective's socket read: rank 6 is the suspect."""
    w = job_world()
    w.run(range(20))
    for _ in range(35):
        w.clock.advance(1.0)
        describe(w, {}, wchans={6: "hrtimer_nanosleep"})
    job = w.job()
    assert job["state"] == "hung"
    assert job["culprits"] == [
        (
            "rank 6 on node-d GPU 0: its process waits in hrtimer_nanosleep while 7 others "
            "wait in unix_stream_read_generic"
        )
    ]


@pytest.mark.parametrize(
    "wchans",
    [{}, {0: "pipe_read", 1: "pipe_read", 2: "pipe_read", 3: "pipe_read"}],
    ids=["everyone in one place", "no place holds a majority"],
)
def test_no_rank_is_named_when_none_waits_apart_from_a_majority(wchans):
    w = job_world()
    w.run(range(20))
    for _ in range(35):
        w.clock.advance(1.0)
        describe(w, {}, wchans=wchans)
    job = w.job()
    assert (job["state"], job["culprits"]) == ("hung", [])
    assert "no rank's process stands out" in job["summary"]
