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
