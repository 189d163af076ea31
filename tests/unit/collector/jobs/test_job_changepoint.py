import math
import random
from collections.abc import Callable

import pytest

from collector.jobs.changepoint import Drop, DropConfig, DropDetector

BASE = 10_000.0  # tokens/s


def _rng(seed: int) -> random.Random:
    """Seeded noise, the same on every run."""
    return random.Random(seed)  # noqa: S311 - reproducible noise, not secrets


def _run(
    level: Callable[[int], float],
    steps: int,
    *,
    seed: int = 1,
    noise: float = 0.02,
    config: DropConfig | None = None,
    detector: DropDetector | None = None,
    start: int = 0,
) -> tuple[DropDetector, Drop | None]:
    """Feed ``level(step)`` x 2 % gaussian noise; return the detector and its first drop."""
    rng = _rng(seed)
    detector = detector if detector is not None else DropDetector(config)
    first = None
    for step in range(start, start + steps):
        detector.observe(step, BASE * level(step) * (1 + rng.gauss(0, noise)))
        if first is None and detector.active is not None:
            first = detector.active
    return detector, first


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("share", [0.10, 0.20, 0.50])
def test_drops_are_found_fast_with_a_sharp_onset(share, seed):
    """Drops of 10, 20 and 50 % at step 200 are found within 15 steps, onset within 5."""
    detector, drop = _run(lambda s: 1 - share if s >= 200 else 1.0, 300, seed=seed)
    assert drop is not None
    assert 200 <= drop.detected_step <= 215
    assert abs(drop.onset_step - 200) <= 5
    assert math.isclose(drop.baseline, BASE, rel_tol=0.02)
    assert detector.drops == 1
    active = detector.active
    assert active is not None
    assert math.isclose(active.current, BASE * (1 - share), rel_tol=0.02)
    assert math.isclose(active.share, share, abs_tol=0.02)


@pytest.mark.parametrize("seed", range(3))
def test_noise_alone_raises_no_alarm(seed):
    """5,000 steps of 2 % noise: no drop."""
    detector, drop = _run(lambda _: 1.0, 5000, seed=seed)
    assert drop is None
    assert detector.drops == 0


def test_noisier_series_stays_quiet():
    """At 5 % noise the scale adapts: 3,000 steps raise no alarm."""
    detector, _ = _run(lambda _: 1.0, 3000, noise=0.05)
    assert detector.drops == 0


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("length", [1, 3])
def test_short_dips_raise_no_alarm(length, seed):
    """A checkpoint step at a third of the throughput, for 1 or 3 steps, is no drop."""
    _, drop = _run(lambda s: 0.34 if 200 <= s < 200 + length else 1.0, 400, seed=seed)
    assert drop is None


def test_periodic_checkpoint_dips_raise_no_alarm():
    """A 3-step dip every 50 steps for 3,000 steps raises no alarm."""
    detector, _ = _run(lambda s: 0.34 if s % 50 < 3 else 1.0, 3000)
    assert detector.drops == 0


@pytest.mark.parametrize("seed", range(3))
def test_shift_below_min_drop_raises_no_alarm(seed):
    """A 3 % shift is under the 5 % worth reporting: the level just follows it."""
    detector, drop = _run(lambda s: 0.97 if s >= 200 else 1.0, 1500, seed=seed)
    assert drop is None
    baseline = detector.baseline
    assert baseline is not None
    assert math.isclose(baseline, BASE * 0.97, rel_tol=0.01)


def test_recovery_ends_the_drop():
    """Back to the old level, the drop ends and the baseline is unchanged."""
    detector, drop = _run(lambda s: 0.8 if 200 <= s < 260 else 1.0, 400)
    assert drop is not None
    assert detector.active is None
    assert detector.drops == 1
    baseline = detector.baseline
    assert baseline is not None
    assert math.isclose(baseline, BASE, rel_tol=0.01)


def test_recovery_is_seen_within_a_few_steps():
    """The drop ends within 10 steps of the recovery."""
    detector = DropDetector()
    rng = _rng(2)
    ended = None
    for step in range(400):
        level = 0.8 if 200 <= step < 260 else 1.0
        detector.observe(step, BASE * level * (1 + rng.gauss(0, 0.02)))
        if step == 259:
            assert detector.active is not None
        if step >= 260 and ended is None and detector.active is None:
            ended = step
    assert ended is not None
    assert ended < 270


def test_long_drop_becomes_the_new_baseline():
    """After accept_after_steps past the onset, the lower level is the new normal."""
    config = DropConfig(accept_after_steps=100)
    detector = DropDetector(config)
    rng = _rng(3)
    onset = None
    for step in range(600):
        level = 0.8 if step >= 200 else 1.0
        detector.observe(step, BASE * level * (1 + rng.gauss(0, 0.02)))
        if detector.active is not None:
            onset = detector.active.onset_step
            assert step - onset < 100
    assert onset is not None
    assert detector.active is None
    assert detector.drops == 1
    baseline = detector.baseline
    assert baseline is not None
    assert math.isclose(baseline, BASE * 0.8, rel_tol=0.01)


def test_default_acceptance_is_500_steps():
    """With the defaults, a drop is active 499 steps past its onset and gone at 500."""
    detector = DropDetector()
    rng = _rng(5)
    last_active = None
    for step in range(1000):
        detector.observe(step, BASE * (0.8 if step >= 200 else 1.0) * (1 + rng.gauss(0, 0.02)))
        if detector.active is not None:
            last_active = step
            onset = detector.active.onset_step
    assert detector.drops == 1
    assert detector.active is None
    assert last_active == onset + 499


def test_drop_after_the_new_baseline_is_found_again():
    """Once a level is accepted, a further drop from it is a new drop."""
    config = DropConfig(accept_after_steps=100)
    detector, _ = _run(lambda s: 0.8 if s < 500 else 0.6, 700, config=config)
    assert detector.drops == 1
    detector, _ = _run(lambda s: 1.0 if s < 200 else (0.8 if s < 500 else 0.6), 700, config=config)
    assert detector.drops == 2


def test_warm_up_is_respected():
    """No baseline and no alarm before warmup_steps values; a drop inside warm-up is learnt."""
    config = DropConfig(warmup_steps=30)
    detector = DropDetector(config)
    rng = _rng(4)
    for step in range(29):
        detector.observe(step, BASE * (1.0 if step < 10 else 0.5) * (1 + rng.gauss(0, 0.02)))
        assert detector.baseline is None
        assert detector.active is None
    detector.observe(29, BASE * 0.5)
    assert detector.baseline is not None
    _run(lambda _: 0.5, 200, detector=detector, start=30)
    assert detector.drops == 0


def test_values_before_warm_up_are_not_judged():
    """A drop right after the first warm-up values is not an alarm before warm-up ends."""
    detector, drop = _run(lambda s: 0.5 if s >= 20 else 1.0, 30)
    assert drop is None
    assert detector.drops == 0


@pytest.mark.parametrize("seed", range(3))
def test_slow_upward_trend_raises_nothing(seed):
    """Throughput that creeps up (x2.5 over 3,000 steps) only raises the level."""
    detector, drop = _run(lambda s: 1 + 0.0005 * s, 3000, seed=seed)
    assert drop is None
    baseline = detector.baseline
    assert baseline is not None
    assert baseline > BASE * 2.3


def test_step_up_raises_the_level():
    """A 20 % rise is no alarm and becomes the level."""
    detector, drop = _run(lambda s: 1.2 if s >= 200 else 1.0, 500)
    assert drop is None
    baseline = detector.baseline
    assert baseline is not None
    assert math.isclose(baseline, BASE * 1.2, rel_tol=0.01)


def test_flat_series_still_works():
    """With no noise at all, the 0.5 % noise floor keeps the detector working."""
    detector, drop = _run(lambda s: 0.9 if s >= 200 else 1.0, 300, noise=0.0)
    assert drop is not None
    assert drop.onset_step == 200
    assert math.isclose(drop.share, 0.1)
    assert detector.drops == 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -5.0])
def test_bad_values_are_ignored(bad):
    """Bad values neither count for warm-up nor trigger alarms."""
    detector = DropDetector()
    for step in range(29):
        detector.observe(step, BASE)
    detector.observe(29, bad)
    assert detector.baseline is None
    detector.observe(30, BASE)
    for step in range(31, 300):
        detector.observe(step, bad)
    assert detector.active is None
    assert detector.baseline == pytest.approx(BASE)


def test_drop_share():
    """share is 1 - current / baseline."""
    assert Drop(onset_step=1, detected_step=5, baseline=100.0, current=75.0).share == 0.25


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_drop": 0.0},
        {"min_drop": 1.0},
        {"threshold": 0.0},
        {"warmup_steps": 2},
        {"accept_after_steps": 0},
        {"confirm_steps": 0},
    ],
)
def test_bad_config_is_refused(kwargs):
    """Options that cannot work are refused at construction, naming the option."""
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        DropConfig(**kwargs)
