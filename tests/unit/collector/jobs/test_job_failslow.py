import math
import random
import statistics

import pytest

from collector.jobs.failslow import FailSlowDetector, over_peers

THRESHOLD = 8.0  # collector/jobs/failslow.py _THRESHOLD


def _rng(seed: int) -> random.Random:
    """Seeded noise, the same on every run."""
    return random.Random(seed)  # noqa: S311 - reproducible noise, not secrets


@pytest.mark.parametrize("ranks", range(2, 10))
def test_over_peers_divides_by_the_median_of_the_other_ranks(ranks):
    """Each rank's log ratio is to the median of the others, ties included."""
    rng = _rng(ranks)
    for _ in range(200):
        times = {r: rng.choice([1.0, 2.0, 3.0, 0.5 + rng.random()]) for r in range(ranks)}
        got = over_peers(times)
        for rank, seconds in times.items():
            peers = statistics.median(t for r, t in times.items() if r != rank)
            assert math.isclose(math.log(seconds / peers), got[rank], abs_tol=1e-12)


def test_over_peers_needs_a_peer():
    """One rank has nobody to be compared with."""
    assert over_peers({0: 1.0}) == {}
    assert over_peers({}) == {}


@pytest.mark.parametrize("ranks", [3, 8, 32, 128])
def test_sigma_is_the_per_step_noise_whatever_the_job_size(ranks):
    """With 2 % noise, sigma is within 20 % of the spread of a rank's ratio to its peers."""
    rng = _rng(ranks)
    detector = FailSlowDetector(0.05)
    seen = []
    for _ in range(300):
        times = {r: 1 + rng.gauss(0, 0.02) for r in range(ranks)}
        detector.observe(times)
        seen.append(over_peers(times)[0])
    assert math.isclose(statistics.pstdev(seen), detector.sigma, rel_tol=0.2)


def test_a_flat_job_has_the_floor_for_noise():
    """Identical times: sigma is the 0.5 % floor, and nobody gathers evidence."""
    detector = FailSlowDetector(0.05)
    for _ in range(50):
        detector.observe(dict.fromkeys(range(8), 1.0))
    assert detector.sigma == 0.005
    assert detector.evidence(0) == 0.0


@pytest.mark.parametrize("length", [1, 3, 5])
def test_a_burst_of_five_steps_or_fewer_cannot_raise_an_alarm_on_its_own(length):
    """However slow, 5 steps or fewer add at most the threshold to a rank's evidence."""
    rng = _rng(length)
    detector = FailSlowDetector(0.05)
    before = most = 0.0
    for step in range(100):
        times = {r: 1 + rng.gauss(0, 0.02) for r in range(16)}
        if 50 <= step < 50 + length:
            times[0] *= 3.0
        if step == 50:
            before = detector.evidence(0)
        detector.observe(times)
        most = max(most, detector.evidence(0))
    assert 0 < most - before <= THRESHOLD


def test_every_rank_slowed_alike_gathers_no_evidence():
    """A change that slows every rank alike leaves every ratio, and so every CUSUM, alone."""
    detector = FailSlowDetector(0.05)
    for step in range(100):
        detector.observe(dict.fromkeys(range(8), 1.0 if step < 50 else 1.5))
    assert all(detector.evidence(r) == 0.0 for r in range(8))


def test_a_named_rank_is_held_until_its_median_is_near_1_then_starts_over():
    """Named over half the shift, held down to a quarter of it, then its evidence is gone."""
    detector = FailSlowDetector(0.05)
    for _ in range(20):
        detector.observe({0: 1.1, 1: 1.0, 2: 1.0, 3: 1.0})
    assert detector.evidence(0) > THRESHOLD
    assert not detector.holds(0, 1.02, 20)  # under 1 + shift / 2
    assert detector.holds(0, 1.03, 20)
    assert detector.holds(0, 1.013, 20)  # held down to 1 + shift / 4
    assert not detector.holds(0, 1.012, 20)
    assert detector.evidence(0) == 0.0


def test_a_noisy_job_needs_a_significant_median():
    """With 5 % noise, a window median 3 % up over 10 steps is within noise: not named."""
    rng = _rng(3)
    detector = FailSlowDetector(0.05)
    for _ in range(100):
        times = {r: 1 + rng.gauss(0, 0.05) for r in range(16)}
        times[0] = 1.3  # evidence, whatever the median says
        detector.observe(times)
    assert detector.evidence(0) > THRESHOLD
    assert not detector.holds(0, 1.03, 10)
    assert detector.holds(0, 1.3, 10)


def test_forget_and_clear_drop_the_evidence():
    """A forgotten rank, and every rank after clear, start with no evidence."""
    detector = FailSlowDetector(0.05)
    for _ in range(20):
        detector.observe({0: 1.1, 1: 1.1, 2: 1.0, 3: 1.0, 4: 1.0})
    assert detector.evidence(0) > 0
    detector.forget(0)
    assert detector.evidence(0) == 0.0
    detector.clear()
    assert detector.evidence(1) == 0.0


@pytest.mark.parametrize("shift", [0.0, 1.0, -0.5, math.nan])
def test_a_shift_that_is_no_share_is_refused(shift):
    """The shift must be a share between 0 and 1."""
    with pytest.raises(ValueError, match="shift"):
        FailSlowDetector(shift)
