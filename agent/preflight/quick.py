"""Pre-flight's quick checks: what the agent reads of its node through NVML and sysfs anyway.

Seconds, no load on the GPUs: GPU count and model, NVLinks up, PCIe generation and width against
their maximum for the GPUs and the HCAs' PCI functions, each IB port's state and rate, ECC mode,
pending or failed row remaps, compute processes, persistence mode, and the versions the
collector compares across the nodes qualified (driver, CUDA, VBIOS, HCA firmware).

Every read goes through the sources the sampler uses (:class:`~agent.sources.nvml.NvmlSource`
under its deadline, :class:`~agent.sources.sysfs.SysfsReader`,
:class:`~agent.sources.pci_sysfs.PciSysfsReader`). This runs on the executor's thread, never on
the event loop. A value a source cannot give becomes a measurement whose ``error`` says why (the
check could not run); a lost GPU counts against ``gpu_count`` and its own checks are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from agent.exceptions import GpuLostError, SourceError
from agent.sources.nvml import cuda_version_text
from fleetwatch.preflight.vocabulary import LEVEL_OF, Check, Level, Measurement, parse_rate_gbps

if TYPE_CHECKING:
    from collections.abc import Collection

    from agent.poll.sampler import NodeInventory
    from agent.sources.nvml import GpuFacts, GpuIdentity, GpuReading, NvmlSource
    from agent.sources.pci_sysfs import PciLink, PciSysfsReader
    from agent.sources.sysfs import SysfsReader

QUICK_CHECKS: Final = frozenset(c for c, level in LEVEL_OF.items() if level is Level.QUICK)
_SHOWN_PIDS: Final = 8
# What a real H100 passed alone into a VM answers: NVLink queries NOT_SUPPORTED, no link counted.
NO_NVLINK: Final = (
    "NVML reports no NVLink on this GPU (its link queries answer not supported: a PCIe card, "
    "or a GPU passed into a VM without its NVLinks)"
)
NO_HCA: Final = (
    "no InfiniBand or RoCE port under /sys/class/infiniband (no HCA, or its driver not loaded)"
)


@dataclass(frozen=True, slots=True)
class _GpuRead:
    gpu: GpuIdentity
    reading: GpuReading | None
    facts: GpuFacts | None
    pids: list[int] | None
    error: str = ""
    lost: bool = False


def _read_gpu(nvml: NvmlSource, gpu: GpuIdentity) -> _GpuRead:
    try:
        return _GpuRead(gpu, nvml.read(gpu), nvml.facts(gpu), nvml.compute_processes(gpu))
    except GpuLostError as exc:
        return _GpuRead(gpu, None, None, None, error=str(exc), lost=True)
    except SourceError as exc:
        return _GpuRead(gpu, None, None, None, error=str(exc))


def _link_text(
    gen: int | None, width: int | None, max_gen: int | None, max_width: int | None
) -> str:
    def part(g: int | None, w: int | None) -> str:
        return f"gen{g if g is not None else '?'} x{w if w is not None else '?'}"

    return f"{part(gen, width)} (max {part(max_gen, max_width)})"


def _link_measurement(  # noqa: PLR0913 - the four numbers of a link
    check: Check,
    component: str,
    *,
    gen: int | None,
    width: int | None,
    max_gen: int | None,
    max_width: int | None,
) -> Measurement:
    """1 when the link trained at its maximum generation and width, 0 when below either."""
    text = _link_text(gen, width, max_gen, max_width)
    if None in (gen, width, max_gen, max_width):
        return Measurement(check, component, None, "ok", text=text, error=f"link unknown: {text}")
    at_max = gen == max_gen and width == max_width
    return Measurement(check, component, 1.0 if at_max else 0.0, "ok", text=text, evidence=text)


def _pci_link(link: PciLink) -> tuple[int | None, int | None, int | None, int | None]:
    cur, top = link.current_speed, link.max_speed
    return (
        None if cur is None else cur.generation,
        link.current_width,
        None if top is None else top.generation,
        link.max_width,
    )


class QuickChecks:
    """Runs the quick checks on one node; blocking (call it on a thread of its own)."""

    def __init__(self, nvml: NvmlSource, sysfs: SysfsReader, pci: PciSysfsReader) -> None:
        """Read through these sources (the executor's own sysfs readers, NVML shared)."""
        self._nvml = nvml
        self._sysfs = sysfs
        self._pci = pci

    def run(self, inventory: NodeInventory, checks: Collection[Check]) -> list[Measurement]:
        """Every asked quick check's measurements, in the vocabulary's order."""
        wanted = QUICK_CHECKS.intersection(checks)
        out: list[Measurement] = []
        if not wanted:
            return out
        gpu_reads = [_read_gpu(self._nvml, gpu) for gpu in inventory.gpus]
        if Check.GPU_COUNT in wanted:
            out.append(self._count(gpu_reads))
        for read in gpu_reads:
            if not read.lost:
                out.extend(m for m in self._gpu(read) if m.check in wanted)
        node_checks = {Check.DRIVER_VERSION, Check.CUDA_VERSION}
        if wanted & node_checks:
            out.extend(m for m in self._versions(inventory) if m.check in wanted)
        nic_checks = {Check.IB_PORT, Check.NIC_PCIE_LINK, Check.NIC_FIRMWARE}
        if wanted & nic_checks:
            out.extend(m for m in self._nics(inventory) if m.check in wanted)
        return out

    @staticmethod
    def _count(reads: list[_GpuRead]) -> Measurement:
        answering = [r for r in reads if not r.lost]
        lost = [f"GPU {r.gpu.index} ({r.gpu.uuid}) is lost: {r.error}" for r in reads if r.lost]
        models = sorted({r.gpu.model for r in answering})
        evidence = f"{len(reads)} GPUs found, {len(answering)} answer; " + ", ".join(models)
        if lost:
            evidence += "; " + "; ".join(lost)
        return Measurement(
            Check.GPU_COUNT,
            "node",
            float(len(answering)),
            "count",
            text=models[0] if len(models) == 1 else ", ".join(models),
            evidence=evidence,
        )

    @staticmethod
    def _gpu(read: _GpuRead) -> list[Measurement]:
        gpu, comp = read.gpu, f"gpu:{read.gpu.index}"
        out = [Measurement(Check.GPU_MODEL, comp, None, "", text=gpu.model, evidence=gpu.uuid)]
        reading, facts, pids = read.reading, read.facts, read.pids
        if reading is None or facts is None or pids is None:
            why = read.error or "NVML gave no reading"
            return out + [
                Measurement(check, comp, None, "", error=why)
                for check in (
                    Check.NVLINK_UP,
                    Check.GPU_PCIE_LINK,
                    Check.ECC_MODE,
                    Check.ROW_REMAP,
                    Check.COMPUTE_PROCESSES,
                    Check.PERSISTENCE_MODE,
                    Check.VBIOS_VERSION,
                )
            ]
        up = reading.nvlink_up
        down = [str(i) for i, state in enumerate(up) if not state]
        if gpu.nvlink_count == 0:
            evidence = NO_NVLINK
        else:
            evidence = f"links down: {', '.join(down)}" if down else "every link up"
        out.append(
            Measurement(
                Check.NVLINK_UP,
                comp,
                float(len(up) - len(down)),
                "links",
                text=f"{len(up) - len(down)}/{gpu.nvlink_count}",
                evidence=evidence,
            ),
        )
        out.append(
            _link_measurement(
                Check.GPU_PCIE_LINK,
                comp,
                gen=reading.pcie_gen,
                width=reading.pcie_width,
                max_gen=gpu.max_pcie_gen,
                max_width=gpu.max_pcie_width,
            ),
        )
        out.append(_flag(Check.ECC_MODE, comp, facts.ecc_enabled, f"pending {facts.ecc_pending}"))
        if reading.remap_pending is None or reading.remap_failure is None:
            out.append(Measurement(Check.ROW_REMAP, comp, None, "count", error="not supported"))
        else:
            remaps = int(reading.remap_pending) + int(reading.remap_failure)
            out.append(
                Measurement(
                    Check.ROW_REMAP,
                    comp,
                    float(remaps),
                    "count",
                    evidence=(
                        f"pending {reading.remap_pending}, failed {reading.remap_failure}, "
                        f"rows remapped {reading.remapped_correctable} correctable, "
                        f"{reading.remapped_uncorrectable} uncorrectable"
                    ),
                ),
            )
        shown = ", ".join(map(str, pids[:_SHOWN_PIDS]))
        out.append(
            Measurement(
                Check.COMPUTE_PROCESSES,
                comp,
                float(len(pids)),
                "count",
                evidence=f"pids {shown}" if pids else "none",
            ),
        )
        out.append(_flag(Check.PERSISTENCE_MODE, comp, facts.persistence_mode, ""))
        if facts.vbios_version is None:
            out.append(Measurement(Check.VBIOS_VERSION, comp, None, "", error="not supported"))
        else:
            out.append(Measurement(Check.VBIOS_VERSION, comp, None, "", text=facts.vbios_version))
        return out

    def _versions(self, inventory: NodeInventory) -> list[Measurement]:
        out = []
        if inventory.driver_version:
            out.append(
                Measurement(Check.DRIVER_VERSION, "node", None, "", text=inventory.driver_version)
            )
        else:
            out.append(Measurement(Check.DRIVER_VERSION, "node", None, "", error="not known"))
        try:
            cuda = self._nvml.cuda_driver_version()
        except SourceError as exc:
            out.append(Measurement(Check.CUDA_VERSION, "node", None, "", error=str(exc)))
        else:
            if cuda is None:
                out.append(Measurement(Check.CUDA_VERSION, "node", None, "", error="not supported"))
            else:
                text = cuda_version_text(cuda)
                out.append(
                    Measurement(Check.CUDA_VERSION, "node", None, "", text=text, evidence=str(cuda))
                )
        return out

    def _nics(self, inventory: NodeInventory) -> list[Measurement]:
        out: list[Measurement] = []
        if not inventory.ib_ports:  # the node's NIC (and so its gates) is not known
            return [
                Measurement(check, "node", None, "", error=NO_HCA)
                for check in (Check.IB_PORT, Check.NIC_FIRMWARE, Check.NIC_PCIE_LINK)
            ]
        for port in inventory.ib_ports:
            comp = f"ib:{port.device}/{port.port}"
            try:
                status = self._sysfs.ib_port_status(port.device, port.port, link_downed=False)
                rate = self._sysfs.ib_port_rate(port.device, port.port)
            except SourceError as exc:
                out.append(Measurement(Check.IB_PORT, comp, None, "Gb/s", error=str(exc)))
                continue
            gbps = parse_rate_gbps(rate)
            active = status.state == "ACTIVE"
            evidence = f"state {status.state}, phys_state {status.phys_state}, rate {rate}"
            if gbps is None and active:
                out.append(
                    Measurement(
                        Check.IB_PORT,
                        comp,
                        None,
                        "Gb/s",
                        error=f"rate {rate[:60]!r} names no Gb/s",
                        evidence=evidence,
                    ),
                )
                continue
            value = (gbps or 0.0) if active else 0.0
            out.append(
                Measurement(Check.IB_PORT, comp, value, "Gb/s", text=rate, evidence=evidence)
            )
        for device in sorted({port.device for port in inventory.ib_ports}):
            out.extend(self._hca(device))
        return out

    def _hca(self, device: str) -> list[Measurement]:
        comp = f"nic:{device}"
        out: list[Measurement] = []
        try:
            fw = self._sysfs.hca_firmware(device)
        except SourceError as exc:
            out.append(Measurement(Check.NIC_FIRMWARE, comp, None, "", error=str(exc)))
        else:
            out.append(Measurement(Check.NIC_FIRMWARE, comp, None, "", text=fw))
        bdf = self._sysfs.hca_pci_function(device)
        if bdf is None:
            why = f"{device} has no PCI function in sysfs"
            out.append(Measurement(Check.NIC_PCIE_LINK, comp, None, "ok", error=why))
            return out
        try:
            status = self._pci.function_status(bdf)
        except (SourceError, ValueError) as exc:
            out.append(Measurement(Check.NIC_PCIE_LINK, comp, None, "ok", error=str(exc)))
            return out
        gen, width, max_gen, max_width = _pci_link(status.link)
        out.append(
            _link_measurement(
                Check.NIC_PCIE_LINK,
                comp,
                gen=gen,
                width=width,
                max_gen=max_gen,
                max_width=max_width,
            ),
        )
        return out


def _flag(check: Check, component: str, on: bool | None, evidence: str) -> Measurement:  # noqa: FBT001
    if on is None:
        return Measurement(check, component, None, "flag", error="not supported by this GPU")
    return Measurement(check, component, 1.0 if on else 0.0, "flag", evidence=evidence)
