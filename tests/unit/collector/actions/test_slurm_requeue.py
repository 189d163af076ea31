"""Requeueing a Slurm job: reading ``scontrol show job -o`` as the real Slurm prints it, the
checks every argument passes before scontrol runs, and the order of the steps (a recording
scontrol that replays what the real one printed, tests/fixtures/slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from collector.actions.adapters import SlurmRequeuer
from collector.actions.slurm import SlurmError, SlurmRefusedError
from collector.actions.slurm_requeue import (
    RequeueOutcome,
    SlurmJobs,
    excluded_with,
    hostlist_covers,
    is_slurm_job_id,
    parse_job_record,
)

CAPTURES = Path(__file__).resolve().parents[3] / "fixtures" / "slurm"


def capture(name: str) -> str:
    return (CAPTURES / name).read_text()


class TestParseJobRecord:
    def test_running_batch_job(self):
        """A running sbatch job: its state, that Slurm lets it be requeued, no restarts yet,
        the node it runs on, nothing excluded."""
        job = parse_job_record(capture("show-job-running.txt"))
        assert (job.job_id, job.state, job.reason) == ("1", "RUNNING", "None")
        assert (job.requeue, job.batch, job.restarts, job.held) == (True, True, 0, False)
        assert (job.required, job.excluded, job.nodes) == ("node-01", None, "node-01")

    def test_requeued_held_then_released(self):
        """After requeuehold the job is held (COMPLETING while its step ends, then PENDING) and
        counts a restart; after the update it excludes the hostlist as given; released, it is
        pending and no longer held."""
        held = parse_job_record(capture("show-job-requeued-held.txt"))
        assert (held.state, held.reason, held.restarts, held.held) == (
            "COMPLETING",
            "job_requeued_in_held_state",
            1,
            True,
        )
        excluded = parse_job_record(capture("show-job-held-excluded.txt"))
        assert (excluded.state, excluded.held) == ("PENDING", True)
        assert excluded.excluded == "node-[02-03],node-04"
        released = parse_job_record(capture("show-job-released.txt"))
        assert (released.state, released.held, released.restarts) == ("PENDING", False, 1)
        assert released.priority > 0

    def test_jobs_that_cannot_be_requeued_say_why(self):
        """--no-requeue shows Requeue=0; salloc's allocation BatchFlag=0; a cancelled job its
        end state."""
        assert parse_job_record(capture("show-job-no-requeue.txt")).requeue is False
        assert parse_job_record(capture("show-job-salloc.txt")).batch is False
        assert parse_job_record(capture("show-job-cancelled.txt")).state == "CANCELLED"

    def test_array_task_is_one_record(self):
        """``show job 5_0`` describes that task alone, with its own JobId."""
        task = parse_job_record(capture("show-job-array-task.txt"))
        assert task.state == "RUNNING"

    def test_array_parent_prints_every_task_and_is_refused(self):
        """The array's id prints one record per task: refused, never the first one taken."""
        with pytest.raises(ValueError, match="more than once"):
            parse_job_record(capture("show-job-array.txt"))

    def test_job_name_spelling_fields_is_refused(self):
        """Slurm prints a job name as given, line break included: a name that spells
        ``JobState=PENDING`` and ``ExcNodeList=evil`` makes those fields ambiguous. (Its comment,
        ``Restarts=9``, follows ``Comment=`` without a space: no field of its own.)"""
        text = capture("show-job-hostile-name.txt")
        assert "JobState=PENDING\nExcNodeList=evil" in text
        with pytest.raises(ValueError, match=r"fields ExcNodeList, JobState, Requeue appear more"):
            parse_job_record(text)

    def test_not_a_job_record(self):
        """scontrol's words for an unknown job are no record."""
        with pytest.raises(ValueError, match="not a job record"):
            parse_job_record(capture("show-job-unknown.stderr"))


class TestHostlists:
    @pytest.mark.parametrize(
        ("hostlist", "node", "covered"),
        [
            ("node-02", "node-02", True),
            ("node-01,node-02", "node-02", True),
            ("node-[02-03],node-04", "node-03", True),
            ("node-[02-03],node-04", "node-04", True),
            ("node-[02-03],node-04", "node-05", False),
            ("node-[01-03,07]", "node-07", True),
            ("node-[01-03]", "node-3", False),  # zero-padded: the width must match
            ("gpu[1-16]-ib", "gpu9-ib", True),
            ("gpu[1-16]-ib", "gpu09-ib", False),
            ("rack[1-2]-node[1-4]", "rack1-node1", False),  # two groups: not read
            ("node-020", "node-02", False),
        ],
    )
    def test_covers(self, hostlist, node, covered):
        """Plain names and one bracket group per name are read as Slurm expands them."""
        assert covered == hostlist_covers(hostlist, node)

    @pytest.mark.parametrize(
        ("excluded", "node", "wanted"),
        [
            (None, "node-02", "node-02"),
            ("node-[03-04]", "node-02", "node-[03-04],node-02"),
            ("node-[02-04]", "node-03", None),
            ("node-02", "node-02", None),
        ],
    )
    def test_union_keeps_what_the_job_excluded(self, excluded, node, wanted):
        """The node is appended to what the job excluded, as Slurm printed it; nothing to do
        when it is excluded already."""
        assert wanted == excluded_with(excluded, node)


HOSTILE_JOBS = [
    "",
    "train",
    "123 456",
    "123,456",
    "123_[1-3]",
    "123_1,2",
    "-1",
    "--help",
    "123;reboot",
    "$(reboot)",
    "123\n456",
    "1" * 21,
    "123_",
    "123+",
]


class TestArguments:
    @pytest.mark.parametrize("job", ["1", "123", "123_4", "123+1"])
    def test_plain_slurm_job_ids(self, job):
        """A job id, an array task and a het job component are Slurm job ids."""
        assert is_slurm_job_id(job)

    @pytest.mark.parametrize("job", HOSTILE_JOBS)
    async def test_hostile_job_id_is_refused_before_scontrol_runs(self, fake_scontrol, job):
        """Anything but one plain job id (a name, a list, a range, an option, shell syntax)
        runs no scontrol at all and says what was wrong."""
        scontrol, calls = fake_scontrol
        with capture_logs() as logs, pytest.raises(SlurmRefusedError, match="not a Slurm job id"):
            await SlurmJobs(scontrol=str(scontrol)).requeue(job, "node-02")
        assert calls_of(calls) == []
        assert any(e["event"] == "slurm_argument_refused" for e in logs)

    @pytest.mark.parametrize("node", ["ALL", "default", "node-[01-02]", "a,b", "-x", "n 1"])
    async def test_node_that_is_not_one_node_is_refused(self, fake_scontrol, node):
        """The node to exclude is one node's name, never a hostlist or a reserved name."""
        scontrol, calls = fake_scontrol
        with pytest.raises(SlurmRefusedError, match="not a single Slurm node name"):
            await SlurmJobs(scontrol=str(scontrol)).requeue("1", node)
        assert calls_of(calls) == []

    def test_bad_options_fail_at_construction(self):
        """An empty command or a timeout that is not a positive number fails at start-up."""
        with pytest.raises(ValueError, match="scontrol"):
            SlurmJobs(scontrol="")
        with pytest.raises(ValueError, match="timeout_s"):
            SlurmJobs(timeout_s=0)


def replaying_scontrol(tmp_path: Path, shows: list[str], fail: str = "") -> tuple[Path, Path]:
    """An scontrol that records each call and answers ``show`` with the captures ``shows`` in
    turn (the last one again once they run out); the subcommand ``fail`` exits 1."""
    calls = tmp_path / "scontrol.calls"
    count = tmp_path / "shows"
    lines = [
        "#!/bin/sh",
        f"for arg in \"$@\"; do printf '%s\\0' \"$arg\"; done >> '{calls}'",
        f"echo >> '{calls}'",
        f'if [ "$1" = "{fail}" ]; then echo "Invalid node name specified for job 1" >&2; exit 1',
        "fi",
        'if [ "$1" = show ]; then',
        f"  n=$(cat '{count}' 2>/dev/null || echo 0); echo $((n + 1)) > '{count}'",
    ]
    for i, name in enumerate(shows):
        keyword = "if" if i == 0 else "elif"
        lines.append(f"  {keyword} [ \"$n\" -le {i} ]; then cat '{CAPTURES / name}'")
    lines += [f"  else cat '{CAPTURES / shows[-1]}'; fi", "fi"]
    script = tmp_path / "scontrol"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script, calls


def calls_of(calls: Path) -> list[list[str]]:
    if not calls.exists():
        return []
    return [line.split("\0")[:-1] for line in calls.read_text().splitlines()]


@pytest.fixture
def fake_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    return replaying_scontrol(tmp_path, ["show-job-running.txt"])


class TestRequeueSteps:
    async def test_requeuehold_exclude_release_in_that_order(self, tmp_path):
        """A job running on node-01 (submitted with ``-x node-[02-04]``) is read, requeued
        held, made to exclude node-01 besides what it excluded (the hostlist as Slurm printed
        it), released and read back: each step one argument list."""
        scontrol, calls = replaying_scontrol(
            tmp_path, ["show-job-running-anywhere.txt", "show-job-released-anywhere.txt"]
        )
        result = await SlurmJobs(scontrol=str(scontrol)).requeue("1", "node-01")
        assert calls_of(calls) == [
            ["show", "job", "-o", "1"],
            ["requeuehold", "1"],
            ["update", "JobId=1", "ExcNodeList=node-[02-04],node-01"],
            ["release", "1"],
            ["show", "job", "-o", "1"],
        ]
        assert (result.outcome, result.excluded) == (
            RequeueOutcome.REQUEUED,
            "node-[02-04],node-01",
        )
        assert result.after is not None
        assert (result.after.restarts, result.after.held) == (1, False)
        again = tmp_path / "again"
        again.mkdir()
        scontrol, _ = replaying_scontrol(
            again, ["show-job-running-anywhere.txt", "show-job-released-anywhere.txt"]
        )
        done = await SlurmRequeuer(SlurmJobs(scontrol=str(scontrol))).requeue("1", "node-01")
        assert done.ok
        assert "excluding node-01 (ExcNodeList=node-[02-04],node-01)" in done.detail, done.detail

    @pytest.mark.parametrize("node", ["node-03", "node-07"])
    async def test_a_job_not_on_the_node_is_refused(self, tmp_path, node):
        """A job that runs on node-01 is not the job of a rank on another node (one it excludes,
        or one it never mentions): refused before any change, its NodeList named."""
        scontrol, calls = replaying_scontrol(tmp_path, ["show-job-running-excluding.txt"])
        result = await SlurmJobs(scontrol=str(scontrol)).requeue("1", node)
        assert result.outcome is RequeueOutcome.NOT_ON_NODE
        assert calls_of(calls) == [["show", "job", "-o", "1"]]
        done = await SlurmRequeuer(SlurmJobs(scontrol=str(scontrol))).requeue("1", node)
        assert (done.ok, done.refused) == (False, True)
        assert f"does not run on {node} (NodeList=node-01)" in done.detail, done.detail

    async def test_without_a_node_nothing_is_excluded(self, tmp_path):
        """``exclude_node: false`` requeues and releases, and changes no ExcNodeList."""
        scontrol, calls = replaying_scontrol(tmp_path, ["show-job-running.txt"])
        await SlurmJobs(scontrol=str(scontrol)).requeue("1", None)
        assert [c[0] for c in calls_of(calls)] == ["show", "requeuehold", "release", "show"]

    async def test_pending_job_is_refused_and_nothing_runs(self, tmp_path):
        """A job already pending (requeued by Slurm or a person) is not requeued again."""
        scontrol, calls = replaying_scontrol(tmp_path, ["show-job-released.txt"])
        result = await SlurmJobs(scontrol=str(scontrol)).requeue("1", "node-01")
        assert result.outcome is RequeueOutcome.NOT_RUNNING
        assert calls_of(calls) == [["show", "job", "-o", "1"]]

    @pytest.mark.parametrize(
        ("show", "outcome", "words"),
        [
            ("show-job-no-requeue.txt", RequeueOutcome.NOT_REQUEUEABLE, "Requeue=0"),
            ("show-job-salloc.txt", RequeueOutcome.NOT_BATCH, "not a batch job"),
            ("show-job-cancelled.txt", RequeueOutcome.NOT_RUNNING, "is CANCELLED"),
            ("show-job-running.txt", RequeueOutcome.ASKS_FOR_NODE, "ReqNodeList=node-01"),
        ],
    )
    async def test_refusals_run_nothing_and_say_why(self, tmp_path, show, outcome, words):
        """What Slurm would refuse (Requeue=0, salloc, an ended job) or what could never start
        again (it asks for the node by name) is refused before any change, in plain words."""
        scontrol, calls = replaying_scontrol(tmp_path, [show])
        job = parse_job_record(capture(show)).job_id
        result = await SlurmJobs(scontrol=str(scontrol)).requeue(job, "node-01")
        assert result.outcome is outcome
        assert [c[0] for c in calls_of(calls)] == ["show"]
        done = await SlurmRequeuer(SlurmJobs(scontrol=str(scontrol))).requeue(job, "node-01")
        assert (done.ok, done.refused) == (False, True)
        assert words in done.detail, done.detail

    async def test_failed_exclusion_releases_the_job_and_says_so(self, tmp_path):
        """When the update fails after requeuehold the job is released, never left held, and
        the error says it was requeued without the exclusion."""
        scontrol, calls = replaying_scontrol(
            tmp_path, ["show-job-running-anywhere.txt"], fail="update"
        )
        with pytest.raises(SlurmError, match=r"requeued, but setting ExcNodeList=.* failed"):
            await SlurmJobs(scontrol=str(scontrol)).requeue("1", "node-01")
        assert [c[0] for c in calls_of(calls)] == ["show", "requeuehold", "update", "release"]

    async def test_failed_release_says_the_job_is_held_and_what_to_run(self, tmp_path):
        """A release that fails is reported with the command that frees the job."""
        scontrol, _ = replaying_scontrol(
            tmp_path, ["show-job-running-anywhere.txt"], fail="release"
        )
        done = await SlurmRequeuer(SlurmJobs(scontrol=str(scontrol))).requeue("1", "node-01")
        assert (done.ok, done.refused) == (False, False)
        assert "it is held; run scontrol release 1" in done.detail, done.detail

    async def test_unknown_job_is_a_failure_naming_it(self, tmp_path):
        """scontrol's own words reach the outcome."""
        scontrol = tmp_path / "scontrol"
        words = capture("show-job-unknown.stderr").strip()
        scontrol.write_text(f"#!/bin/sh\necho '{words}' >&2\nexit 1\n")
        scontrol.chmod(0o755)
        done = await SlurmRequeuer(SlurmJobs(scontrol=str(scontrol))).requeue("999999", None)
        assert not done.ok
        assert "job '999999'" in done.detail
        assert "Invalid job id specified" in done.detail
