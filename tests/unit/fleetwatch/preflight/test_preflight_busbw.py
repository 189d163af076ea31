import math

import pytest

from fleetwatch.preflight.busbw import CollectiveOp, algbw_gbs, bus_factor, busbw_gbs


def test_all_reduce_factor_is_two_n_minus_one_over_n():
    assert bus_factor(CollectiveOp.ALL_REDUCE, 8) == pytest.approx(1.75)
    assert bus_factor(CollectiveOp.ALL_REDUCE, 16) == pytest.approx(1.875)
    assert bus_factor(CollectiveOp.ALL_REDUCE, 2) == pytest.approx(1.0)
    assert bus_factor(CollectiveOp.ALL_REDUCE, 1) == 0.0


def test_other_collectives():
    assert bus_factor(CollectiveOp.ALL_GATHER, 4) == pytest.approx(0.75)
    assert bus_factor(CollectiveOp.REDUCE_SCATTER, 4) == pytest.approx(0.75)
    assert bus_factor(CollectiveOp.ALL_TO_ALL, 4) == pytest.approx(0.75)
    assert bus_factor(CollectiveOp.BROADCAST, 4) == 1.0
    assert bus_factor(CollectiveOp.REDUCE, 4) == 1.0
    assert bus_factor(CollectiveOp.ALL_REDUCE_IN_NETWORK, 3) == pytest.approx(0.5)


def test_a_row_of_all_reduce_perf_is_reproduced():
    # nccl-tests prints size (B), time (us), algbw and busbw (GB/s) per row; 8 ranks:
    # 1 GiB in 5,000 us is 214.75 GB/s algbw and 375.80 GB/s busbw.
    size, seconds = 1 << 30, 5000e-6
    assert algbw_gbs(size, seconds) == pytest.approx(214.748, abs=1e-3)
    assert busbw_gbs(size, seconds, 8) == pytest.approx(375.809, abs=1e-3)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="at least one rank"):
        bus_factor(CollectiveOp.ALL_REDUCE, 0)
    with pytest.raises(ValueError, match="positive time"):
        algbw_gbs(100, 0.0)
    assert math.isfinite(busbw_gbs(1, 1e-9, 2))
