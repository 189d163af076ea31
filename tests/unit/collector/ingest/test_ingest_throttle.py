import pytest

from collector.ingest.throttle import (
    MIN_WAIT_S,
    IngestLimits,
    IngestThrottle,
    TokenBucket,
)


class TestTokenBucket:
    def test_within_the_burst_nothing_waits(self):
        """A full bucket takes up to its burst at once without a wait."""
        bucket = TokenBucket(rate=10.0, burst=5.0, now=0.0)
        assert [bucket.take(1, 0.0) for _ in range(5)] == [0.0] * 5

    def test_past_the_burst_the_wait_pays_the_debt_at_the_rate(self):
        """The sixth take of a 5-token bucket at 10/s must wait 0.1 s; the seventh 0.2 s."""
        bucket = TokenBucket(rate=10.0, burst=5.0, now=0.0)
        for _ in range(5):
            bucket.take(1, 0.0)
        assert bucket.take(1, 0.0) == pytest.approx(0.1)
        assert bucket.take(1, 0.0) == pytest.approx(0.2)

    def test_time_refills_up_to_the_burst_only(self):
        """An idle hour refills the bucket to its burst, not beyond."""
        bucket = TokenBucket(rate=10.0, burst=5.0, now=0.0)
        bucket.take(5, 0.0)
        assert bucket.level(3600.0) == 5.0
        assert bucket.take(5, 3600.0) == 0.0
        assert bucket.take(1, 3600.0) > 0.0

    def test_a_cost_beyond_the_burst_is_taken_and_paid_back_after(self):
        """One big report may exceed the burst: it goes through, and the next waits for it."""
        bucket = TokenBucket(rate=100.0, burst=50.0, now=0.0)
        assert bucket.take(250, 0.0) == pytest.approx(2.0)
        assert bucket.level(2.0) == pytest.approx(0.0)

    def test_sustained_rate_matches_the_budget(self):
        """Taking one token per wait returned, over 10 s of clock, admits rate x 10 + burst."""
        bucket = TokenBucket(rate=100.0, burst=20.0, now=0.0)
        now, taken = 0.0, 0
        while now < 10.0:
            now += bucket.take(1, now)
            taken += 1
        assert 1015 <= taken <= 1025


class TestNodeIngest:
    def test_short_waits_are_carried_as_debt_and_slept_together(self):
        """Waits under MIN_WAIT_S are not returned; the debt shows in a later, longer wait."""
        throttle = IngestThrottle(IngestLimits(events_per_s=1000.0, event_burst=1.0))
        node = throttle.node("n1", 0.0)
        waits = [node.take("events", 1, 0.0) for _ in range(20)]
        assert all(w == 0.0 or w >= MIN_WAIT_S for w in waits)
        assert any(w > 0.0 for w in waits)
        assert node.throttled["events"] == sum(1 for w in waits if w > 0)
        assert node.throttled_s["events"] == pytest.approx(sum(waits))
        assert node.throttled["samples"] == 0

    def test_budgets_are_per_node_and_survive_a_new_stream(self):
        """One node's debt does not touch another's, and asking again gives the same budget."""
        throttle = IngestThrottle(IngestLimits(events_per_s=10.0, event_burst=1.0))
        flooder = throttle.node("flooder", 0.0)
        for _ in range(50):
            flooder.take("events", 1, 0.0)
        assert throttle.node("flooder", 0.0) is flooder
        assert throttle.node("quiet", 0.0).take("events", 1, 0.0) == 0.0
        assert flooder.take("events", 1, 0.0) > 4.0

    def test_snapshot_copies_every_node(self):
        """The scrape thread gets copies, sorted by node."""
        throttle = IngestThrottle(IngestLimits(samples_per_s=10.0, sample_burst=10.0))
        throttle.node("b", 0.0).take("samples", 100, 0.0)
        throttle.node("a", 0.0)
        views = throttle.snapshot()
        assert [v.node for v in views] == ["a", "b"]
        assert views[1].throttled == {"events": 0, "samples": 1}
        assert views[1].throttled_s["samples"] == pytest.approx(9.0)
        views[1].throttled_s["samples"] = 0.0
        assert throttle.snapshot()[1].throttled_s["samples"] == pytest.approx(9.0)


class TestIngestLimits:
    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"events_per_s": 0.0}, "events_per_s must be positive"),
            ({"sample_burst": -1.0}, "sample_burst must be positive"),
            ({"hold_s": 0.0}, "hold_s"),
            ({"repeat_burst": 0}, "repeat_burst must be at least 1"),
        ],
    )
    def test_limits_that_would_stop_ingest_are_refused(self, changes, message):
        """A zero rate would stop a node for ever: refused when the limits are built."""
        with pytest.raises(ValueError, match=message):
            IngestLimits(**changes)
