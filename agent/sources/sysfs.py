"""sysfs source: InfiniBand ports under ``<root>/class/infiniband``.

Every path is relative to an injected root, so tests and the simulator point the same reader at a
tree of their own (``agent.sim.sysfs_tree`` writes one the way the kernel lays it out). PCIe link
state and AER counters are read by :mod:`agent.sources.pci_sysfs`.

Counter units: :meth:`SysfsReader.ib_port_counters` reports ``port_xmit_data`` and
``port_rcv_data`` (which count 4-octet words) in bytes, under the names ``port_xmit_bytes`` and
``port_rcv_bytes``; the raw names never appear in its result. Every other counter keeps its file
name and value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from agent.exceptions import SourceError
from agent.probes.counters import (
    IB_COUNTER_WIDTH_BITS,
    IB_DATA_COUNTERS,
    IB_DATA_OCTETS_PER_UNIT,
)
from agent.sources.sysfs_io import FdBudget, OpenFiles, list_dir, parse_uint, read_text
from fleetwatch.wire.validate import DEVICE_NAME, MAX_TEXT

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "IB_BASE_COUNTERS",
    "IB_COUNTER_WIDTH_BITS",
    "IB_DATA_COUNTERS",
    "IB_EXTENDED_ONLY_COUNTERS",
    "IbPortCounters",
    "IbPortInfo",
    "IbPortStatus",
    "SysfsReader",
    "no_pma",
    "parse_counter",
    "strip_enum",
]

log = structlog.get_logger("agent.sources.sysfs")

# Only HCAs with PortCountersExtended have these files; everything else in IB_COUNTER_WIDTH_BITS
# is always there, so a missing one is counted as a read error.
IB_EXTENDED_ONLY_COUNTERS = (
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
)
IB_BASE_COUNTERS = tuple(n for n in IB_COUNTER_WIDTH_BITS if n not in IB_EXTENDED_ONLY_COUNTERS)
_BASE_SET = frozenset(IB_BASE_COUNTERS)
# Files in hw_counters/ that are settings, not counters.
_HW_NOT_COUNTERS = frozenset({"lifespan"})
_MAX_PORT = 255  # IB port numbers are 8 bits, and port 0 is the switch's management port


@dataclass(frozen=True, slots=True)
class IbPortInfo:
    """An InfiniBand port as found at start-up."""

    device: str
    port: int
    rate: str
    link_layer: str


@dataclass(frozen=True, slots=True)
class IbPortStatus:
    """One poll of one port; each file is read on its own.

    What could not be read is unknown: ``""`` for a state, -1 for ``link_downed`` (also when
    not asked for, or when the device has no PMA to count it). ``unreadable`` names the files
    that failed (a device without a PMA is not among them).
    """

    state: str  # NOP, DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER
    phys_state: str  # Sleep, Polling, Disabled, PortConfigurationTraining, LinkUp, ...
    link_downed: int
    unreadable: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class IbPortCounters:
    """Every counter of one port: IBA ``counters/`` and driver-specific ``hw_counters/``.

    ``counters`` has the data counters in bytes (see the module docstring). ``unreadable`` names
    the files that were missing (base counters only) or held no number; ``read_errors`` counts
    them. Such a counter is simply absent from the dicts.
    """

    device: str
    port: int
    counters: Mapping[str, int]
    hw_counters: Mapping[str, int]
    unreadable: tuple[str, ...] = ()

    @property
    def read_errors(self) -> int:
        """How many counter files could not be read or parsed."""
        return len(self.unreadable)

    @property
    def extended(self) -> bool:
        """Whether the HCA has PortCountersExtended (its extended-only files are there).

        Without them the data and packet counters are the 32-bit ones, which stop at their top.
        """
        return any(name in self.counters for name in IB_EXTENDED_ONLY_COUNTERS)


def parse_counter(text: str | bytes) -> int | None:
    """Parse a sysfs counter (an unsigned decimal); None for anything else, empty included."""
    return parse_uint(text)


def no_pma(text: str | bytes) -> bool:
    """Whether a counter file says the device has no such counter.

    The kernel writes ``N/A (no PMA)`` for devices without a performance management agent
    (iWARP ones, say).
    """
    if isinstance(text, bytes):
        return text.strip().startswith(b"N/A")
    return text.strip().startswith("N/A")


def strip_enum(text: str) -> str:
    """Turn sysfs ``"4: ACTIVE"`` into ``"ACTIVE"`` (and leave ``"ACTIVE"`` alone)."""
    head, sep, tail = text.strip().partition(":")
    return tail.strip() if sep and head.strip().isdigit() else text.strip()


class SysfsReader:
    """Reads InfiniBand port files below ``root`` (``/sys`` on a real node)."""

    __slots__ = ("_budget", "_files", "_ib", "root")

    def __init__(self, root: Path = Path("/sys"), fd_budget: FdBudget | None = None) -> None:
        """Resolve nothing yet; a missing tree simply means no IB ports.

        Counter files are kept open between reads, as many as ``fd_budget`` allows (share one
        budget between all readers of a process; the default keeps none open).
        """
        self.root = root
        self._ib = root / "class" / "infiniband"
        self._files: dict[str, OpenFiles] = {}
        self._budget = fd_budget if fd_budget is not None else FdBudget(0)

    def close(self) -> None:
        """Close the counter files kept open."""
        for kept in self._files.values():
            kept.close()
        self._files.clear()

    def _read(self, path: Path | str) -> str:
        try:
            return read_text(path if isinstance(path, str) else str(path)).strip()
        except OSError as exc:
            msg = f"cannot read {path}: {exc.strerror or exc}"
            raise SourceError("sysfs", msg) from exc

    def ib_ports(self) -> list[IbPortInfo]:
        """List every port of every HCA, sorted by device then port.

        Only what the wire can carry is listed: an HCA whose name is no device name, or a port
        numbered outside 1-255 or not as the kernel writes numbers (``01``), is skipped (and
        logged), and ``rate`` and ``link_layer`` are cut
        to the wire's text limit, so an odd tree cannot make the node's Hello invalid.
        """
        if not self._ib.is_dir():
            return []
        found: list[IbPortInfo] = []
        for dev in sorted(self._ib.iterdir()):
            ports = dev / "ports"
            if not ports.is_dir():
                continue
            if DEVICE_NAME.fullmatch(dev.name) is None:
                log.warning("ib_device_skipped", device=dev.name[:80], why="not a device name")
                continue
            for port_dir in sorted(ports.iterdir(), key=lambda p: (len(p.name), p.name)):
                name = port_dir.name
                if not (name.isascii() and name.isdigit()):
                    continue
                # "01" would be port 1 a second time, and the Hello would be refused.
                if not 1 <= int(name) <= _MAX_PORT or name != str(int(name)):
                    log.warning("ib_port_skipped", device=dev.name, port=name[:20])
                    continue
                found.append(
                    IbPortInfo(
                        device=dev.name,
                        port=int(name),
                        rate=self._read_or_unknown(port_dir / "rate")[:MAX_TEXT],
                        link_layer=self._read_or_unknown(port_dir / "link_layer")[:MAX_TEXT],
                    ),
                )
        return found

    def _read_or_unknown(self, path: Path) -> str:
        """A port's description file, or "" when it cannot be read: the port is still listed."""
        try:
            return self._read(path)
        except SourceError as exc:
            log.warning("ib_port_file_unreadable", error=str(exc)[:200])
            return ""

    def ib_port_status(
        self,
        device: str,
        port: int,
        *,
        link_downed: bool = True,
    ) -> IbPortStatus:
        """Read state, physical state and (unless told not to) ``link_downed`` of one port.

        ``link_downed`` is -1 when not read (the caller reads all counters anyway).
        """
        base = f"{self._ib}/{device}/ports/{port}"
        if not os.path.isdir(base):  # noqa: PTH112 - the port went away: nothing is known
            msg = f"cannot read {base}: no such port"
            raise SourceError("sysfs", msg)
        unreadable: list[str] = []
        texts: dict[str, str] = {}
        for name in ("state", "phys_state", *(("counters/link_downed",) if link_downed else ())):
            try:
                texts[name] = self._read(f"{base}/{name}")
            except SourceError:
                unreadable.append(name)
        downed = -1
        downed_text = texts.get("counters/link_downed")
        if downed_text is not None and not no_pma(downed_text):
            parsed = parse_uint(downed_text)
            if parsed is None:
                unreadable.append("counters/link_downed")
            else:
                downed = parsed
        # Cut to what a sample may carry: a file of junk must not make the Report invalid.
        return IbPortStatus(
            state=strip_enum(texts.get("state", ""))[:MAX_TEXT],
            phys_state=strip_enum(texts.get("phys_state", ""))[:MAX_TEXT],
            link_downed=downed,
            unreadable=tuple(unreadable),
        )

    def ib_port_rate(self, device: str, port: int) -> str:
        """The port's ``rate`` file now (e.g. ``400 Gb/sec (4X NDR)``), cut to the wire's bound."""
        return self._read(f"{self._ib}/{device}/ports/{port}/rate")[:MAX_TEXT]

    def hca_firmware(self, device: str) -> str:
        """The HCA's firmware version (its ``fw_ver`` file, e.g. ``28.39.1002``)."""
        return self._read(f"{self._ib}/{device}/fw_ver")[:MAX_TEXT]

    def hca_pci_function(self, device: str) -> str | None:
        """The PCI function (``dddd:bb:dd.f``) behind the HCA's ``device`` link; None if none."""
        try:
            target = Path(f"{self._ib}/{device}/device").readlink()
        except OSError:
            return None
        return target.name or None

    def ib_port_counters(self, device: str, port: int) -> IbPortCounters:
        """Read every file of the port's ``counters/`` and ``hw_counters/`` directories.

        Each ``counters/`` read makes the kernel send a PMA MAD to the HCA, so poll this every
        few seconds at most. A counter that cannot be read is skipped and listed in
        ``unreadable``; a port that does not exist raises :class:`SourceError`.
        """
        base = f"{self._ib}/{device}/ports/{port}"
        if f"{base}/counters" not in self._files and not os.path.isdir(base):  # noqa: PTH112
            msg = f"cannot read {base}: no such port"
            raise SourceError("sysfs", msg)
        counters, bad = _read_counters(
            f"{base}/counters",
            _BASE_SET,
            self._files,
            self._budget,
        )
        for raw, name in IB_DATA_COUNTERS.items():
            if raw in counters:
                counters[name] = counters.pop(raw) * IB_DATA_OCTETS_PER_UNIT
        hw_counters, hw_bad = _read_counters(
            f"{base}/hw_counters",
            frozenset(),
            self._files,
            self._budget,
        )
        unreadable = tuple(bad) + tuple(f"hw_counters/{name}" for name in hw_bad)
        if unreadable:
            log.debug("ib_counters_skipped", device=device, port=port, counters=unreadable)
        return IbPortCounters(device, port, counters, hw_counters, unreadable)


def _read_counters(
    directory: str,
    expected: frozenset[str],
    files: dict[str, OpenFiles],
    budget: FdBudget,
) -> tuple[dict[str, int], list[str]]:
    """Read every counter file of ``directory`` plus the ``expected`` names, sorted by name.

    The directory's files are listed once and kept open (see :class:`OpenFiles`); after a file
    went missing (a driver reload can change the set) the directory is listed again.
    """
    kept = files.get(directory)
    if kept is None:
        names = tuple(sorted((set(list_dir(directory)) | expected) - _HW_NOT_COUNTERS))
        kept = files[directory] = OpenFiles(directory, names, budget)
    batch = kept.read()
    values: dict[str, int] = {}
    bad = batch.failed
    for name, raw in batch.data.items():
        value = parse_uint(raw)
        if value is not None:
            values[name] = value
        elif not no_pma(raw):  # a device without a PMA has no such counter: no error
            bad.append(name)
    if batch.missing:
        bad += [name for name in batch.missing if name in expected]
        kept.close()
        del files[directory]
    return values, sorted(bad)
