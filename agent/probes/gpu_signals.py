"""Turn one NVML reading of a GPU into named samples (what the wire and the collector see)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetwatch.model import SampleKey, SampleValue, Target

if TYPE_CHECKING:
    from agent.sources.nvml import GpuIdentity, GpuReading

# Sample name -> GpuReading attribute, for the per-GPU values reported as they are.
GPU_SIGNALS: dict[str, str] = {
    "pcie_replay_count": "pcie_replay_count",
    "pcie_link_gen": "pcie_gen",
    "pcie_link_width": "pcie_width",
    "ecc_sbe_volatile_total": "ecc_sbe_volatile",
    "ecc_dbe_volatile_total": "ecc_dbe_volatile",
    "ecc_sbe_aggregate_total": "ecc_sbe_aggregate",
    "ecc_dbe_aggregate_total": "ecc_dbe_aggregate",
    "remapped_rows_correctable": "remapped_correctable",
    "remapped_rows_uncorrectable": "remapped_uncorrectable",
    "remap_pending": "remap_pending",
    "remap_failure": "remap_failure",
    "clock_event_reasons": "clock_event_reasons",
    "temperature_celsius": "temperature_c",
    "power_watts": "power_w",
    "utilization_gpu_percent": "gpu_util_pct",
    "utilization_memory_percent": "mem_util_pct",
    "sm_clock_mhz": "sm_clock_mhz",
}

# Sample name -> NvlinkReading attribute, per link.
NVLINK_SIGNALS: dict[str, str] = {
    "nvlink_up": "up",
    "nvlink_replay_errors": "replay_errors",
    "nvlink_recovery_errors": "recovery_errors",
    "nvlink_crc_errors": "crc_errors",
}


def _sample_value(value: object) -> SampleValue | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float | str):
        return value
    msg = f"unexpected sample value {value!r}"
    raise TypeError(msg)


def gpu_samples(gpu: GpuIdentity, reading: GpuReading) -> dict[SampleKey, SampleValue]:
    """Every value the GPU reported; what it does not support is simply absent."""
    samples: dict[SampleKey, SampleValue] = {}
    target = Target.gpu(gpu.uuid)
    samples[target, "gpu_present"] = 1
    if gpu.max_pcie_gen is not None:
        samples[target, "pcie_link_gen_max"] = gpu.max_pcie_gen
    if gpu.max_pcie_width is not None:
        samples[target, "pcie_link_width_max"] = gpu.max_pcie_width
    for name, attr in GPU_SIGNALS.items():
        value = _sample_value(getattr(reading, attr))
        if value is not None:
            samples[target, name] = value
    for link, nvlink in enumerate(reading.nvlinks):
        link_target = Target.nvlink(gpu.uuid, link)
        for name, attr in NVLINK_SIGNALS.items():
            value = _sample_value(getattr(nvlink, attr))
            if value is not None:
                samples[link_target, name] = value
    return samples
