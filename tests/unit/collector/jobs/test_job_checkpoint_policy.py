import math

import pytest

from collector.jobs.checkpoint_policy import (
    PRIOR_FAILURES_PER_NODE_DAY,
    PRIOR_WEIGHT_S,
    CheckpointAdvice,
    advise,
    daly_interval,
    failure_rate,
    job_mtbf_s,
)

PRIOR_PER_S = PRIOR_FAILURES_PER_NODE_DAY / 86400.0


def test_llama_scale_example():
    """M = 3 h and a 60 s checkpoint give sqrt(2 x 60 x 10800) - 60, about 1078 s (18 min)."""
    interval = daly_interval(60.0, 3 * 3600.0)
    assert math.isclose(interval, math.sqrt(2 * 60 * 10800) - 60)
    assert 1077 < interval < 1079


def test_cost_at_or_above_twice_mtbf_gives_mtbf():
    """When a checkpoint costs 2M or more, checkpoint every M."""
    assert daly_interval(200.0, 100.0) == 100.0
    assert daly_interval(500.0, 100.0) == 100.0


def test_infinite_mtbf_gives_infinite_interval():
    """A job that never fails never needs a checkpoint."""
    assert daly_interval(60.0, math.inf) == math.inf


@pytest.mark.parametrize(
    ("cost", "mtbf", "named"),
    [
        (0.0, 100.0, "cost_s"),
        (-5.0, 100.0, "cost_s"),
        (60.0, 0.0, "mtbf_s"),
        (60.0, -1.0, "mtbf_s"),
    ],
)
def test_daly_errors_name_the_bad_value(cost, mtbf, named):
    """A non-positive cost or MTBF is refused with a message naming it and its value."""
    bad = cost if named == "cost_s" else mtbf
    with pytest.raises(ValueError, match=named) as caught:
        daly_interval(cost, mtbf)
    assert repr(bad) in str(caught.value)


def test_daly_refuses_nan():
    """NaN is not a positive cost."""
    with pytest.raises(ValueError, match="cost_s"):
        daly_interval(math.nan, 100.0)


def test_prior_rate_with_no_observation():
    """Never observed, a node fails at the published Llama 3 rate."""
    rate = failure_rate(0, 0.0, prior_per_s=PRIOR_PER_S, prior_weight_s=PRIOR_WEIGHT_S)
    assert math.isclose(rate, PRIOR_PER_S)
    assert math.isclose(rate * 86400 * 1000, 3.79)


def test_observed_rate_dominates_after_long_observation():
    """Ten years with one failure a day: the estimate is close to 1 per day, not the prior."""
    days = 3650
    rate = failure_rate(
        days, days * 86400.0, prior_per_s=PRIOR_PER_S, prior_weight_s=PRIOR_WEIGHT_S
    )
    assert math.isclose(rate * 86400, 1.0, rel_tol=0.01)


def test_prior_dominates_a_short_clean_record():
    """A day without a failure barely moves the estimate off the prior."""
    rate = failure_rate(0, 86400.0, prior_per_s=PRIOR_PER_S, prior_weight_s=PRIOR_WEIGHT_S)
    assert math.isclose(rate, PRIOR_PER_S * 30 / 31)


@pytest.mark.parametrize(
    ("failures", "observed", "prior", "weight", "named"),
    [
        (-1, 10.0, 1e-6, 10.0, "failures"),
        (0, -1.0, 1e-6, 10.0, "observed_s"),
        (0, 10.0, math.nan, 10.0, "prior_per_s"),
        (0, 10.0, 1e-6, -1.0, "prior_weight_s"),
    ],
)
def test_failure_rate_errors_name_the_bad_value(failures, observed, prior, weight, named):
    """Negative or NaN inputs are refused with a message naming them."""
    with pytest.raises(ValueError, match=named):
        failure_rate(failures, observed, prior_per_s=prior, prior_weight_s=weight)


def test_failure_rate_needs_some_weight():
    """No observation and no prior weight is no estimate."""
    with pytest.raises(ValueError, match="prior_weight_s"):
        failure_rate(0, 0.0, prior_per_s=1e-6, prior_weight_s=0.0)


def test_job_mtbf_sums_node_rates():
    """Any node's failure stops the job: rates add up."""
    assert math.isclose(job_mtbf_s([1e-5, 1e-5, 2e-5]), 25000.0)
    assert job_mtbf_s([0.0, 0.0]) == math.inf
    assert job_mtbf_s([]) == math.inf


def test_job_mtbf_refuses_negative_rates():
    """A negative rate is a caller's bug."""
    with pytest.raises(ValueError, match="-1"):
        job_mtbf_s([1e-5, -1.0])


def test_advise_for_a_llama_scale_job():
    """2,048 nodes at the prior rate give M of about 3.1 h and an interval of about 19 min."""
    advice = advise(60.0, [PRIOR_PER_S] * 2048)
    assert isinstance(advice, CheckpointAdvice)
    assert math.isclose(advice.mtbf_s, 1 / (2048 * PRIOR_PER_S))
    assert 3.0 * 3600 < advice.mtbf_s < 3.2 * 3600
    assert 17 * 60 < advice.interval_s < 20 * 60
    assert advice.cost_s == 60.0


@pytest.mark.parametrize("cost", [0.0, -1.0, math.nan])
def test_advise_needs_a_known_cost(cost):
    """No positive checkpoint cost, no advice."""
    assert advise(cost, [PRIOR_PER_S]) is None


def test_advise_needs_nodes():
    """No nodes, no advice."""
    assert advise(60.0, []) is None
    assert advise(60.0, iter([])) is None
