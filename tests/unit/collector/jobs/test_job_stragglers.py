import math
import random
from collections.abc import Callable

import pytest

from collector.jobs.config import JobsConfig
from collector.jobs.state import JobState
from collector.jobs.stragglers import StragglerConfig, StragglerDetector, StragglerStatus

RANKS = 16
SLOW = 1 / (1 - 0.10)


def _rng(seed: int) -> random.Random:
    """Seeded noise, the same on every run."""
    return random.Random(seed)  # noqa: S311 - reproducible noise, not secrets


def _run(
    detector: StragglerDetector,
    steps: int,
    slowdown: Callable[[int, int], float],
    *,
    seed: int = 1,
    ranks: int = RANKS,
    noise: float = 0.02,
    start: int = 0,
) -> list[dict[int, StragglerStatus]]:
    """Feed ``steps`` steps; ``slowdown(step, rank)`` multiplies a 1 s compute time."""
    rng = _rng(seed)
    history = []
    for step in range(start, start + steps):
        times = {r: slowdown(step, r) * (1 + rng.gauss(0, noise)) for r in range(ranks)}
        detector.observe(step, times)
        history.append(detector.stragglers)
    return history


@pytest.mark.parametrize("seed", range(5))
def test_slow_rank_is_flagged_within_30_steps(seed):
    """A rank 1/(1-0.10) slower from step 100 is flagged by step 130, and nobody else is."""
    detector = StragglerDetector()
    _run(detector, 200, lambda s, r: SLOW if r == 5 and s >= 100 else 1.0, seed=seed)
    status = detector.stragglers[5]
    assert 100 <= status.since_step < 130
    assert set(detector.stragglers) == {5}
    assert math.isclose(status.ratio, SLOW, rel_tol=0.03)


@pytest.mark.parametrize("seed", range(3))
def test_slightly_slow_rank_is_never_flagged(seed):
    """A rank 1.05x slower for 500 steps stays under the 10 % margin."""
    detector = StragglerDetector()
    history = _run(detector, 500, lambda _, r: 1.05 if r == 3 else 1.0, seed=seed)
    assert not any(history)
    ratio = detector.ratio(3)
    assert ratio is not None
    assert 1.03 < ratio < 1.07


def test_all_ranks_slowed_together_flags_none():
    """A workload change that slows every rank alike is no straggler."""
    detector = StragglerDetector()
    history = _run(detector, 300, lambda s, _: 1.5 if s >= 100 else 1.0)
    assert not any(history)


def test_hysteresis_keeps_a_rank_flagged_near_the_threshold():
    """Flagged at 1.2x, a rank hovering at 1.08x (under 1.10, over 1.05) stays flagged."""
    detector = StragglerDetector()

    def slowdown(step, rank):
        if rank != 2 or step < 50:
            return 1.0
        return 1.2 if step < 100 else 1.08

    history = _run(detector, 400, slowdown)
    flagged_at = next(i for i, flagged in enumerate(history) if 2 in flagged)
    assert all(2 in flagged for flagged in history[flagged_at:])
    assert detector.stragglers[2].since_step == flagged_at


def test_rank_back_to_normal_is_cleared():
    """Once its window median is back under 1 + margin/2, the rank is cleared."""
    detector = StragglerDetector()
    history = _run(detector, 200, lambda s, r: 1.3 if r == 2 and 50 <= s < 100 else 1.0)
    assert any(2 in flagged for flagged in history[50:100])
    assert 2 not in detector.stragglers
    assert not history[-1]


def test_fewer_than_min_ranks_flags_nothing():
    """With two ranks there is no median worth comparing against."""
    detector = StragglerDetector()
    history = _run(detector, 100, lambda _, r: 2.0 if r == 0 else 1.0, ranks=2)
    assert not any(history)
    assert detector.ratios() == {}
    assert detector.ratio(0) is None


def test_flags_are_cleared_when_ranks_fall_under_min_ranks():
    """Forgetting ranks until fewer than min_ranks remain clears every flag."""
    detector = StragglerDetector()
    _run(detector, 60, lambda _, r: 2.0 if r == 0 else 1.0, ranks=3)
    assert 0 in detector.stragglers
    detector.forget(2)
    detector.observe(60, {0: 2.0, 1: 1.0})
    assert detector.stragglers == {}


def test_a_rank_is_judged_after_half_a_window():
    """A new rank has no ratio until it has window_steps // 2 samples."""
    detector = StragglerDetector(StragglerConfig(window_steps=20))
    for step in range(9):
        detector.observe(step, dict.fromkeys(range(4), 1.0))
    assert detector.ratios() == {}
    detector.observe(9, dict.fromkeys(range(4), 1.0))
    assert detector.ratios() == dict.fromkeys(range(4), 1.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0.0, -1.0])
def test_bad_values_are_ignored(bad):
    """NaN, infinite, zero and negative times leave a rank's window alone."""
    detector = StragglerDetector()
    for step in range(20):
        detector.observe(step, {0: 1.0, 1: 1.0, 2: 1.0})
    detector.observe(20, {0: bad, 1: bad, 2: bad})
    assert detector.ratios() == dict.fromkeys(range(3), 1.0)
    assert detector.stragglers == {}


def test_bad_values_alone_never_make_a_rank():
    """A rank that only ever reports bad values is never judged."""
    detector = StragglerDetector()
    for step in range(20):
        detector.observe(step, {0: 1.0, 1: 1.0, 2: 1.0, 3: math.nan})
    assert detector.ratio(3) is None


def test_missing_ranks_are_judged_on_their_window():
    """A rank missing from a step keeps its window and its flag."""
    detector = StragglerDetector()
    _run(detector, 60, lambda _, r: 1.5 if r == 0 else 1.0)
    detector.observe(60, dict.fromkeys(range(1, RANKS), 1.0))
    assert 0 in detector.stragglers


def test_forget_removes_a_rank():
    """A forgotten rank has no window, no ratio and no flag."""
    detector = StragglerDetector()
    _run(detector, 60, lambda _, r: 1.5 if r == 0 else 1.0)
    assert 0 in detector.stragglers
    detector.forget(0)
    assert 0 not in detector.stragglers
    assert detector.ratio(0) is None
    assert 0 not in detector.ratios()
    detector.forget(99)


def test_since_step_and_steps_follow_the_spell():
    """since_step is the flagging step; steps counts the steps observed since, that one included."""
    detector = StragglerDetector(StragglerConfig(window_steps=4))
    for step in range(10):
        detector.observe(step, {0: 1.0, 1: 1.0, 2: 1.0})
    for step in range(10, 20):
        detector.observe(step, {0: 2.0, 1: 1.0, 2: 1.0})
    status = detector.stragglers[0]
    # The window of 4 has a median over 1.1 once it holds two slow samples: at step 11.
    assert status == StragglerStatus(rank=0, ratio=2.0, since_step=11, steps=9)
    for step in range(20, 30):
        detector.observe(step, {0: 1.0, 1: 1.0, 2: 1.0})
    assert detector.stragglers == {}
    for step in range(30, 33):
        detector.observe(step, {0: 2.0, 1: 1.0, 2: 1.0})
    assert detector.stragglers[0].since_step == 31
    assert detector.stragglers[0].steps == 2


def test_stragglers_is_a_copy():
    """Changing the returned dict does not change the detector."""
    detector = StragglerDetector()
    _run(detector, 60, lambda _, r: 1.5 if r == 0 else 1.0)
    detector.stragglers.clear()
    detector.ratios().clear()
    assert 0 in detector.stragglers
    assert detector.ratios()


@pytest.mark.parametrize(
    "kwargs", [{"margin": 0.0}, {"margin": math.nan}, {"window_steps": 0}, {"min_ranks": 0}]
)
def test_bad_config_is_refused(kwargs):
    """Options that cannot work are refused at construction."""
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        StragglerConfig(**kwargs)


def test_a_workload_change_right_after_a_pause_flags_nobody():
    """All ranks slowing at once while one rank's window holds an old pause: no straggler.

    Judged on raw times, that rank's window median crossed to the new level a step before the
    others' and it was flagged for two steps (bench/correlation.py found it).
    """
    detector = StragglerDetector()
    for step in range(40):
        times = dict.fromkeys(range(8), 0.8 if step < 20 else 0.8 / 0.7)
        if step == 15:
            times[2] = 0.8 * 1.3
        detector.observe(step, times)
        assert detector.stragglers == {}, step


# ---- fail-slow: small sustained slowdowns (collector/jobs/failslow.py) --------------------------

FAIL_SLOW = 1 / (1 - 0.05)  # a rank losing 5 % of its throughput


def _collector_detector() -> StragglerDetector:
    """The straggler detector a job gets in the collector, with the default ``[collector.jobs]``."""
    return JobState("j", JobsConfig(), 0.0, 0.0).stragglers


def _spiky_run(
    detector: StragglerDetector,
    steps: int,
    slowdown: Callable[[int, int], float],
    *,
    seed: int,
    ranks: int = 32,
    noise: float = 0.02,
    pauses: float = 0.01,
) -> list[dict[int, StragglerStatus]]:
    """Like ``_run``, and a share ``pauses`` of rank-steps take 30 % longer (a GC pause)."""
    rng = _rng(seed)
    history = []
    for step in range(steps):
        times = {}
        for rank in range(ranks):
            seconds = slowdown(step, rank) * (1 + rng.gauss(0, noise))
            times[rank] = seconds * 1.3 if rng.random() < pauses else seconds
        detector.observe(step, times)
        history.append(detector.stragglers)
    return history


@pytest.mark.parametrize("seed", range(8))
def test_a_5pct_slow_rank_among_31_is_named_within_30_steps(seed):
    """A rank losing 5 % from step 100 (2 % noise, pauses) is named by step 130, nobody else."""
    detector = _collector_detector()
    history = _spiky_run(
        detector, 200, lambda s, r: FAIL_SLOW if r == 7 and s >= 100 else 1.0, seed=seed
    )
    assert not any(history[:100])
    first = next(i for i, flagged in enumerate(history) if flagged)
    assert 100 <= first < 130
    assert all(set(flagged) <= {7} for flagged in history)
    assert set(detector.stragglers) == {7}
    assert math.isclose(detector.stragglers[7].ratio, FAIL_SLOW, rel_tol=0.02)


@pytest.mark.parametrize("seed", range(3))
def test_the_margin_alone_leaves_a_5pct_slow_rank_unnamed(seed):
    """Without ``shift`` (the margin rule alone), the same 5 % slow rank is never named."""
    detector = StragglerDetector(StragglerConfig(shift=None))
    history = _spiky_run(
        detector, 200, lambda s, r: FAIL_SLOW if r == 7 and s >= 100 else 1.0, seed=seed
    )
    assert not any(history)


@pytest.mark.parametrize("seed", range(5))
def test_every_rank_slowed_5pct_alike_names_nobody(seed):
    """A uniform 5 % slowdown (a workload phase, a slower fabric) is nobody's fault."""
    detector = _collector_detector()
    history = _spiky_run(detector, 300, lambda s, _: FAIL_SLOW if s >= 100 else 1.0, seed=seed)
    assert not any(history)


@pytest.mark.parametrize(
    ("ranks", "noise", "pauses"),
    [(32, 0.05, 0.01), (8, 0.05, 0.01), (32, 0.02, 0.05), (3, 0.03, 0.01)],
)
@pytest.mark.parametrize("seed", range(3))
def test_noisy_ranks_that_are_not_slowed_name_nobody(seed, ranks, noise, pauses):
    """Ranks with 5 % noise, or frequent pauses, or only two peers: nobody named in 600 steps."""
    detector = _collector_detector()
    history = _spiky_run(
        detector, 600, lambda _s, _r: 1.0, seed=seed, ranks=ranks, noise=noise, pauses=pauses
    )
    assert not any(history)


def test_a_rank_slow_in_bursts_is_not_named_while_its_median_is_normal():
    """8 of every 20 steps 30 % longer: its CUSUM alarms but its window median stays normal."""
    detector = _collector_detector()
    history = _run(
        detector, 300, lambda s, r: 1.3 if r == 0 and s % 20 >= 12 else 1.0, ranks=32, noise=0.01
    )
    assert not any(history)


def test_a_fail_slow_rank_that_recovers_is_cleared():
    """Named for a 5 % shift, the rank is cleared once its window median is back near 1."""
    detector = _collector_detector()
    history = _spiky_run(
        detector, 300, lambda s, r: FAIL_SLOW if r == 4 and 50 <= s < 150 else 1.0, seed=2
    )
    assert any(4 in flagged for flagged in history[50:150])
    assert not any(history[200:])


def test_a_fail_slow_spell_keeps_its_first_step():
    """Flagged by the CUSUM, then over the margin, the rank's spell is one spell."""
    detector = _collector_detector()
    history = _spiky_run(
        detector,
        250,
        lambda s, r: 1.0 if r != 3 or s < 50 else FAIL_SLOW if s < 120 else 1.3,
        seed=4,
    )
    spell = [flagged[3] for flagged in history if 3 in flagged]
    assert spell[0].since_step < 120
    assert all(status.since_step == spell[0].since_step for status in spell)
    assert spell[-1].steps == len(spell)


@pytest.mark.parametrize("shift", [0.0, 1.0, -0.1, math.nan])
def test_bad_shift_is_refused(shift):
    """A fail-slow shift that is no share is refused at construction."""
    with pytest.raises(ValueError, match="shift"):
        StragglerConfig(shift=shift)
