"""Dense BF16 peak FLOP/s per GPU, and model FLOPs utilisation (MFU) from throughput."""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

# Dense (no 2:4 sparsity) BF16 tensor-core peak per GPU, from NVIDIA's datasheets.
PEAK_BF16_FLOPS: Final[Mapping[str, float]] = MappingProxyType(
    {
        "A100": 312e12,  # SXM4 and PCIe alike
        "H100 SXM": 989.4e12,
        "H100 PCIe": 756e12,
        "H100 NVL": 835e12,
        "H200": 989.4e12,
        "H200 NVL": 835e12,
        "B200": 2.25e15,  # GB200 is counted as B200-class
        # HGX B300: 2.25 PF dense BF16, the same as B200 (glennklockwood.com/garden/processors/B300,
        # after NVIDIA's HGX table; verda.com/blog/gb300-nvl72-architecture agrees for B300 and
        # lists 2.5 PF for the GB300 part, which is counted here at the B300 figure).
        "B300": 2.25e15,
    }
)

# NVML model names, lower-cased, to a key of the table: the first pattern that matches wins.
_FAMILIES: Final = (
    (re.compile(r"\bg?b300\b"), "B300"),  # "NVIDIA B300 SXM6 AC", "NVIDIA GB300"
    (re.compile(r"\bg?b200\b"), "B200"),  # "NVIDIA B200", "NVIDIA GB200"
    (re.compile(r"\bg?h200\b.*\bnvl\b"), "H200 NVL"),
    (re.compile(r"\bg?h200\b"), "H200"),
    (re.compile(r"\bh100\b.*\bnvl\b"), "H100 NVL"),
    (re.compile(r"\bh100\b.*\bpcie\b"), "H100 PCIe"),
    (re.compile(r"\bh100\b"), "H100 SXM"),  # "NVIDIA H100 80GB HBM3"
    (re.compile(r"\ba100\b"), "A100"),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB"
)


def gpu_family(model: str) -> str | None:
    """Map an NVML model name (e.g. "NVIDIA H100 80GB HBM3") to a key of the peak table."""
    name = model.lower()
    return next((family for pattern, family in _FAMILIES if pattern.search(name)), None)


def peak_flops(model: str) -> float | None:
    """Dense BF16 peak FLOP/s of one GPU of this NVML model name; None when unknown."""
    family = gpu_family(model)
    return None if family is None else PEAK_BF16_FLOPS[family]


def mfu(tokens_per_s: float, flops_per_token: float, gpus: int, peak_flops_per_gpu: float) -> float:
    """Share of the GPUs' peak that the job's model FLOPs use; 0.0 when an input is not positive."""
    if not (tokens_per_s > 0 and flops_per_token > 0 and gpus > 0 and peak_flops_per_gpu > 0):
        return 0.0
    return tokens_per_s * flops_per_token / (gpus * peak_flops_per_gpu)


def flops_per_token(params: float | None, given: float | None) -> float | None:
    """The FLOPs per token a job declared, else the 6 x parameters rule, else None."""
    if given is not None and given > 0:
        return given
    if params is not None and params > 0:
        return 6.0 * params
    return None
