"""A simulated GPU node: the state behind the simulated NVML library, sysfs tree, kmsg and udev.

Faults change this state *and* leave the evidence the real fault leaves in every source it would
touch: an Xid 79 writes the driver's kernel log line and makes every NVML call on that GPU raise
GPU-lost; an IB port going down changes ``state``/``phys_state`` and bumps ``link_downed``.
"""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from typing import TYPE_CHECKING

from agent.jobs.stacks import SimulatedDumper
from agent.sim.bmc import SimBmc
from agent.sim.devices import H100_BUSES, H100_NVLINKS, SimGpu, SimIbPort
from agent.sim.kmsg import SimKmsg
from agent.sim.nvml_lib import EVENT_DBE, EVENT_XID, SimNvmlLibrary
from agent.sim.sysfs_tree import SimSysfsTree
from agent.sim.udev import SimUdev
from agent.sources.udev import UdevEvent

if TYPE_CHECKING:
    from pathlib import Path

    from fleetwatch.clock import Clock

NDR_RATE = "400 Gb/sec (4X NDR)"
# What the kernel's ``rate`` file says for a 4X port trained at each speed (ib_rate_low).
IB_RATE_TEXT = {
    400: NDR_RATE,
    200: "200 Gb/sec (4X HDR)",
    100: "100 Gb/sec (4X EDR)",
    56: "56 Gb/sec (4X FDR)",
    40: "40 Gb/sec (4X QDR)",
    20: "20 Gb/sec (4X DDR)",
    10: "10 Gb/sec (4X SDR)",
}
LINK_DOWNED_MAX = 255  # 8-bit counter; IB error counters saturate, they do not wrap
XID_DBE = 48
XID_REMAP_RECORDED = 63
XID_REMAP_FAILED = 64
XID_FALLEN_OFF_BUS = 79
RESET_GATE_WAIT_S = 60.0  # a held reset gives up after this, as nvidia-smi's own limit would
THERMAL_REASONS = 0x20 | 0x40  # SW and HW thermal slowdown
PCIE_GEN_SPEEDS = {
    1: "2.5 GT/s PCIe",
    2: "5.0 GT/s PCIe",
    3: "8.0 GT/s PCIe",
    4: "16.0 GT/s PCIe",
    5: "32.0 GT/s PCIe",
}


_STATE_CODES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
_PHYS_CODES = {"Sleep": 1, "Polling": 2, "Disabled": 3, "LinkUp": 5, "LinkErrorRecovery": 6}


def _stable_uuid(*parts: str) -> str:
    digest = hashlib.sha256("/".join(parts).encode()).digest()[:16]
    return str(uuidlib.UUID(bytes=digest))


class SimNode:
    """An 8-GPU, 8-port node whose sources are simulated but read by the real source code."""

    def __init__(  # noqa: PLR0913 - shape of the simulated node
        self,
        name: str,
        sysfs_root: Path,
        clock: Clock,
        *,
        gpus: int = 8,
        nvlinks: int = H100_NVLINKS,
        ib_ports: int = 8,
    ) -> None:
        """Build the node and write its sysfs tree under ``sysfs_root``."""
        self.name = name
        self.boot_id = _stable_uuid(name, "boot")
        self.bmc = SimBmc()  # fans, power supplies, temperatures and SEL, served as Redfish
        self.clock = clock
        self.gpus = [
            SimGpu(
                index=i,
                uuid=f"GPU-{_stable_uuid(name, 'gpu', str(i))}",
                bus=H100_BUSES[i % len(H100_BUSES)] + i // len(H100_BUSES),
                nvlink_up=[True] * nvlinks,
            )
            for i in range(gpus)
        ]
        self.ib_ports = [SimIbPort(device=f"mlx5_{i}") for i in range(ib_ports)]
        self.nvml = SimNvmlLibrary(self.gpus)
        self.kmsg = SimKmsg(clock)
        self.udev = SimUdev()
        self.sysfs = SimSysfsTree(sysfs_root)
        for port in self.ib_ports:
            self._write_port(port)
        # HGX layout: root port, switch upstream and downstream ports, then the GPU. Only for
        # GPUs whose buses leave room for the ports (the standard eight).
        self.pcie_paths: dict[int, tuple[str, ...]] = {}
        # Faults with no counter: a slow GPU pair (by the pair's indices, lower first) and a
        # bad cable to another node on one rail (by peer node and port index), as factors.
        self.p2p_factors: dict[tuple[int, int], float] = {}
        self.cable_factors: dict[tuple[str, int], float] = {}
        # What py-spy would read of the node's rank processes (simulated: they run no training
        # code), and until when a stalled filesystem holds the jobs on the node (monotonic).
        self.stacks = SimulatedDumper()
        self.stall_until = 0.0
        if gpus <= len(H100_BUSES):
            for g in self.gpus:
                self.pcie_paths[g.index] = self.sysfs.write_gpu_pcie_path(g.sysfs_bus_id)

    def _write_port(self, port: SimIbPort) -> None:
        self.sysfs.write_ib_port(
            port.device,
            port.port,
            state=f"{_STATE_CODES[port.state]}: {port.state}",
            phys_state=f"{_PHYS_CODES[port.phys_state]}: {port.phys_state}",
            rate=IB_RATE_TEXT.get(port.rate_gbps, f"{port.rate_gbps} Gb/sec"),
            link_layer="InfiniBand",
            counters={"link_downed": port.link_downed},
        )

    # ---- faults: each leaves the evidence the real one leaves in every source ------------------

    def xid(self, gpu: int, xid: int, message: str = "") -> None:
        """The driver reports an Xid on ``gpu`` (kernel line and NVML event).

        Xid 79 also takes the GPU off the bus: NVML answers GPU-lost from then on, the kernel
        removes its PCI function and udev says so.
        """
        g = self.gpus[gpu]
        if xid == XID_FALLEN_OFF_BUS:
            message = message or "GPU has fallen off the bus."
        text = message or "Graphics Exception"
        self.kmsg.write(
            f"NVRM: Xid (PCI:{g.kernel_bus_id}): {xid}, pid='<unknown>', name=<unknown>, {text}",
        )
        self.nvml.post(g, EVENT_XID, xid)
        if xid == XID_FALLEN_OFF_BUS:
            self.pci_remove(gpu)

    def pci_remove(self, gpu: int) -> None:
        """The kernel removes the GPU's PCI function (hot remove or failed recovery)."""
        g = self.gpus[gpu]
        if g.lost:
            return
        g.lost = True
        bus_id = g.sysfs_bus_id
        if gpu in self.pcie_paths:
            self.sysfs.remove_pci_function(bus_id)
        self.udev.push(UdevEvent("remove", "pci", bus_id, {"PCI_SLOT_NAME": bus_id}))

    def nvlink_down(self, gpu: int, link: int) -> None:
        """One NVLink of ``gpu`` goes down (the link layer counts a failed recovery)."""
        g = self.gpus[gpu]
        g.nvlink_up[link] = False
        g.nvlink_errors[link][1] += 1

    def nvlink_up(self, gpu: int, link: int) -> None:
        """One NVLink of ``gpu`` comes back."""
        self.gpus[gpu].nvlink_up[link] = True

    def nvlink_errors(self, gpu: int, link: int, *, replay: int, recovery: int, crc: int) -> None:
        """A burst of NVLink data-link errors on one link (counters only grow)."""
        counters = self.gpus[gpu].nvlink_errors[link]
        for i, n in enumerate((replay, recovery, crc)):
            counters[i] += max(n, 0)

    def pcie_replays(self, gpu: int, count: int) -> None:
        """The GPU's link replays ``count`` TLPs: NVML's counter, AER in sysfs and the log."""
        g = self.gpus[gpu]
        count = max(count, 0)
        g.pcie_replays += count
        if count == 0 or g.lost or gpu not in self.pcie_paths:
            return
        self.sysfs.add_aer_errors(g.sysfs_bus_id, "correctable", {"Timeout": count})
        port = self.pcie_paths[gpu][1]
        bdf = g.sysfs_bus_id
        self.kmsg.write(f"pcieport {port}: AER: Corrected error received: {bdf}", level=6)
        self.kmsg.write(
            f"nvidia {bdf}: PCIe Bus Error: severity=Corrected, type=Data Link Layer, "
            "(Transmitter ID)",
        )
        self.kmsg.write(f"nvidia {bdf}:   device [10de:2330] error status/mask=00001000/0000e000")
        self.kmsg.write(f"nvidia {bdf}:    [12] Timeout               ")

    def pcie_downgrade(self, gpu: int, *, gen: int, width: int) -> None:
        """The GPU's link retrains slower or narrower (NVML and both ends in sysfs agree)."""
        g = self.gpus[gpu]
        g.pcie_gen, g.pcie_width = gen, width
        if gpu in self.pcie_paths:
            speed = PCIE_GEN_SPEEDS.get(gen, "32.0 GT/s PCIe")
            for bdf in self.pcie_paths[gpu][:2]:  # the GPU and the port it plugs into
                self.sysfs.set_pci_link(bdf, speed=speed, width=width)

    def ecc_errors(self, gpu: int, *, sbe: int = 0, dbe: int = 0) -> None:
        """Memory errors: single-bit ones are corrected, double-bit ones are not.

        A double-bit error also logs Xid 48 and leaves a row remap pending, as on A100/H100.
        """
        g = self.gpus[gpu]
        g.ecc_sbe_volatile += max(sbe, 0)
        g.ecc_sbe_aggregate += max(sbe, 0)
        if dbe > 0:
            g.ecc_dbe_volatile += dbe
            g.ecc_dbe_aggregate += dbe
            self.nvml.post(g, EVENT_DBE, 0)
            self.xid(gpu, XID_DBE, "An uncorrectable double bit error (DBE) has been detected.")
            self.remap(gpu, pending=True)

    def remap(self, gpu: int, *, pending: bool = False, failure: bool = False) -> None:
        """Row remapping: pending (Xid 63, a reset applies it) or failed (Xid 64)."""
        g = self.gpus[gpu]
        if pending and not g.remap_pending:
            g.remap_pending = True
            g.remapped_uncorrectable += 1
            self.xid(gpu, XID_REMAP_RECORDED, "Row remapping event recorded.")
        if failure and not g.remap_failure:
            g.remap_failure = True
            self.xid(gpu, XID_REMAP_FAILED, "Row remapping failed.")

    def thermal(self, gpu: int, temperature_c: int | None) -> None:
        """Thermal throttling at ``temperature_c``; None ends it."""
        g = self.gpus[gpu]
        if temperature_c is None:
            g.clock_event_reasons &= ~THERMAL_REASONS
            g.temperature_c, g.sm_clock_mhz = 41, 1980
        else:
            g.clock_event_reasons |= THERMAL_REASONS
            g.temperature_c, g.sm_clock_mhz = temperature_c, 1305

    def reset_gpu(self, gpu: int) -> tuple[bool, str]:
        """What ``nvidia-smi --gpu-reset`` does: clear volatile state, apply remaps, retrain links.

        A GPU that fell off the bus cannot be reached by a reset.
        """
        g = self.gpus[gpu]
        if g.lost:
            return False, f"GPU {gpu} is lost: a reset cannot reach it (reboot the node)"
        if g.processes:
            return False, f"GPU {gpu} is in use by {len(g.processes)} processes"
        if g.reset_fails:
            return False, f"Unable to reset GPU {g.nvml_bus_id}: Unknown Error"
        if g.reset_gate is not None and not g.reset_gate.wait(RESET_GATE_WAIT_S):
            return False, f"GPU {gpu} reset timed out"
        g.resets += 1
        g.ecc_sbe_volatile = g.ecc_dbe_volatile = 0
        g.remap_pending = False
        g.nvlink_up = [True] * len(g.nvlink_up)
        g.clock_event_reasons = 0
        self.kmsg.write(f"NVRM: GPU at PCI:{g.kernel_bus_id}: GPU reset completed")
        return True, f"GPU {gpu} reset"

    def nvml_hang(self, gpu: int) -> None:
        """NVML calls on ``gpu`` (and NVML event waits) block until :meth:`nvml_hang_clear`.

        What a wedged driver or a GPU falling off the bus mid-call does; the kernel log, udev
        and sysfs go on working.
        """
        self.nvml.hang(self.gpus[gpu])
        self.gpus[gpu].wedged = True

    def nvml_hang_clear(self, gpu: int | None = None) -> None:
        """The blocked NVML calls on ``gpu`` (None: on every GPU) return."""
        self.nvml.release(None if gpu is None else self.gpus[gpu])
        for g in self.gpus if gpu is None else [self.gpus[gpu]]:
            g.wedged = False

    def rank_fault(self, gpu: int, what: str) -> None:
        """The training rank on ``gpu`` plays ``what`` next (a simulated job reads it)."""
        self.gpus[gpu].rank_fault = what

    def stall(self, seconds: float) -> None:
        """Every job's ranks on the node block outside their collectives for ``seconds``."""
        self.stall_until = self.clock.monotonic() + seconds

    def slow(self, gpu: int, factor: float) -> None:
        """The GPU computes ``factor`` times slower (a training job's step time grows)."""
        self.gpus[gpu].slowdown = max(factor, 1.0)

    def ib_port_down(self, port: int) -> None:
        """An IB port loses its link: DOWN/Polling, and ``link_downed`` counts it."""
        p = self.ib_ports[port]
        if p.state == "ACTIVE":
            p.link_downed = min(p.link_downed + 1, LINK_DOWNED_MAX)
            self.sysfs.add_ib_counters(p.device, p.port, {"link_error_recovery": 1})
        p.state, p.phys_state = "DOWN", "Polling"
        self._write_port(p)

    def ib_port_up(self, port: int) -> None:
        """An IB port trains and becomes ACTIVE again."""
        p = self.ib_ports[port]
        p.state, p.phys_state = "ACTIVE", "LinkUp"
        self._write_port(p)

    def ib_errors(self, port: int, *, symbol_errors: int = 0, rcv_errors: int = 0) -> None:
        """Physical-layer errors on an IB port (16-bit counters; they saturate)."""
        p = self.ib_ports[port]
        p.symbol_errors += max(symbol_errors, 0)
        p.rcv_errors += max(rcv_errors, 0)
        self.sysfs.add_ib_counters(
            p.device,
            p.port,
            {"symbol_error": max(symbol_errors, 0), "port_rcv_errors": max(rcv_errors, 0)},
        )

    # ---- faults that leave no counter behind (pre-flight measurements find them) --------------

    def p2p_low(self, gpu: int, peer: int, factor: float) -> None:
        """Copies between ``gpu`` and ``peer`` run at ``factor`` of their bandwidth.

        No NVLink is down and no error counter moves: what a marginal NVSwitch path or a
        mis-set peer mapping looks like, found only by measuring the pair.
        """
        if gpu == peer or not (0 <= peer < len(self.gpus)) or not (0 <= gpu < len(self.gpus)):
            msg = f"GPU pair {gpu}-{peer} is not two GPUs of {self.name}"
            raise IndexError(msg)
        self.p2p_factors[min(gpu, peer), max(gpu, peer)] = min(max(factor, 0.0), 1.0)

    def ib_rate(self, port: int, rate_gbps: int) -> None:
        """An IB port trains at ``rate_gbps`` (its ``rate`` file says so; it stays ACTIVE)."""
        p = self.ib_ports[port]
        p.rate_gbps = rate_gbps
        self._write_port(p)

    def bad_cable(self, peer: str, port: int, factor: float) -> None:
        """Traffic between this node and ``peer`` on rail ``port`` runs at ``factor``.

        Both ends test fine against every other node; no counter on either end moves.
        """
        if not 0 <= port < len(self.ib_ports):
            msg = f"no IB port {port} on {self.name}"
            raise IndexError(msg)
        self.cable_factors[peer, port] = min(max(factor, 0.0), 1.0)

    def driver_version(self, version: str) -> None:
        """The node runs another NVIDIA driver than the rest (NVML reports it)."""
        self.nvml.driver_version = version

    def ib_congestion(self, port: int, xmit_wait_per_s: float) -> None:
        """The port waits to send ``xmit_wait_per_s`` ticks a second (0 ends it)."""
        self.ib_ports[port].xmit_wait_per_s = max(xmit_wait_per_s, 0.0)

    def tick(self, seconds: float) -> None:
        """Let ``seconds`` pass: traffic and congestion move the counters of ACTIVE ports."""
        for p in self.ib_ports:
            if p.state != "ACTIVE" or seconds <= 0:
                continue
            if p.traffic_bytes_per_s:
                moved = int(p.traffic_bytes_per_s * seconds)
                self.sysfs.add_ib_traffic(p.device, p.port, xmit_bytes=moved, rcv_bytes=moved)
            if p.xmit_wait_per_s:
                waited = int(p.xmit_wait_per_s * seconds)
                self.sysfs.add_ib_counters(p.device, p.port, {"port_xmit_wait": waited})
