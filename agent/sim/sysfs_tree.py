"""A sysfs tree on disk laid out like the kernel's, for the real sysfs readers to read.

InfiniBand: ``class/infiniband/<dev>/ports/<n>/`` with ``state``, ``phys_state``, ``rate``,
``link_layer``, every IBA counter in ``counters/`` and the mlx5 set in ``hw_counters/``.
Counter files hold raw hardware values: ``port_xmit_data``/``port_rcv_data`` count 4-octet words.

PCI: ``devices/<host bridge>/<root port>/.../<bdf>/`` with link speed/width and AER files, and
``bus/pci/devices/<bdf>`` as a relative symlink into it, as the kernel does.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from agent.probes.counters import (
    DEFAULT_SPEC,
    IB_COUNTER_SPECS,
    IB_COUNTER_WIDTH_BITS,
    MLX5_HW_COUNTER_SPECS,
)
from agent.probes.pci import normalize_bus_id
from agent.sources.pci_sysfs import AER_FILES, ROOTPORT_FILES, parse_aer_counts

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

MLX5_HW_COUNTERS = tuple(MLX5_HW_COUNTER_SPECS)
HW_COUNTER_LIFESPAN_MS = 10
# Error names as current kernels print them in aer_dev_* (drivers/pci/pcie/aer.c).
# (SIM905: a word list reads better here than one quoted string per line.)
AER_CORRECTABLE_NAMES = tuple(
    "RxErr BadTLP BadDLLP Rollover Timeout NonFatalErr CorrIntErr HeaderOF".split(),  # noqa: SIM905
)
AER_UNCORRECTABLE_NAMES = tuple(
    (  # noqa: SIM905
        "Undefined DLP SDES TLP FCP CmpltTO CmpltAbrt UnxCmplt RxOF MalfTLP ECRC UnsupReq"
        " ACSViol UncorrIntErr BlockedTLP AtomicOpBlocked TLPBlockedErr PoisonTLPBlocked"
    ).split(),
)
# severity -> (aer_dev_* file, total line, names, aer_rootport_total_err_* file)
_AER = {
    "correctable": (AER_FILES[0], "TOTAL_ERR_COR", AER_CORRECTABLE_NAMES, ROOTPORT_FILES[0]),
    "nonfatal": (AER_FILES[1], "TOTAL_ERR_NONFATAL", AER_UNCORRECTABLE_NAMES, ROOTPORT_FILES[2]),
    "fatal": (AER_FILES[2], "TOTAL_ERR_FATAL", AER_UNCORRECTABLE_NAMES, ROOTPORT_FILES[1]),
}
GEN5 = "32.0 GT/s PCIe"
H100_PCI_IDS = {"vendor": "0x10de", "device": "0x2330", "class": "0x030200"}
PCIE_SWITCH_IDS = {"vendor": "0x1000", "device": "0xc030", "class": "0x060400"}
CX7_PCI_IDS = {"vendor": "0x15b3", "device": "0x1021", "class": "0x020700"}
SIM_HCA_FIRMWARE = "28.39.1002"  # a ConnectX-7 firmware version, as fw_ver prints it
ROOT_PORT_IDS = {"vendor": "0x8086", "device": "0x352a", "class": "0x060400"}


class SimSysfsTree:
    """Writes InfiniBand port and PCI function files under a root directory."""

    __slots__ = ("root",)

    def __init__(self, root: Path) -> None:
        """Create the root if needed."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _write(path: Path, text: str) -> None:
        """Rewrite a file in place, like a sysfs attribute whose value changed.

        In place, not by rename: readers keep counter files open and re-read them from offset 0,
        as they do on a real node, and must see the new value through the same descriptor.
        """
        path.write_text(text + "\n", "ascii")

    def _port(self, device: str, port: int) -> Path:
        return self.root / "class" / "infiniband" / device / "ports" / str(port)

    # ---- InfiniBand ---------------------------------------------------------------------------

    def write_ib_port(  # noqa: PLR0913 - one argument per sysfs file
        self,
        device: str,
        port: int,
        *,
        state: str,
        phys_state: str,
        rate: str,
        link_layer: str,
        counters: Mapping[str, int],
        hw_counters: Mapping[str, int] | None = None,
    ) -> None:
        """Write (or rewrite) one port's files.

        The first write creates every IBA counter and every mlx5 hw counter at zero (a freshly
        loaded driver); later writes change only the counters they name.
        """
        base = self._port(device, port)
        if not (base.parent.parent / "fw_ver").exists():  # a new HCA: its firmware and function
            self.write_hca(device, fw_ver=SIM_HCA_FIRMWARE, pci_function=self._new_hca_function())
        if not (base / "counters").is_dir():
            (base / "counters").mkdir(parents=True)
            (base / "hw_counters").mkdir()
            for name in IB_COUNTER_WIDTH_BITS:
                self._write(base / "counters" / name, "0")
            for name in MLX5_HW_COUNTERS:
                self._write(base / "hw_counters" / name, "0")
            self._write(base / "hw_counters" / "lifespan", str(HW_COUNTER_LIFESPAN_MS))
        self._write(base / "state", state)
        self._write(base / "phys_state", phys_state)
        self._write(base / "rate", rate)
        self._write(base / "link_layer", link_layer)
        for name, value in counters.items():
            self._write(base / "counters" / name, str(value))
        for name, value in (hw_counters or {}).items():
            self._write(base / "hw_counters" / name, str(value))

    def _new_hca_function(self) -> str:
        """A PCI function for the next HCA, on a root bus of its own (domain 0001)."""
        hcas = self.root / "class" / "infiniband"
        count = sum(1 for _ in hcas.iterdir()) if hcas.is_dir() else 0
        bus = 0x10 + count % 0xE0
        bdf = f"0001:{bus:02x}:00.0"
        self.write_pci_function(bdf, host_bridge=f"pci0001:{bus:02x}", attrs=CX7_PCI_IDS)
        return bdf

    def write_hca(self, device: str, *, fw_ver: str, pci_function: str | None = None) -> None:
        """Write an HCA's ``fw_ver`` and, given its PCI function, its ``device`` link to it."""
        base = self.root / "class" / "infiniband" / device
        base.mkdir(parents=True, exist_ok=True)
        self._write(base / "fw_ver", fw_ver)
        link = base / "device"
        if pci_function is not None and not link.is_symlink():
            target = self._pci_link(normalize_bus_id(pci_function)).resolve(strict=True)
            link.symlink_to(os.path.relpath(target, base))

    def add_ib_counters(
        self,
        device: str,
        port: int,
        counters: Mapping[str, int] | None = None,
        hw_counters: Mapping[str, int] | None = None,
    ) -> None:
        """Count more events the way the HCA does.

        Narrow IBA counters stop at their maximum; 64-bit and hw counters wrap at their width.
        Data counters are given in 4-octet words, as the files hold them.
        """
        base = self._port(device, port)
        for sub, adds, specs in (
            ("counters", counters, IB_COUNTER_SPECS),
            ("hw_counters", hw_counters, MLX5_HW_COUNTER_SPECS),
        ):
            for name, add in (adds or {}).items():
                spec = specs.get(name, DEFAULT_SPEC)
                path = base / sub / name
                value = int(path.read_text("ascii")) + add
                self._write(
                    path,
                    str(min(value, spec.max_value) if spec.saturates else value % spec.modulus),
                )

    def add_ib_traffic(
        self,
        device: str,
        port: int,
        *,
        xmit_bytes: int,
        rcv_bytes: int,
        mtu: int = 4096,
    ) -> None:
        """Move unicast traffic through a port: data in 4-octet words, packets of ``mtu``."""
        tx_pkts, rx_pkts = -(-xmit_bytes // mtu), -(-rcv_bytes // mtu)
        self.add_ib_counters(
            device,
            port,
            {
                "port_xmit_data": xmit_bytes // 4,
                "port_rcv_data": rcv_bytes // 4,
                "port_xmit_packets": tx_pkts,
                "port_rcv_packets": rx_pkts,
                "unicast_xmit_packets": tx_pkts,
                "unicast_rcv_packets": rx_pkts,
            },
        )

    def reset_ib_counters(self, device: str, port: int) -> None:
        """Zero every counter of a port, as a driver reload or an HCA reset does."""
        base = self._port(device, port)
        for sub in ("counters", "hw_counters"):
            for path in sorted((base / sub).iterdir()):
                if path.name != "lifespan" and not path.name.startswith("."):
                    self._write(path, "0")

    # ---- PCI ----------------------------------------------------------------------------------

    def _pci_link(self, bdf: str) -> Path:
        return self.root / "bus" / "pci" / "devices" / bdf

    def write_pci_function(  # noqa: PLR0913 - one argument per kind of sysfs file
        self,
        bdf: str,
        *,
        upstream: str | None = None,
        host_bridge: str = "pci0000:00",
        speed: str = GEN5,
        width: int = 16,
        aer: bool = True,
        root_port: bool = False,
        attrs: Mapping[str, str] | None = None,
    ) -> Path:
        """Write a PCI function below ``upstream`` (or on ``host_bridge``'s root bus).

        Current and maximum link speed/width start equal; ``attrs`` are extra files written as
        given (``vendor``, ``device``, ``class``). Rewriting an existing function keeps its AER
        counts. Returns the function's real directory.
        """
        bdf = normalize_bus_id(bdf)
        link = self._pci_link(bdf)
        if upstream is not None:
            parent = self._pci_link(normalize_bus_id(upstream)).resolve(strict=True)
        else:
            parent = self.root / "devices" / host_bridge
        base = parent / bdf
        if link.is_symlink() and link.resolve() != base:
            msg = f"PCI function {bdf} already exists under another parent"
            raise ValueError(msg)
        base.mkdir(parents=True, exist_ok=True)
        for name, text in {
            **(attrs or {}),
            "max_link_speed": speed,
            "max_link_width": str(width),
        }.items():
            self._write(base / name, text)
        self._write(base / "current_link_speed", speed)
        self._write(base / "current_link_width", str(width))
        for name, text in _aer_files(aer=aer, root_port=root_port).items():
            if not (base / name).exists():
                self._write(base / name, text)
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(base, link.parent))
        return base

    def set_pci_link(self, bdf: str, *, speed: str | None = None, width: int | None = None) -> None:
        """Change the negotiated link (a downtrain to Gen4 or x8); the maximum stays."""
        base = self._pci_link(normalize_bus_id(bdf))
        if speed is not None:
            self._write(base / "current_link_speed", speed)
        if width is not None:
            self._write(base / "current_link_width", str(width))

    def add_aer_errors(self, bdf: str, severity: str, counts: Mapping[str, int]) -> None:
        """Count AER errors of ``severity`` (correctable, nonfatal, fatal) on a function.

        The function's ``TOTAL_ERR_*`` grows by the sum, and so does the root port above it
        (or the function itself, if it is a root port), which received the error messages.
        """
        if severity not in _AER:
            msg = f"AER severity {severity!r} is not one of {', '.join(_AER)}"
            raise ValueError(msg)
        filename, total_line, _, rootport_file = _AER[severity]
        base = self._pci_link(normalize_bus_id(bdf)).resolve(strict=True)
        devices = (self.root / "devices").resolve()
        old = parse_aer_counts((base / filename).read_text("ascii"))
        merged = dict(old.counts)
        for name, add in counts.items():
            merged[name] = merged.get(name, 0) + add
        added = sum(counts.values())
        self._write(base / filename, _aer_text(merged, total_line, old.total + added))
        for path in (base, *base.parents):
            if not path.is_relative_to(devices):
                break
            if (path / rootport_file).exists():
                value = int((path / rootport_file).read_text("ascii")) + added
                self._write(path / rootport_file, str(value))
                break

    def remove_pci_function(self, bdf: str) -> None:
        """Take a function (and everything below it) off the bus, as a hot remove does."""
        link = self._pci_link(normalize_bus_id(bdf))
        base = link.resolve(strict=True)
        for other in sorted(link.parent.iterdir()):
            if other.resolve().is_relative_to(base):
                other.unlink()
        shutil.rmtree(base)

    def write_gpu_pcie_path(
        self, gpu_bdf: str, *, attrs: Mapping[str, str] | None = None
    ) -> tuple[str, ...]:
        """Write an HGX-style path: root port, PCIe switch up/downstream ports, then the GPU.

        For a GPU on bus B: root port ``(B-3):01.0`` on host bridge ``pci0000:(B-3)``, switch
        upstream port ``(B-2):00.0``, downstream port ``(B-1):00.0``. Returns the chain, GPU
        first. GPU buses must be at least 4 apart.
        """
        gpu = normalize_bus_id(gpu_bdf)
        domain, bus = gpu[:4], int(gpu[5:7], 16)
        if bus < 3:  # noqa: PLR2004 - three ports sit above the GPU
            msg = f"GPU bus {bus:#x} leaves no room for the ports above it"
            raise ValueError(msg)
        root = f"{domain}:{bus - 3:02x}:01.0"
        up, down = f"{domain}:{bus - 2:02x}:00.0", f"{domain}:{bus - 1:02x}:00.0"
        self.write_pci_function(
            root, host_bridge=f"pci{domain}:{bus - 3:02x}", root_port=True, attrs=ROOT_PORT_IDS
        )
        self.write_pci_function(up, upstream=root, attrs=PCIE_SWITCH_IDS)
        self.write_pci_function(down, upstream=up, attrs=PCIE_SWITCH_IDS)
        self.write_pci_function(gpu, upstream=down, attrs=attrs or H100_PCI_IDS)
        return gpu, down, up, root


def _aer_text(counts: Mapping[str, int], total_line: str, total: int) -> str:
    lines = [f"{name} {value}" for name, value in counts.items()]
    return "\n".join([*lines, f"{total_line} {total}"])


def _aer_files(*, aer: bool, root_port: bool) -> dict[str, str]:
    if not aer:
        return {}
    files = {
        filename: _aer_text(dict.fromkeys(names, 0), total_line, 0)
        for filename, total_line, names, _ in _AER.values()
    }
    if root_port:
        files.update(dict.fromkeys(ROOTPORT_FILES, "0"))
    return files
