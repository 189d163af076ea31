"""The lifecycle state machine: which moves it allows, how it journals them, what it counts."""

import asyncio

import pytest

from collector.model.lifecycle import Lifecycle, LifecycleError, State
from collector.store.lifecycle import TransitionRow
from fleetwatch.testing import FakeClock


def keeper() -> tuple[Lifecycle, list[TransitionRow]]:
    written: list[TransitionRow] = []

    async def write(row: TransitionRow) -> None:
        await asyncio.sleep(0)  # the journal answers later, as the writer thread does
        written.append(row)

    return Lifecycle(write, FakeClock(start_unix=1000.0), "c1"), written


class TestMoves:
    def test_a_node_never_moved_is_in_service(self):
        lifecycle, _ = keeper()
        assert lifecycle.state("n1") == State.IN_SERVICE
        assert lifecycle.row("n1") is None

    def test_hooks_moves_that_do_not_fit_are_ignored(self):
        """An incident resolving on a drained node does not put it back in service; a second
        drain of a drained node is no move."""
        lifecycle, _ = keeper()
        assert lifecycle.move("n1", State.DRAINED, actor="action:drain_node") is not None
        assert lifecycle.move("n1", State.DRAINED, actor="action:drain_node") is None
        assert lifecycle.move("n1", State.SUSPECT, actor="rule:r") is None
        assert lifecycle.state("n1") == State.DRAINED

    def test_a_person_s_move_that_does_not_fit_says_why(self):
        lifecycle, _ = keeper()
        lifecycle.move("n1", State.RMA, actor="person:ana", strict=True)
        with pytest.raises(LifecycleError, match="n1 is rma: it cannot go to suspect"):
            lifecycle.move("n1", State.SUSPECT, actor="person:ana", strict=True)

    def test_a_person_may_take_a_node_into_repair_or_rma_from_anywhere(self):
        lifecycle, _ = keeper()
        for state in (State.SUSPECT, State.IN_REPAIR, State.RMA, State.IN_REPAIR):
            lifecycle.move("n1", state, actor="person:ana", strict=True)
        assert lifecycle.state("n1") == State.IN_REPAIR
        assert dict(lifecycle.moves) == {
            ("in_service", "suspect"): 1,
            ("suspect", "in_repair"): 1,
            ("in_repair", "rma"): 1,
            ("rma", "in_repair"): 1,
        }

    def test_the_row_says_who_when_and_why_and_cuts_a_long_reason(self):
        lifecycle, _ = keeper()
        row = lifecycle.move(
            "n1", State.DRAINED, actor="action:drain_node", incident="i1", reason="x" * 900
        )
        assert row is not None
        assert (row.previous, row.at_ms, row.collector, len(row.reason)) == (
            "in_service",
            1_000_000,
            "c1",
            500,
        )

    def test_back_in_service_is_told(self):
        lifecycle, _ = keeper()
        told: list[str] = []
        lifecycle.back_in_service.append(told.append)
        lifecycle.move("n1", State.DRAINED, actor="a")
        lifecycle.move("n1", State.IN_SERVICE, actor="person:ana")
        assert told == ["n1"]

    def test_counts_cover_the_fleet_and_the_moved(self):
        lifecycle, _ = keeper()
        lifecycle.load([TransitionRow("gone", "rma", "in_repair", 1, "person:ana")])
        lifecycle.move("n2", State.SUSPECT, actor="rule:r")
        counts = lifecycle.counts(["n1", "n2", "n3"])
        assert (counts[State.IN_SERVICE], counts[State.SUSPECT], counts[State.RMA]) == (2, 1, 1)


class TestJournal:
    async def test_moves_are_journaled_in_the_order_made(self):
        lifecycle, written = keeper()
        lifecycle.start()
        try:
            lifecycle.move("n1", State.SUSPECT, actor="rule:r")
            lifecycle.move("n1", State.DRAINED, actor="action:drain_node")
            lifecycle.move("n2", State.IN_REPAIR, actor="person:ana", strict=True)
            await lifecycle.idle()
        finally:
            await lifecycle.stop()
        assert [(r.node, r.state) for r in written] == [
            ("n1", "suspect"),
            ("n1", "drained"),
            ("n2", "in_repair"),
        ]

    async def test_a_journal_that_fails_stops_nothing(self):
        """The move holds in memory, the failure is counted, the next move is journaled."""
        written: list[TransitionRow] = []

        async def write(row: TransitionRow) -> None:
            if row.node == "bad":
                raise OSError("disk full")
            written.append(row)

        lifecycle = Lifecycle(write, FakeClock(start_unix=0.0))
        lifecycle.start()
        try:
            lifecycle.move("bad", State.SUSPECT, actor="rule:r")
            lifecycle.move("good", State.SUSPECT, actor="rule:r")
            await lifecycle.idle()
        finally:
            await lifecycle.stop()
        assert lifecycle.state("bad") == State.SUSPECT
        assert lifecycle.write_failures == 1
        assert [r.node for r in written] == ["good"]
