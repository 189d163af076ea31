import tracemalloc

from collector.model.history import MAX_SAMPLES_PER_SERIES, History


class TestSampleSeries:
    def test_increase_counts_from_the_last_point_before_the_window(self):
        """The value at the window's start is the last sample at or before it."""
        history = History(3600.0, {"ib_symbol_error": 60.0})
        for at, value in ((0.0, 5.0), (10.0, 7.0), (80.0, 9.0), (100.0, 20.0)):
            history.add_sample("n/port/mlx5_0/1", "ib_symbol_error", at, value)
        assert history.increase("n/port/mlx5_0/1", "ib_symbol_error", 40.0, 100.0) == 13.0

    def test_points_older_than_the_window_go_but_one(self):
        """Once newer points cover the window, older ones are dropped, all but the last before."""
        history = History(3600.0, {"c": 10.0})
        for at in range(100):
            history.add_sample("t", "c", float(at), float(at))
        # At 99 the window starts at 89: 88 is the last point before it, and the oldest kept.
        assert history.increase("t", "c", 89.0, 99.0) == 10.0
        assert history.increase("t", "c", 0.0, 99.0) == 11.0

    def test_a_series_keeps_its_newest_points_up_to_the_cap(self):
        """A series that changes faster than its window allows keeps the newest points."""
        history = History(3600.0, {"c": 1e9})
        total = MAX_SAMPLES_PER_SERIES + 500
        for at in range(total):
            history.add_sample("t", "c", float(at), float(at))
        assert float(MAX_SAMPLES_PER_SERIES - 1) == history.increase("t", "c", 0.0, total)

    def test_a_counter_reset_counts_from_zero(self):
        """A drop is a reset: the growth after it is the new value."""
        history = History(3600.0, {"c": 100.0})
        for at, value in ((0.0, 50.0), (10.0, 60.0), (20.0, 4.0)):
            history.add_sample("t", "c", at, value)
        assert history.increase("t", "c", 0.0, 20.0) == 14.0

    def test_signals_no_rule_asks_about_are_not_kept(self):
        """Only the signals with a window are kept."""
        history = History(3600.0, {"c": 100.0})
        history.add_sample("t", "temperature_celsius", 0.0, 50.0)
        history.add_sample("t", "temperature_celsius", 1.0, 90.0)
        assert history.increase("t", "temperature_celsius", 0.0, 1.0) == 0.0

    def test_a_series_of_one_point_is_small(self):
        """A node has hundreds of counters that never move: one point each costs little."""
        history = History(3600.0, {"nvlink_crc_errors": 300.0})
        keys = [f"node-{i}/gpu/0/nvlink/{i % 18}" for i in range(2000)]
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for key in keys:
                history.add_sample(key, "nvlink_crc_errors", 1.0, 0.0)
            per_series = (tracemalloc.get_traced_memory()[0] - before) / len(keys)
        finally:
            tracemalloc.stop()
        assert per_series < 400, per_series  # a deque per series cost about 1,000 bytes


def counter(points: tuple[tuple[float, float], ...], window: float = 100.0) -> History:
    """A history holding the counter ``c`` of target ``t`` at ``points`` (time, value)."""
    history = History(3600.0, {"c": window})
    for at, value in points:
        history.add_sample("t", "c", at, value)
    return history


class TestRises:
    def test_each_step_up_is_one_rise_whatever_its_size(self):
        """One step of 5 is one rise where increase() says 5; two steps of 1 are two."""
        big = counter(((0.0, 0.0), (10.0, 5.0)))
        assert big.rises("t", "c", 0.0, 20.0) == 1
        assert big.increase("t", "c", 0.0, 20.0) == 5.0
        small = counter(((0.0, 0.0), (10.0, 1.0), (15.0, 2.0)))
        assert small.rises("t", "c", 0.0, 20.0) == 2

    def test_a_sample_that_repeats_the_value_is_no_rise(self):
        """A counter reported again unchanged (a full report after a reconnect) counts nothing."""
        history = counter(((0.0, 3.0), (5.0, 3.0), (10.0, 4.0), (15.0, 4.0), (20.0, 4.0)))
        assert history.rises("t", "c", 0.0, 20.0) == 1

    def test_a_reset_is_a_rise_only_to_a_value_above_zero(self):
        """A drop to 0 is a counter reset and no rise; a drop to 2 is a reset and two errors
        since, so one rise, as increase() counts the new value as the growth."""
        assert counter(((0.0, 7.0), (10.0, 0.0))).rises("t", "c", 0.0, 20.0) == 0
        assert counter(((0.0, 7.0), (10.0, 0.0), (15.0, 1.0))).rises("t", "c", 0.0, 20.0) == 1
        assert counter(((0.0, 7.0), (10.0, 2.0))).rises("t", "c", 0.0, 20.0) == 1

    def test_the_first_sample_in_the_window_counts_from_the_last_before_it(self):
        """A step onto the first sample inside the window counts, measured from the last
        sample at or before the window's start; a step before the start does not."""
        history = counter(((0.0, 0.0), (10.0, 1.0), (50.0, 2.0)))
        assert history.rises("t", "c", 20.0, 60.0) == 1  # 1 at 10 -> 2 at 50
        assert history.rises("t", "c", 10.0, 60.0) == 1  # a sample on the start is its base
        assert history.rises("t", "c", 9.0, 60.0) == 2

    def test_without_a_sample_before_the_window_the_first_only_starts_the_count(self):
        """Growth before the first sample known is unknown: a collector that has just started
        sees the counter's current value and no rise."""
        history = counter(((30.0, 4.0), (40.0, 4.0)))
        assert history.rises("t", "c", 0.0, 50.0) == 0
        history.add_sample("t", "c", 45.0, 5.0)
        assert history.rises("t", "c", 0.0, 50.0) == 1

    def test_samples_after_now_are_not_read(self):
        """The window ends at ``now``."""
        history = counter(((0.0, 0.0), (10.0, 1.0), (30.0, 2.0)))
        assert history.rises("t", "c", 0.0, 20.0) == 1

    def test_a_signal_no_rule_asks_about_has_no_rises(self):
        """Only the signals with a window are kept; any other rises 0 times."""
        history = counter(((0.0, 0.0), (10.0, 1.0)))
        assert history.rises("t", "other", 0.0, 20.0) == 0
        assert history.rises("elsewhere", "c", 0.0, 20.0) == 0
