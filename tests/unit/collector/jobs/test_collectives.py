"""Where a hung job's ranks stand in their collectives, by their Flight Recorders (issue 40)."""

from __future__ import annotations

from collector.jobs.collectives import Standing, localise_collectives


def at(enqueued: int, *ops: str, completed: int | None = None, group: str = "0") -> Standing:
    """A rank at ``enqueued`` whose last collectives were ``ops`` (the last one is #enqueued)."""
    recent = tuple((enqueued - len(ops) + 1 + i, op) for i, op in enumerate(ops))
    done = enqueued - 1 if completed is None else completed
    name = "default_pg" if group == "0" else f"tp{group}"
    return Standing(group, name, enqueued, done, recent)


def test_a_rank_that_never_entered_the_collective_the_others_wait_in_is_named():
    found = localise_collectives(
        {
            0: [at(6, "all_reduce")],
            1: [at(6, "all_reduce")],
            2: [at(5, "all_reduce")],
            3: [at(6, "all_reduce")],
        }
    )
    assert found is not None
    assert found.suspects == (
        (
            2,
            (
                "flight recorder: never entered all_reduce #6 of default_pg that 3 ranks wait in "
                "(its last: all_reduce #5 of default_pg)"
            ),
        ),
    )
    assert found.verdict.startswith("rank 2 never entered all_reduce #6 of default_pg")
    assert found.reporting == (0, 1, 2, 3)


def test_a_rank_in_another_collective_is_out_of_step():
    found = localise_collectives(
        {
            0: [at(6, "all_reduce")],
            1: [at(6, "all_reduce")],
            2: [at(6, "broadcast")],
            3: [at(6, "all_reduce")],
        }
    )
    assert found is not None
    assert found.suspects == (
        (
            2,
            (
                "flight recorder: entered broadcast #6 of default_pg while 3 ranks entered "
                "all_reduce #6 (out of step)"
            ),
        ),
    )


def test_a_rank_whose_last_completed_is_behind_holds_the_others():
    found = localise_collectives(
        {r: [at(9, "all_reduce", completed=8 if r != 1 else 6)] for r in range(4)}
    )
    assert found is not None
    assert found.suspects == (
        (1, "flight recorder: its last completed collective of default_pg is #6, the others' #8"),
    )


def test_every_rank_in_the_same_collective_blames_nobody():
    found = localise_collectives({r: [at(6, "all_reduce")] for r in range(4)})
    assert found is not None
    assert found.suspects == ()
    assert found.verdict == (
        "the Flight Recorders show no rank out of step "
        "(default_pg: every rank entered all_reduce #6 of default_pg)"
    )


def test_a_rank_that_claims_to_be_far_ahead_blames_nobody_else():
    """A rank's word is its own: one claiming #1000 while the rest agree on #6 waits for them."""
    found = localise_collectives(
        {
            0: [at(1000, "all_reduce")],
            1: [at(6, "all_reduce")],
            2: [at(6, "all_reduce")],
            3: [at(6, "all_reduce")],
        }
    )
    assert found is not None
    assert found.suspects == ()


def test_two_ranks_at_odds_name_the_one_behind():
    found = localise_collectives({0: [at(6, "all_reduce")], 1: [at(5, "all_reduce")]})
    assert found is not None
    assert [r for r, _ in found.suspects] == [1]
    assert "that rank waits in" in found.suspects[0][1]


def test_each_process_group_is_judged_by_its_own_members():
    """Tensor-parallel groups {0,1} and {2,3}: rank 3 is behind in its group; the default group
    agrees; a rank alone in a group has nobody to be out of step with."""
    found = localise_collectives(
        {
            0: [at(6, "all_reduce"), at(40, "all_gather", group="1")],
            1: [at(6, "all_reduce"), at(40, "all_gather", group="1")],
            2: [at(6, "all_reduce"), at(12, "all_gather", group="2")],
            3: [at(6, "all_reduce"), at(11, "all_gather", group="2"), at(3, "x", group="9")],
        }
    )
    assert found is not None
    assert [r for r, _ in found.suspects] == [3]
    assert "all_gather #12 of tp2" in found.suspects[0][1]


def test_ranks_without_a_recorder_have_no_vote_and_none_at_all_is_none():
    assert localise_collectives({0: [], 1: []}) is None
    found = localise_collectives({0: [at(6, "all_reduce")], 1: [], 2: [at(6, "all_reduce")]})
    assert found is not None
    assert found.reporting == (0, 2)
    assert found.suspects == ()


def test_a_rank_that_entered_nothing_yet_is_behind():
    found = localise_collectives(
        {
            0: [at(1, "all_reduce")],
            1: [at(1, "all_reduce")],
            2: [Standing("0", "default_pg", -1, -1, ())],
        }
    )
    assert found is not None
    assert found.suspects[0][0] == 2
    assert "(its last: none in default_pg)" in found.suspects[0][1]


def test_several_out_of_step_are_counted_in_the_verdict():
    found = localise_collectives(
        {
            0: [at(6, "all_reduce")],
            1: [at(6, "all_reduce")],
            2: [at(5, "all_reduce")],
            3: [at(4, "all_reduce")],
            4: [at(6, "all_reduce")],
        }
    )
    assert found is not None
    assert [r for r, _ in found.suspects] == [2, 3]
    assert found.verdict.startswith("ranks 2, 3 out of step: rank 2 never entered")
