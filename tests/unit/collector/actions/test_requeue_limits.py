"""requeue_job through the dispatcher: off unless switched on, once per incident and per job,
under the fleet's requeue limit, never in dry run, journaled with its job and counted."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from collector.actions.config import parse_actions
from collector.actions.dispatcher import Dispatcher
from collector.actions.ports import ActionOutcome, refused
from collector.actions.safety import SafetyConfig
from collector.exceptions import ConfigError
from collector.model.fleet import FleetModel
from collector.store.incidents import IncidentRow
from collector.store.journal import Journal
from collector.store.sqlite import SqliteStore
from fleetwatch.testing import FakeClock
from rules.model import ActionSpec, Rule, Scope

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

RULE = Rule(name="gpu_hang_culprit", scope=Scope.GPU, when="true")
REQUEUE = (ActionSpec("requeue_job", {"exclude_node": True}),)
JOBS = {
    ("n1", 0): "101",
    ("n1", 1): "101",
    ("n1", 2): "102",
    ("n2", 0): "202",
    ("n3", 0): "303",
}


class RecordingRequeuer:
    """A requeuer that answers ``outcome`` and remembers what it was asked."""

    def __init__(self, outcome: ActionOutcome | None = None) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.outcome = outcome or ActionOutcome(ok=True, detail="slurm: requeued")

    async def requeue(self, job: str, node: str | None) -> ActionOutcome:
        self.calls.append((job, node))
        return self.outcome


def incident(node: str, gpu: int, ms: int = 5400123) -> IncidentRow:
    target = f"{node}/gpu/{gpu}"
    return IncidentRow(
        id=f"gpu_hang_culprit:{target}:{ms}",
        rule="gpu_hang_culprit",
        node=node,
        target=target,
        severity="critical",
        phase="firing",
        started_ms=1,
        updated_ms=1,
    )


class Bed:
    """A dispatcher over a real journal, the job book's answers in ``JOBS``."""

    def __init__(self, tmp_path: Path, clock: FakeClock) -> None:
        self.tmp_path = tmp_path
        self.clock = clock
        self.journal = Journal(SqliteStore(tmp_path / "journal.db"))
        self.requeuer = RecordingRequeuer()
        self.on = True

    def dispatcher(self, safety: SafetyConfig | None = None) -> Dispatcher:
        return Dispatcher(
            journal=self.journal,
            fleet=FleetModel(),
            clock=self.clock,
            safety=safety or SafetyConfig(),
            requeuer=self.requeuer,
            gpu_job=lambda node, index: JOBS.get((node, index)),
            requeue_on=lambda: self.on,
        )

    async def actions(self) -> list[tuple[str, str, str, dict[str, object]]]:
        rows = await self.journal.do(lambda s: s.incidents.actions())
        return [(r.action, r.state, r.detail, r.params) for r in reversed(rows)]


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Bed]:
    made = Bed(tmp_path, FakeClock())
    yield made
    await made.journal.close()


class TestRequeueSwitch:
    async def test_off_by_default_skips_and_says_so(self, bed):
        """With requeue off, nothing reaches Slurm; the journal says why, with the job."""
        bed.on = False
        dispatcher = bed.dispatcher()
        await dispatcher.start()
        await dispatcher.fire(incident("n1", 0), RULE, REQUEUE)
        assert bed.requeuer.calls == []
        ((action, state, detail, params),) = await bed.actions()
        assert (action, state, params["job"]) == ("requeue_job", "skipped", "101")
        assert detail.startswith("requeue is off")
        assert [(a, o) for (a, o, _), _, _ in dispatcher.tally.snapshot()] == [
            ("requeue_job", "skipped")
        ]

    async def test_without_a_requeuer_it_is_off(self, tmp_path):
        """A dispatcher given no requeuer never requeues."""
        journal = Journal(SqliteStore(tmp_path / "journal.db"))
        try:
            dispatcher = Dispatcher(
                journal=journal,
                fleet=FleetModel(),
                clock=FakeClock(),
                safety=SafetyConfig(),
                gpu_job=lambda _n, _i: "101",
            )
            await dispatcher.fire(incident("n1", 0), RULE, REQUEUE)
            (row,) = await journal.do(lambda s: s.incidents.actions())
            assert (row.state, row.detail.startswith("requeue is off")) == ("skipped", True)
        finally:
            await journal.close()

    async def test_on_requeues_the_gpus_job_off_its_node(self, bed):
        """The job of the rank on the incident's GPU is requeued, excluding the node."""
        dispatcher = bed.dispatcher()
        await dispatcher.fire(incident("n1", 0), RULE, REQUEUE)
        assert bed.requeuer.calls == [("101", "n1")]
        ((_, state, detail, params),) = await bed.actions()
        assert (state, detail, params) == (
            "succeeded",
            "slurm: requeued",
            {"exclude_node": True, "job": "101"},
        )

    async def test_exclude_node_false_names_no_node(self, bed):
        """``exclude_node: false`` requeues without excluding anything."""
        await bed.dispatcher().fire(
            incident("n1", 0), RULE, (ActionSpec("requeue_job", {"exclude_node": False}),)
        )
        assert bed.requeuer.calls == [("101", None)]

    async def test_no_job_on_the_gpu_is_skipped(self, bed):
        """A GPU no known rank runs on has no job to requeue."""
        await bed.dispatcher().fire(incident("n9", 4), RULE, REQUEUE)
        assert bed.requeuer.calls == []
        ((_, state, detail, _),) = await bed.actions()
        assert state == "skipped"
        assert detail.startswith("no Slurm job is known on n9/gpu/4: requeue_job requeues only")

    async def test_dry_run_runs_nothing(self, bed):
        """Dry run journals the requeue as dry_run and asks Slurm for nothing."""
        await bed.dispatcher(SafetyConfig(dry_run=True)).fire(incident("n1", 0), RULE, REQUEUE)
        assert bed.requeuer.calls == []
        ((_, state, _, _),) = await bed.actions()
        assert state == "dry_run"


class TestRequeueOnce:
    async def test_the_same_incident_never_requeues_twice(self, bed):
        """A second firing of the same incident (a replayed transition) runs nothing."""
        dispatcher = bed.dispatcher()
        await dispatcher.fire(incident("n1", 0), RULE, REQUEUE)
        await dispatcher.fire(incident("n1", 0), RULE, REQUEUE)
        assert bed.requeuer.calls == [("101", "n1")]

    async def test_another_incident_of_the_same_job_is_skipped(self, bed):
        """Two culprit GPUs of one job fire two incidents; the job is requeued once."""
        dispatcher = bed.dispatcher()
        await dispatcher.fire(incident("n1", 0), RULE, REQUEUE)
        bed.clock.advance(60)
        await dispatcher.fire(incident("n1", 1), RULE, REQUEUE)
        assert bed.requeuer.calls == [("101", "n1")]
        second = (await bed.actions())[1]
        assert second[1] == "skipped"
        assert second[2].startswith("job 101 was requeued 60 s ago for gpu_hang_culprit:n1/gpu/0")

    async def test_the_job_may_be_requeued_again_after_the_cooldown(self, bed):
        """Past ``requeue_cooldown`` a new incident of the job requeues it again."""
        dispatcher = bed.dispatcher(SafetyConfig(requeue_cooldown_s=600))
        await dispatcher.fire(incident("n1", 0), RULE, REQUEUE)
        bed.clock.advance(601)
        await dispatcher.fire(incident("n1", 1, ms=6000000), RULE, REQUEUE)
        assert bed.requeuer.calls == [("101", "n1"), ("101", "n1")]

    async def test_a_restart_remembers_the_job(self, bed):
        """The journal tells a restarted collector which job it requeued, and when."""
        await bed.dispatcher().fire(incident("n1", 0), RULE, REQUEUE)
        again = bed.dispatcher()
        await again.start()
        await again.fire(incident("n1", 1), RULE, REQUEUE)
        assert bed.requeuer.calls == [("101", "n1")]

    async def test_a_refused_requeue_does_not_count(self, bed):
        """A requeue Slurm would not take ran nothing: a later incident of the job may try."""
        bed.requeuer.outcome = refused("slurm: job 101 is PENDING")
        dispatcher = bed.dispatcher()
        await dispatcher.fire(incident("n1", 0), RULE, REQUEUE)
        await dispatcher.fire(incident("n1", 1), RULE, REQUEUE)
        assert len(bed.requeuer.calls) == 2
        assert [s for _, s, _, _ in await bed.actions()] == ["refused", "refused"]


class TestRequeueLimit:
    async def test_at_most_max_requeues_in_the_window(self, bed):
        """Past ``max_requeues`` within ``requeue_window`` a requeue is skipped (it never
        waits); once the window has passed, requeues run again."""
        dispatcher = bed.dispatcher(SafetyConfig(max_requeues=2, requeue_window_s=3600))
        await dispatcher.fire(incident("n1", 0), RULE, REQUEUE)
        await dispatcher.fire(incident("n2", 0), RULE, REQUEUE)
        await dispatcher.fire(incident("n3", 0), RULE, REQUEUE)
        assert [job for job, _ in bed.requeuer.calls] == ["101", "202"]
        third = (await bed.actions())[2]
        assert (third[1], third[2]) == (
            "skipped",
            "requeue limit reached: 2 requeues in the last 3600 s (max_requeues 2)",
        )
        assert dispatcher.waiting == {}
        bed.clock.advance(3601)
        await dispatcher.fire(incident("n3", 0, ms=9000000), RULE, REQUEUE)
        assert [job for job, _ in bed.requeuer.calls] == ["101", "202", "303"]

    async def test_two_jobs_on_one_node_are_both_requeued(self, bed):
        """The node cooldown is for drains and resets: a second job held by the same bad node
        is requeued too (a requeue's limits are per job and per fleet)."""
        dispatcher = bed.dispatcher(SafetyConfig(node_cooldown_s=3600))
        await dispatcher.fire(incident("n1", 0), RULE, REQUEUE)
        await dispatcher.fire(incident("n1", 2), RULE, REQUEUE)
        assert bed.requeuer.calls == [("101", "n1"), ("102", "n1")]


class TestRequeueConfig:
    def test_off_unless_asked_for(self):
        """``requeue`` is false by default and true when the table says so."""
        assert parse_actions(None).slurm.requeue is False
        assert parse_actions({"slurm": {"requeue": True}}).slurm.requeue is True

    def test_limits_are_read(self):
        """The requeue limits are safety keys of ``[collector.actions]``."""
        safety = parse_actions(
            {"max_requeues": 2, "requeue_window": 600, "requeue_cooldown": 7200}
        ).safety
        assert (safety.max_requeues, safety.requeue_window_s, safety.requeue_cooldown_s) == (
            2,
            600,
            7200,
        )

    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            ({"slurm": {"requeue": "true"}}, "actions.slurm.requeue must be true or false"),
            ({"slurm": {"requeue": 1}}, "actions.slurm.requeue must be true or false"),
            ({"slurm": {"requeu": True}}, "actions.slurm has no key.*requeu.*takes enabled"),
            ({"max_requeues": 1.5}, "actions.max_requeues must be an integer"),
            ({"max_requeues": -1}, "actions.max_requeues"),
            ({"requeue_window": 0}, "actions.requeue_window"),
            ({"requeue_cooldown": "1d"}, "actions.requeue_cooldown"),
        ],
    )
    def test_bad_values_name_the_key(self, raw, message):
        """A wrong type or value stops the start, naming the key."""
        with pytest.raises(ConfigError, match=message):
            parse_actions(raw)
