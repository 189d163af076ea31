"""A simulated GPU and InfiniBand port: the state NVML and sysfs would report about them.

:class:`agent.sim.hardware.SimNode` builds a node of them and changes them as faults happen;
:class:`agent.sim.nvml_lib.SimNvmlLibrary` answers NVML calls from the GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import threading
    from collections.abc import Mapping

# Bus numbers of the eight GPUs on a typical HGX H100 board.
H100_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
H100_MODEL = "NVIDIA H100 80GB HBM3"
H100_NVLINKS = 18


@dataclass(slots=True)
class SimGpu:
    """One simulated GPU: what NVML would report about it."""

    index: int
    uuid: str
    bus: int
    model: str = H100_MODEL
    nvlink_up: list[bool] = field(default_factory=lambda: [True] * H100_NVLINKS)
    # Per link: DL replay, DL recovery, DL CRC error counters (they only grow).
    nvlink_errors: list[list[int]] = field(default_factory=list)
    pcie_replays: int = 0
    pcie_gen: int = 5
    pcie_width: int = 16
    max_pcie_gen: int = 5
    max_pcie_width: int = 16
    ecc_sbe_volatile: int = 0
    ecc_dbe_volatile: int = 0
    ecc_sbe_aggregate: int = 0
    ecc_dbe_aggregate: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    clock_event_reasons: int = 0
    temperature_c: int = 41
    # NVML's slowdown and shutdown thresholds, as a real H100 80GB HBM3 answered them (driver
    # 580.159.04, tests/fixtures/nvml/): 89 °C and 95 °C.
    temperature_slowdown_c: int = 89
    temperature_shutdown_c: int = 95
    power_mw: int = 118_000
    util_gpu: int = 0
    util_mem: int = 0
    sm_clock_mhz: int = 1980
    lost: bool = False
    slowdown: float = 1.0  # step-time factor a simulated training job reads (1.0: healthy)
    processes: list[int] = field(default_factory=list)  # pids of compute processes on the GPU
    # What the training rank on this GPU does next (a hang scenario's fault, played once by a
    # simulated job with rank processes: "stop", "exit", "stuck", "desync"; "" nothing).
    rank_fault: str = ""
    wedged: bool = False  # the driver is wedged on it (nvml_hang): its rank's kernels never end
    resets: int = 0
    reset_fails: bool = False  # the driver cannot reset it (nvidia-smi answers an error)
    # A reset waits until this is set, as a real one takes seconds (None: it does not wait).
    reset_gate: threading.Event | None = None
    ecc_mode: int = 1  # current ECC mode (1 enabled)
    ecc_mode_pending: int = 1  # what it becomes after the next reset
    persistence_mode: int = 1
    vbios_version: str = "96.00.99.00.01"  # the format a real H100's is in: 96.00.XX.00.XX
    # Capabilities this GPU lacks, by NVML field id or pynvml function name (architecture quirks).
    unsupported: set[int | str] = field(default_factory=set)
    # Every NVML call on the GPU answers NVML_ERROR_UNKNOWN (nvidia-smi: "Unable to determine the
    # device handle for GPU ...: Unknown Error"): a GPU the driver can no longer talk to.
    unknown_error: bool = False

    def __post_init__(self) -> None:
        """Give every link its error counters."""
        if not self.nvlink_errors:
            self.nvlink_errors = [[0, 0, 0] for _ in self.nvlink_up]

    @property
    def nvml_bus_id(self) -> str:
        """The bus id as NVML prints it: 8-digit domain, uppercase."""
        return f"00000000:{self.bus:02X}:00.0"

    @property
    def sysfs_bus_id(self) -> str:
        """The bus id as sysfs and udev name it."""
        return f"0000:{self.bus:02x}:00.0"

    @property
    def kernel_bus_id(self) -> str:
        """The bus id as the driver's Xid lines print it: 4-digit domain, no function."""
        return f"0000:{self.bus:02x}:00"


@dataclass(slots=True)
class SimIbPort:
    """One simulated InfiniBand port."""

    device: str
    port: int = 1
    state: str = "ACTIVE"
    phys_state: str = "LinkUp"
    link_downed: int = 0
    xmit_wait_per_s: float = 0.0  # congestion: ticks the sender waited, per second
    traffic_bytes_per_s: float = 0.0
    rate_gbps: int = 400  # the rate the port trained at (NDR: 400 Gb/s)
    symbol_errors: int = 0  # physical-layer errors so far (what the counters were told)
    rcv_errors: int = 0


def _answered(probe: Mapping[str, Any], call: str, default: Any) -> Any:  # noqa: ANN401 - JSON
    answer = probe.get("calls", {}).get(call, {})
    return answer.get("value", default) if answer.get("status") == "ok" else default


def gpu_from_probe(probe: Mapping[str, Any], index: int = 0, uuid: str = "GPU-sim-0") -> SimGpu:
    """A simulated GPU like the one an NVML probe recorded (``agent.sources.nvml_probe``).

    Its model, NVLink count, PCIe link, temperature thresholds, ECC and persistence modes and
    VBIOS come from the record; what moves (temperature, power, clocks) keeps the defaults.
    """
    links = int(probe.get("nvlink_count", 0))
    ecc = _answered(probe, "nvmlDeviceGetEccMode", [1, 1])
    return SimGpu(
        index=index,
        uuid=uuid,
        bus=0x18 + index,
        model=str(_answered(probe, "nvmlDeviceGetName", H100_MODEL)),
        nvlink_up=[True] * links,
        pcie_gen=int(_answered(probe, "nvmlDeviceGetCurrPcieLinkGeneration", 5)),
        pcie_width=int(_answered(probe, "nvmlDeviceGetCurrPcieLinkWidth", 16)),
        max_pcie_gen=int(_answered(probe, "nvmlDeviceGetMaxPcieLinkGeneration", 5)),
        max_pcie_width=int(_answered(probe, "nvmlDeviceGetMaxPcieLinkWidth", 16)),
        temperature_slowdown_c=int(
            _answered(probe, "nvmlDeviceGetTemperatureThreshold(SLOWDOWN)", 89)
        ),
        temperature_shutdown_c=int(
            _answered(probe, "nvmlDeviceGetTemperatureThreshold(SHUTDOWN)", 95)
        ),
        ecc_mode=int(ecc[0]),
        ecc_mode_pending=int(ecc[1]),
        persistence_mode=int(_answered(probe, "nvmlDeviceGetPersistenceMode", 1)),
        vbios_version=str(_answered(probe, "nvmlDeviceGetVbiosVersion", "96.00.99.00.01")),
    )
