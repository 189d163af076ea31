"""reboot_node through the dispatcher: once per incident, one node at a time within the reboot
cooldown, a few nodes in flight at once, under the drain cap for a node still in service, never
in dry run or shadow, a restart never reboots twice; the node is held drained and in repair."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from collector.actions.dispatcher import Dispatcher
from collector.actions.fleet_checks import reboot_refusal
from collector.actions.ports import ActionOutcome
from collector.actions.safety import SafetyConfig
from collector.model.fleet import FleetModel
from collector.model.lifecycle import Lifecycle, State
from collector.store.incidents import ActionRow, FleetActions, IncidentRow
from collector.store.journal import Journal
from collector.store.sqlite import SqliteStore
from fleetwatch.testing import FakeClock, made_up_hello
from rules.model import ActionSpec, Mode, Rule, Scope

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from collector.store.lifecycle import TransitionRow

RULE = Rule(name="gpu_lost", scope=Scope.GPU, when="true")
REBOOT = (ActionSpec("reboot_node", {"reason": ""}),)
DRAIN = (ActionSpec("drain_node", {"resume_on_resolve": True}),)


class RecordingRebooter:
    """A rebooter that answers ``outcome`` and remembers what it was asked."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.outcome = ActionOutcome(ok=True, detail="rebooting")

    async def reboot(self, node: str, reason: str, key: str) -> ActionOutcome:
        self.calls.append((node, reason, key))
        return self.outcome


class RecordingDrainer:
    name = "recording"

    def __init__(self) -> None:
        self.drains: list[str] = []
        self.resumes: list[str] = []

    async def drain(self, node: str, reason: str, key: str) -> ActionOutcome:  # noqa: ARG002
        self.drains.append(node)
        return ActionOutcome(ok=True, detail="drained")

    async def resume(self, node: str, key: str) -> ActionOutcome:  # noqa: ARG002
        self.resumes.append(node)
        return ActionOutcome(ok=True, detail="resumed")


def incident(node: str, gpu: int = 3, ms: int = 5400123) -> IncidentRow:
    target = f"{node}/gpu/{gpu}"
    return IncidentRow(
        id=f"gpu_lost:{target}:{ms}",
        rule="gpu_lost",
        node=node,
        target=target,
        severity="critical",
        phase="firing",
        started_ms=1,
        updated_ms=1,
    )


class Bed:
    """Dispatchers over one real journal, a fleet of ``n1``..``n20`` and a lifecycle."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = FakeClock()
        self.journal = Journal(SqliteStore(tmp_path / "journal.db"))
        self.fleet = FleetModel()
        for i in range(1, 21):
            self.hello(f"n{i}", "boot-1")
        self.rebooter = RecordingRebooter()
        self.drainer = RecordingDrainer()
        self.moves: list[TransitionRow] = []

    def hello(self, node: str, boot: str) -> None:
        self.fleet.on_hello(made_up_hello(node, gpus=4, boot_id=boot), 0.0, self.clock.now())

    def dispatcher(self, **safety: float) -> Dispatcher:
        limits = {"max_drained_nodes": 10, "max_drained_share": 1.0, **safety}
        made = Dispatcher(
            journal=self.journal,
            fleet=self.fleet,
            clock=self.clock,
            safety=SafetyConfig(**limits),  # type: ignore[arg-type]
            drainers=(self.drainer,),
            rebooters=(self.rebooter,),
        )
        made.lifecycle = Lifecycle(self._write, self.clock)
        return made

    async def _write(self, row: TransitionRow) -> None:
        self.moves.append(row)

    async def reboots(self) -> list[tuple[str, str, str, dict[str, object]]]:
        rows = await self.journal.do(lambda s: s.incidents.actions())
        return [
            (r.node, r.state, r.detail, r.params)
            for r in reversed(rows)
            if r.action.endswith("reboot_node")
        ]


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Bed]:
    made = Bed(tmp_path)
    yield made
    await made.journal.close()


class TestReboot:
    async def test_reboots_holds_the_node_and_moves_it_in_repair(self, bed):
        """The reboot is asked for with fleetwatch's reason and key; journaled with the boot it
        was asked from; the node is held drained by the incident, and in repair."""
        dispatcher = bed.dispatcher()
        row = incident("n1")
        await dispatcher.fire(row, RULE, REBOOT)
        assert bed.rebooter.calls == [
            (
                "n1",
                f"fleetwatch: gpu_lost: GPU 3 (incident {row.id})",
                f"reboot_node:{row.id}",
            )
        ]
        ((_, state, detail, params),) = await bed.reboots()
        assert (state, detail, params) == (
            "succeeded",
            "rebooting",
            {"reason": "", "boot_id": "boot-1"},
        )
        assert dispatcher.drained == {"n1": row.id}
        assert dispatcher.lifecycle is not None
        moved = dispatcher.lifecycle.row("n1")
        assert moved is not None
        assert (moved.state, moved.actor, moved.incident) == (
            "in_repair",
            "action:reboot_node",
            row.id,
        )

    async def test_the_rules_reason_words_follow_what(self, bed):
        """``reboot_node: {reason: ...}`` adds the rule's words after the GPU."""
        dispatcher = bed.dispatcher()
        row = incident("n1")
        await dispatcher.fire(row, RULE, (ActionSpec("reboot_node", {"reason": "Xid 79 twice"}),))
        ((_, reason, _),) = bed.rebooter.calls
        assert reason == f"fleetwatch: gpu_lost: GPU 3: Xid 79 twice (incident {row.id})"

    async def test_the_same_incident_never_reboots_twice(self, bed):
        """Fired again (a restart handing it on, an escalation replayed), the key is known."""
        dispatcher = bed.dispatcher()
        await dispatcher.fire(incident("n1"), RULE, REBOOT)
        await dispatcher.fire(incident("n1"), RULE, REBOOT)
        assert len(bed.rebooter.calls) == 1
        assert len(await bed.reboots()) == 1

    async def test_a_failed_reboot_moves_nothing(self, bed):
        """A reboot the scheduler did not take leaves the node where it was, not held."""
        bed.rebooter.outcome = ActionOutcome(ok=False, detail="slurm: reboot of n1 not asked for")
        dispatcher = bed.dispatcher()
        await dispatcher.fire(incident("n1"), RULE, REBOOT)
        ((_, state, _, _),) = await bed.reboots()
        assert state == "failed"
        assert dispatcher.drained == {}
        assert dispatcher.lifecycle is not None
        assert dispatcher.lifecycle.state("n1") == State.IN_SERVICE

    async def test_without_a_rebooter_the_reboot_fails_and_says_so(self, bed):
        """No Slurm and no reboot webhook: failed, naming what is missing."""
        dispatcher = Dispatcher(
            journal=bed.journal, fleet=bed.fleet, clock=bed.clock, safety=SafetyConfig()
        )
        await dispatcher.fire(incident("n1"), RULE, REBOOT)
        ((_, state, detail, _),) = await bed.reboots()
        assert (state, detail) == ("failed", "no reboot adapter is configured")


class TestLimits:
    async def test_a_second_incident_within_the_reboot_cooldown_is_skipped(self, bed):
        """Another fault of the node within ``reboot_cooldown`` reboots nothing; after it, it
        does."""
        dispatcher = bed.dispatcher(reboot_cooldown_s=3600)
        await dispatcher.fire(incident("n1", 3, 1), RULE, REBOOT)
        bed.clock.advance(3000)
        await dispatcher.fire(incident("n1", 2, 2), RULE, REBOOT)
        bed.clock.advance(601)
        await dispatcher.fire(incident("n1", 1, 3), RULE, REBOOT)
        states = [(s, d.split(" ran ")[0]) for _, s, d, _ in await bed.reboots()]
        assert states == [
            ("succeeded", "rebooting"),
            ("skipped", "cooldown: reboot_node"),
            ("succeeded", "rebooting"),
        ]

    async def test_no_more_than_max_rebooting_nodes_in_flight(self, bed):
        """With one reboot in flight and ``max_rebooting_nodes = 1`` the next node's reboot is
        skipped; once the first node says hello from a new boot, there is room again."""
        dispatcher = bed.dispatcher(max_rebooting_nodes=1)
        await dispatcher.fire(incident("n1", ms=1), RULE, REBOOT)
        await dispatcher.fire(incident("n2", ms=2), RULE, REBOOT)
        bed.hello("n1", "boot-2")  # n1 is back
        await dispatcher.fire(incident("n2", ms=3), RULE, REBOOT)
        got = [(n, s, d) for n, s, d, _ in await bed.reboots()]
        assert got == [
            ("n1", "succeeded", "rebooting"),
            (
                "n2",
                "skipped",
                "reboot limit reached: 1 nodes rebooting (n1; max_rebooting_nodes 1)",
            ),
            ("n2", "succeeded", "rebooting"),
        ]

    async def test_a_reboot_that_never_comes_back_stops_counting_after_the_timeout(self, bed):
        """A node that never says hello again holds its place for ``reboot_timeout`` only."""
        dispatcher = bed.dispatcher(max_rebooting_nodes=1, reboot_timeout_s=1800)
        await dispatcher.fire(incident("n1", ms=1), RULE, REBOOT)
        bed.clock.advance(1799)
        await dispatcher.fire(incident("n2", ms=2), RULE, REBOOT)
        bed.clock.advance(1)
        await dispatcher.fire(incident("n2", ms=3), RULE, REBOOT)
        assert [s for _, s, _, _ in await bed.reboots()] == ["succeeded", "skipped", "succeeded"]

    async def test_a_node_in_service_needs_room_under_the_drain_cap(self, bed):
        """The cap full, a reboot of a node still in service is skipped (it would take the
        node out); one of the node fleetwatch holds drained runs (it takes nothing more)."""
        dispatcher = bed.dispatcher(max_drained_nodes=1)
        held = incident("n1", ms=1)
        await dispatcher.fire(held, RULE, DRAIN)
        await dispatcher.fire(incident("n2", ms=2), RULE, REBOOT)
        await dispatcher.fire(incident("n1", ms=3), RULE, REBOOT)
        got = [(n, s, d) for n, s, d, _ in await bed.reboots()]
        assert got == [
            (
                "n2",
                "skipped",
                (
                    "drain cap reached: a reboot takes n2 out of service too; 1 of 20 nodes "
                    "drained or draining (cap 1)"
                ),
            ),
            ("n1", "succeeded", "rebooting"),
        ]
        assert [c[0] for c in bed.rebooter.calls] == ["n1"]

    async def test_a_rebooted_node_counts_under_the_drain_cap(self, bed):
        """A reboot drained its node: the next drain finds the cap full."""
        dispatcher = bed.dispatcher(max_drained_nodes=1)
        await dispatcher.fire(incident("n1", ms=1), RULE, REBOOT)
        await dispatcher.fire(incident("n2", ms=2), RULE, DRAIN)
        rows = await bed.journal.do(lambda s: s.incidents.actions(node="n2"))
        assert [(r.state, r.detail) for r in rows] == [
            ("deferred", "drain cap reached: 1 of 20 nodes drained or draining (cap 1)")
        ]

    @pytest.mark.parametrize(
        ("rule", "safety", "state"),
        [
            (Rule(name="gpu_lost", scope=Scope.GPU, when="true", dry_run=True), {}, "dry_run"),
            (RULE, {"dry_run": True}, "dry_run"),
            (Rule(name="gpu_lost", scope=Scope.GPU, when="true", mode=Mode.SHADOW), {}, "shadow"),
        ],
    )
    async def test_dry_run_and_shadow_reboot_nothing(self, bed, rule, safety, state):
        """Journaled as it would run; no rebooter is called, the node is neither held nor
        moved."""
        dispatcher = bed.dispatcher(**safety)
        await dispatcher.fire(incident("n1"), rule, REBOOT)
        assert bed.rebooter.calls == []
        ((_, got, _, _),) = await bed.reboots()
        assert got == state
        assert dispatcher.drained == {}
        assert dispatcher.lifecycle is not None
        assert dispatcher.lifecycle.state("n1") == State.IN_SERVICE


class TestRestart:
    async def test_a_restart_keeps_the_cooldown_and_what_is_in_flight(self, bed):
        """A new dispatcher on the same journal: the rebooted node is still held, within its
        cooldown, and in flight (its boot has not changed)."""
        first = bed.dispatcher(max_rebooting_nodes=1)
        await first.start()
        await first.fire(incident("n1", ms=1), RULE, REBOOT)
        bed.clock.advance(60)
        again = bed.dispatcher(max_rebooting_nodes=1)
        await again.start()
        assert again.drained == {"n1": incident("n1", ms=1).id}
        await again.fire(incident("n1", ms=2), RULE, REBOOT)
        await again.fire(incident("n2", ms=3), RULE, REBOOT)
        got = [(n, s, d.split(" ran ")[0].split(":")[0]) for n, s, d, _ in await bed.reboots()]
        assert got == [
            ("n1", "succeeded", "rebooting"),
            ("n1", "skipped", "cooldown"),
            ("n2", "skipped", "reboot limit reached"),
        ]
        assert len(bed.rebooter.calls) == 1

    async def test_a_reboot_a_crash_cut_short_is_failed_never_run_again(self, bed):
        """Journaled as running when the collector died: it may have been asked for, so it is
        marked failed (saying where to look), and the incident handed on again runs nothing."""
        row = incident("n1")
        cut = ActionRow(
            idempotency_key=f"reboot_node:{row.id}",
            incident_id=row.id,
            action="reboot_node",
            node="n1",
            target=row.target,
            state="running",
            created_ms=int(bed.clock.now() * 1000),
            params={"reason": "", "boot_id": "boot-1"},
        )
        await bed.journal.do(lambda s: s.incidents.add_action(cut))
        dispatcher = bed.dispatcher()
        await dispatcher.start()
        await dispatcher.fire(row, RULE, REBOOT)
        ((_, state, detail, _),) = await bed.reboots()
        assert state == "failed"
        assert detail == (
            "collector restarted before the outcome was known: n1 may be rebooting "
            "(scontrol show node n1)"
        )
        assert bed.rebooter.calls == []

    async def test_a_resolution_does_not_resume_a_rebooted_node(self, bed):
        """``resume_on_resolve`` gives a drained node back; one rebooted since waits for its
        re-qualification instead."""
        dispatcher = bed.dispatcher()
        row = incident("n1")
        await dispatcher.fire(row, RULE, DRAIN + REBOOT)
        rule = Rule(name="gpu_lost", scope=Scope.GPU, when="true", actions=DRAIN + REBOOT)
        await dispatcher.resolve(row, rule)
        assert bed.drainer.resumes == []
        assert dispatcher.drained == {"n1": row.id}


def fleet(**changes: object) -> FleetActions:
    values: dict[str, object] = {
        "drained": {},
        "draining": frozenset(),
        "resetting": frozenset(),
        "drains_since": 0,
        "last_ms": {},
        "breaker_open_until_ms": 0,
        "nodes": 10,
    }
    values.update(changes)
    return FleetActions(**values)  # type: ignore[arg-type]


class TestFleetWide:
    """The same limits over a shared journal, against every collector's reboots."""

    def decide(self, view: FleetActions, **safety: float) -> tuple[str, str, int]:
        return reboot_refusal(
            incident("n1"),
            view,
            now_ms=10_000_000,
            safety=SafetyConfig(**safety),  # type: ignore[arg-type]
            cap=2,
            size=10,
        )

    def test_room_everywhere_plans_it(self):
        """Nothing rebooting, nothing drained: planned."""
        assert self.decide(fleet()) == ("planned", "", 0)

    def test_a_reboot_of_the_node_running_anywhere(self):
        """Another collector is rebooting n1 now: skipped."""
        state, why, _ = self.decide(fleet(rebooting_now=frozenset({"n1"})))
        assert (state, why) == ("skipped", "n1 is being rebooted for another incident")

    def test_the_cooldown_counts_every_collectors_reboots(self):
        """A reboot of n1 by any collector within ``reboot_cooldown``: skipped."""
        view = fleet(last_ms={("reboot_node", "n1"): 10_000_000 - 60_000})
        state, why, _ = self.decide(view)
        assert (state, why) == ("skipped", "cooldown: reboot_node ran on n1 60 s ago")

    def test_max_rebooting_nodes_fleet_wide(self):
        """Two nodes rebooting anywhere, at most two: skipped."""
        state, why, _ = self.decide(fleet(rebooting=frozenset({"n2", "n3"})))
        assert state == "skipped"
        assert why.startswith("reboot limit reached: 2 nodes rebooting (n2, n3;")

    def test_the_drain_cap_for_a_node_in_service(self):
        """The cap full of other collectors' drains: skipped; a held node: planned."""
        view = fleet(drained={"n2": "a", "n3": "b"})
        assert self.decide(view)[0] == "skipped"
        held = fleet(drained={"n1": "x", "n3": "b"})
        assert self.decide(held) == ("planned", "", 0)
