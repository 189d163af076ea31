import math

import pytest

from collector.jobs.peak_flops import PEAK_BF16_FLOPS, flops_per_token, gpu_family, mfu, peak_flops


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", "B200"),
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA GB300", "B300"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("nvidia h100 pcie", "H100 PCIe"),
    ],
)
def test_nvml_names_map_to_families(model, family):
    """Every NVML model name we know maps to its family, whatever the case."""
    assert gpu_family(model) == family
    assert family in PEAK_BF16_FLOPS


@pytest.mark.parametrize("model", ["Tesla V100-SXM2-32GB", "NVIDIA RTX A1000", "NVIDIA A10", ""])
def test_unknown_models_have_no_family(model):
    """GPUs outside the table, look-alike names included, have no family and no peak."""
    assert gpu_family(model) is None
    assert peak_flops(model) is None


def test_peak_flops_per_family():
    """The dense BF16 peaks are the datasheet figures."""
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H100 NVL") == 835e12
    assert peak_flops("NVIDIA H200") == 989.4e12
    assert peak_flops("NVIDIA H200 NVL") == 835e12
    assert peak_flops("NVIDIA A100-PCIE-40GB") == 312e12
    assert peak_flops("NVIDIA B200") == 2.25e15
    assert peak_flops("NVIDIA B300 SXM6 AC") == 2.25e15


def test_mfu_of_a_known_job():
    """8 H100s at 4,000 tokens/s on a 7B model (6 x 7e9 FLOPs per token) run at about 2.1 %."""
    value = mfu(4000.0, 6 * 7e9, 8, 989.4e12)
    assert math.isclose(value, 4000 * 42e9 / (8 * 989.4e12))
    assert 0.02 < value < 0.022


@pytest.mark.parametrize(
    ("tokens", "per_token", "gpus", "peak"),
    [(0.0, 1e9, 8, 1e15), (1e3, -1.0, 8, 1e15), (1e3, 1e9, 0, 1e15), (1e3, 1e9, 8, 0.0)],
)
def test_mfu_is_zero_without_positive_inputs(tokens, per_token, gpus, peak):
    """Any input that is not positive gives 0.0 rather than a division error or a negative."""
    assert mfu(tokens, per_token, gpus, peak) == 0.0


def test_mfu_is_zero_for_nan():
    """A NaN throughput gives 0.0."""
    assert mfu(math.nan, 1e9, 8, 1e15) == 0.0


def test_flops_per_token_prefers_the_given_value():
    """A declared FLOPs per token wins; else 6 x parameters; else None."""
    assert flops_per_token(7e9, 5e10) == 5e10
    assert flops_per_token(7e9, None) == 42e9
    assert flops_per_token(7e9, 0.0) == 42e9
    assert flops_per_token(None, None) is None
    assert flops_per_token(0.0, -1.0) is None
