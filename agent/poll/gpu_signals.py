"""Turn one NVML reading of a GPU into named samples (what the wire and the collector see)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from fleetwatch.model import SampleKey, SampleValue, Target

if TYPE_CHECKING:
    from agent.sources.nvml import GpuIdentity, GpuReading, NvlinkReading

# Sample name -> GpuReading attribute, for the per-GPU values reported as they are.
GPU_SIGNALS: Final[dict[str, str]] = {
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
    "temperature_slowdown_celsius": "temperature_slowdown_c",
    "power_watts": "power_w",
    "utilization_gpu_percent": "gpu_util_pct",
    "utilization_memory_percent": "mem_util_pct",
    "sm_clock_mhz": "sm_clock_mhz",
}

# Flags read out of the clock-event (throttle) reason bitmask, one sample each (CEL, the rules'
# language, has no bitwise operators): name -> NVML's nvmlClocksEventReason* bit.
CLOCK_REASON_SIGNALS: Final[dict[str, int]] = {
    "clocks_hw_slowdown": 0x8,  # HW slowdown: thermal or power brake, set by the hardware
    "clocks_sw_thermal_slowdown": 0x20,
    "clocks_hw_thermal_slowdown": 0x40,
    "clocks_hw_power_brake": 0x80,
}

# Sample name -> NvlinkReading attribute, per link.
NVLINK_SIGNALS: Final[dict[str, str]] = {
    "nvlink_up": "up",
    "nvlink_replay_errors": "replay_errors",
    "nvlink_recovery_errors": "recovery_errors",
    "nvlink_crc_errors": "crc_errors",
}


class GpuSampler:
    """Makes one GPU's samples; the sample keys are built once, not every poll."""

    __slots__ = ("_gpu", "_last_links", "_link_keys", "_reason_keys", "_static", "_value_keys")

    def __init__(self, gpu: GpuIdentity) -> None:
        """Prepare the keys of every sample this GPU can give."""
        target = Target.gpu(gpu.uuid)
        self._gpu = gpu
        self._static: dict[SampleKey, SampleValue] = {(target, "gpu_present"): 1}
        if gpu.max_pcie_gen is not None:
            self._static[target, "pcie_link_gen_max"] = gpu.max_pcie_gen
        if gpu.max_pcie_width is not None:
            self._static[target, "pcie_link_width_max"] = gpu.max_pcie_width
        self._value_keys = [(attr, (target, name)) for name, attr in GPU_SIGNALS.items()]
        self._reason_keys = [((target, name), bit) for name, bit in CLOCK_REASON_SIGNALS.items()]
        self._link_keys = [
            [(attr, (Target.nvlink(gpu.uuid, link), name)) for name, attr in NVLINK_SIGNALS.items()]
            for link in range(gpu.nvlink_count)
        ]
        self._last_links: tuple[NvlinkReading, ...] = ()

    def samples(self, reading: GpuReading) -> dict[SampleKey, SampleValue]:
        """The GPU's values; per-link values only for links whose reading changed.

        Unchanged link values would be dropped by change detection anyway; skipping them here
        saves most of a poll's work (18 links, 4 values each, per GPU). What the GPU does not
        support is simply absent.
        """
        out = dict(self._static)
        for attr, key in self._value_keys:
            value = getattr(reading, attr)
            if value is not None:
                out[key] = int(value) if value.__class__ is bool else value
        reasons = reading.clock_event_reasons
        if reasons is not None:
            for key, bit in self._reason_keys:
                out[key] = int(bool(reasons & bit))
        links, last = reading.nvlinks, self._last_links
        if links != last:  # most polls: no link changed, and nothing needs doing
            for i, (keys, nvlink) in enumerate(zip(self._link_keys, links, strict=False)):
                if i < len(last) and nvlink == last[i]:
                    continue
                for attr, key in keys:
                    value = getattr(nvlink, attr)
                    if value is not None:
                        out[key] = int(value) if value.__class__ is bool else value
            self._last_links = links
        return out
