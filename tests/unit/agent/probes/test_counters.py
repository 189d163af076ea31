from pathlib import Path

import pytest

import agent.probes.counters as counters_module
from agent.probes.counters import (
    DEFAULT_SPEC,
    IB_COUNTER_SPECS,
    IB_COUNTER_WIDTH_BITS,
    MLX5_HW_COUNTER_SPECS,
    CounterSample,
    CounterSpec,
    CounterTracker,
    DeltaKind,
    counter_delta,
)
from agent.sources.sysfs import SysfsReader

FIXTURE = Path(__file__).parents[3] / "fixtures" / "sysfs" / "h100-cx7"
LINK_DOWNED = IB_COUNTER_SPECS["link_downed"]
SYMBOL_ERROR = IB_COUNTER_SPECS["symbol_error"]
Q_COUNTER = MLX5_HW_COUNTER_SPECS["out_of_buffer"]


def sample(value: int, at: float) -> CounterSample:
    return CounterSample(value=value, at=at)


class TestCounterSpecs:
    @pytest.mark.parametrize(
        ("name", "bits"),
        [
            ("symbol_error", 16),
            ("link_error_recovery", 8),
            ("link_downed", 8),
            ("local_link_integrity_errors", 4),
            ("excessive_buffer_overrun_errors", 4),
            ("VL15_dropped", 16),
            ("port_xmit_wait", 32),
            ("port_xmit_data", 64),
            ("multicast_rcv_packets", 64),
        ],
    )
    def test_widths_follow_the_kernel_table(self, name, bits):
        """The width table is the IBA PortCounters table from the reference."""
        assert bits == IB_COUNTER_WIDTH_BITS[name]

    def test_narrow_counters_saturate_and_extended_ones_wrap(self):
        """PortCounters stop at all ones; the 64-bit extended counters are treated as wrapping."""
        assert (LINK_DOWNED.max_value, LINK_DOWNED.saturates) == (255, True)
        assert (SYMBOL_ERROR.max_value, SYMBOL_ERROR.saturates) == (65535, True)
        assert IB_COUNTER_SPECS["port_xmit_wait"].saturates
        assert not IB_COUNTER_SPECS["port_rcv_packets"].saturates

    def test_byte_counters_count_in_fours(self):
        """The reader's byte counters wrap where 2**64 four-octet words do."""
        spec = IB_COUNTER_SPECS["port_xmit_bytes"]
        assert (spec.unit, spec.modulus) == (4, 4 << 64)

    def test_mlx5_q_counters_are_32_bit_and_cnp_counters_64_bit(self):
        """mlx5 Q counters are 32-bit firmware counters; congestion counters are 64-bit."""
        assert (Q_COUNTER.width_bits, Q_COUNTER.saturates) == (32, False)
        assert MLX5_HW_COUNTER_SPECS["np_cnp_sent"].width_bits == 64


class TestCounterDelta:
    def test_first_reading_has_no_delta_or_rate(self):
        """With nothing to compare against there is a value but no rate yet."""
        d = counter_delta(None, sample(40, 100.0), SYMBOL_ERROR)
        assert (d.kind, d.delta, d.rate) == (DeltaKind.FIRST, None, None)
        assert d.value == 40

    def test_rate_uses_the_injected_times(self):
        """The rate is the delta over the difference of the two timestamps given."""
        d = counter_delta(sample(1_000, 10.0), sample(4_000, 25.0), DEFAULT_SPEC)
        assert (d.kind, d.delta, d.rate, d.elapsed_s) == (DeltaKind.OK, 3_000, 200.0, 15.0)

    def test_decrease_of_a_saturating_counter_is_a_reset(self):
        """After a driver reload the counter restarts; the delta is the new value."""
        d = counter_delta(sample(7, 0.0), sample(2, 10.0), LINK_DOWNED)
        assert (d.kind, d.delta, d.rate) == (DeltaKind.RESET, 2, 0.2)

    def test_reaching_saturation_gives_a_lower_bound(self):
        """A counter that hits its maximum moved at least the distance to it."""
        d = counter_delta(sample(65_000, 0.0), sample(65_535, 5.0), SYMBOL_ERROR)
        assert (d.kind, d.delta, d.rate) == (DeltaKind.SATURATED, 535, 107.0)
        assert d.saturated
        assert d.is_lower_bound

    def test_stuck_at_saturation_has_an_unknown_rate_not_zero(self):
        """Two readings at the maximum say nothing about the rate in between."""
        d = counter_delta(sample(255, 0.0), sample(255, 60.0), LINK_DOWNED)
        assert (d.kind, d.rate) == (DeltaKind.SATURATED, None)
        assert d.is_lower_bound

    def test_first_reading_at_saturation_is_flagged(self):
        """A counter already pinned at start-up is marked saturated on its first reading."""
        d = counter_delta(None, sample(2**32 - 1, 0.0), IB_COUNTER_SPECS["port_xmit_wait"])
        assert (d.kind, d.saturated) == (DeltaKind.FIRST, True)

    def test_32_bit_counter_near_the_top_wraps(self):
        """A 32-bit counter going from near 2**32 to near zero wrapped; the delta spans the wrap."""
        d = counter_delta(sample(2**32 - 100, 0.0), sample(50, 1.0), Q_COUNTER)
        assert (d.kind, d.delta, d.rate) == (DeltaKind.WRAPPED, 150, 150.0)

    def test_32_bit_counter_falling_from_the_middle_is_a_reset(self):
        """A drop that would need three quarters of the range to be a wrap is a reset."""
        d = counter_delta(sample(2**31, 0.0), sample(10, 1.0), Q_COUNTER)
        assert (d.kind, d.delta) == (DeltaKind.RESET, 10)

    def test_64_bit_decrease_is_a_reset(self):
        """No 64-bit counter gets near its top, so a decrease means the HCA was reset."""
        spec = IB_COUNTER_SPECS["port_rcv_packets"]
        d = counter_delta(sample(2_500_000_000_000, 0.0), sample(1_000, 10.0), spec)
        assert (d.kind, d.delta, d.rate) == (DeltaKind.RESET, 1_000, 100.0)

    def test_byte_counter_wraps_at_four_times_two_to_the_64(self):
        """A byte counter made of 4-octet words wraps at 4 * 2**64."""
        spec = IB_COUNTER_SPECS["port_xmit_bytes"]
        d = counter_delta(sample((4 << 64) - 8, 0.0), sample(8, 1.0), spec)
        assert (d.kind, d.delta) == (DeltaKind.WRAPPED, 16)

    def test_value_beyond_the_spec_width_is_not_a_wrap(self):
        """A counter wider than its spec says resets rather than wraps by a bogus amount."""
        d = counter_delta(sample(2**40, 0.0), sample(2**32 + 5, 1.0), Q_COUNTER)
        assert (d.kind, d.delta) == (DeltaKind.RESET, 2**32 + 5)

    @pytest.mark.parametrize("later", [10.0, 9.0])
    def test_no_rate_without_elapsed_time(self, later):
        """Same or earlier timestamp: the delta is known but no rate is made up."""
        d = counter_delta(sample(1, 10.0), sample(5, later), DEFAULT_SPEC)
        assert (d.delta, d.rate) == (4, None)

    def test_negative_values_are_refused(self):
        """Hardware counters are unsigned; a negative value is a caller bug."""
        with pytest.raises(ValueError, match="negative"):
            counter_delta(None, sample(-1, 0.0), DEFAULT_SPEC)

    def test_custom_spec(self):
        """A 4-bit saturating counter saturates at 15."""
        spec = CounterSpec(width_bits=4, saturates=True)
        assert counter_delta(sample(3, 0.0), sample(15, 1.0), spec).kind is DeltaKind.SATURATED


class TestCounterTracker:
    def test_tracks_each_scope_and_name_separately(self):
        """Two ports with the same counter name do not share readings."""
        tracker = CounterTracker()
        tracker.update(("mlx5_0", 1), {"symbol_error": 5}, 0.0)
        tracker.update(("mlx5_1", 1), {"symbol_error": 100}, 0.0)
        out = tracker.update(("mlx5_0", 1), {"symbol_error": 8}, 3.0)
        assert (out["symbol_error"].delta, out["symbol_error"].rate) == (3, 1.0)

    def test_counts_resets_and_wraps(self):
        """Resets and wraps are counted across every counter the tracker sees."""
        tracker = CounterTracker(MLX5_HW_COUNTER_SPECS)
        tracker.update("mlx5_0", {"out_of_buffer": 2**32 - 10, "np_cnp_sent": 500}, 0.0)
        out = tracker.update("mlx5_0", {"out_of_buffer": 5, "np_cnp_sent": 3}, 1.0)
        assert (
            out["out_of_buffer"].kind,
            out["np_cnp_sent"].kind,
        ) == (DeltaKind.WRAPPED, DeltaKind.RESET)
        assert (tracker.resets, tracker.wraps) == (1, 1)

    def test_missing_reading_spans_the_gap(self):
        """A counter that could not be read keeps its last reading for the next delta."""
        tracker = CounterTracker()
        tracker.update("p", {"port_rcv_errors": 10, "symbol_error": 1}, 0.0)
        tracker.update("p", {"symbol_error": 2}, 5.0)
        out = tracker.update("p", {"port_rcv_errors": 30}, 10.0)
        assert (out["port_rcv_errors"].delta, out["port_rcv_errors"].rate) == (20, 2.0)

    def test_forget_starts_a_scope_over(self):
        """After forget, the next reading of that scope is a first reading."""
        tracker = CounterTracker()
        tracker.update("p", {"link_downed": 1}, 0.0)
        tracker.forget("p")
        assert tracker.update("p", {"link_downed": 1}, 1.0)["link_downed"].kind is DeltaKind.FIRST

    def test_saturated_port_xmit_wait_in_the_fixture_is_not_a_zero_rate(self):
        """The fixture's congested port pins port_xmit_wait; its rate is unknown, not zero."""
        reader = SysfsReader(FIXTURE)
        tracker = CounterTracker()
        values = reader.ib_port_counters("mlx5_3", 1).counters
        tracker.update("mlx5_3", values, 0.0)
        out = tracker.update("mlx5_3", values, 10.0)
        assert (
            out["port_xmit_wait"].kind,
            out["port_xmit_wait"].rate,
        ) == (DeltaKind.SATURATED, None)
        assert (out["port_xmit_bytes"].kind, out["port_xmit_bytes"].rate) == (DeltaKind.OK, 0.0)


class TestPublicNames:
    def test_all_lists_the_public_names(self):
        """``__all__`` names exactly the module's public classes and functions, and exists."""
        module = counters_module
        public = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        }
        listed = {
            name
            for name in module.__all__
            if getattr(getattr(module, name), "__module__", None) == module.__name__
        }
        assert listed == public
        assert all(hasattr(module, name) for name in module.__all__)
