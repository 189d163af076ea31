"""sysfs source: PCIe link state and AER counters of PCI functions, under an injected root.

``<root>/bus/pci/devices/<bdf>`` is a symlink into the device hierarchy, e.g.
``../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0``. The parent
directories that are themselves PCI functions are the ports above the device, nearest first: the
switch downstream port a GPU hangs off, the switch upstream port, then the root port. Errors on a
link often show on the link partner, so a health check reads both ends.

Formats (``drivers/pci/pci-sysfs.c``, ``drivers/pci/pcie/aer.c``):

* ``current_link_speed``/``max_link_speed``: ``"32.0 GT/s PCIe"`` (kernels 5.7+) or ``"16 GT/s"``
  (older); ``"Unknown"``/``"Unknown speed"`` when the link is down.
* ``current_link_width``/``max_link_width``: a plain integer (0 when the link is down).
* ``aer_dev_correctable``/``aer_dev_nonfatal``/``aer_dev_fatal``: ``Name count`` lines (names may
  contain spaces on older kernels, e.g. ``Receiver Error 2``) ending with ``TOTAL_ERR_COR``/
  ``TOTAL_ERR_NONFATAL``/``TOTAL_ERR_FATAL``. Only AER-capable devices have them.
* ``aer_rootport_total_err_{cor,fatal,nonfatal}``: plain integers, root ports only.

GPUs lower their link speed when idle to save power, so a current speed below the maximum is not
a fault by itself; a width below the maximum is.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeVar

import structlog

from agent.exceptions import SourceError
from agent.probes.pci import normalize_bus_id
from agent.sources.sysfs import parse_counter
from agent.sources.sysfs_io import FileBatch, read_files

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

_T = TypeVar("_T")

__all__ = [
    "AER_FILES",
    "PCIE_GENERATIONS",
    "ROOTPORT_FILES",
    "AerCounts",
    "AerStats",
    "LinkSpeed",
    "PciFunctionStatus",
    "PciLink",
    "PciSysfsReader",
    "parse_aer_counts",
    "parse_link_speed",
]

log = structlog.get_logger("agent.sources.pci_sysfs")

# Transfer rate in GT/s -> PCIe generation.
PCIE_GENERATIONS: Mapping[float, int] = MappingProxyType(
    {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7},
)
AER_FILES = ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")
ROOTPORT_FILES = (
    "aer_rootport_total_err_cor",
    "aer_rootport_total_err_fatal",
    "aer_rootport_total_err_nonfatal",
)
_SPEED = re.compile(r"(\d+(?:\.\d+)?) GT/s(?: PCIe)?")
_UNKNOWN_SPEEDS = frozenset({"Unknown", "Unknown speed"})
_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@dataclass(frozen=True, slots=True)
class LinkSpeed:
    """A PCIe transfer rate and its generation (None for a rate no generation uses)."""

    gts: float
    generation: int | None


@dataclass(frozen=True, slots=True)
class PciLink:
    """Negotiated and maximum speed and width of a PCIe link; None where unknown or absent."""

    current_speed: LinkSpeed | None
    max_speed: LinkSpeed | None
    current_width: int | None
    max_width: int | None

    @property
    def width_degraded(self) -> bool:
        """True when the link trained narrower than it can (x8 on an x16 device)."""
        return (
            self.current_width is not None
            and self.max_width is not None
            and self.current_width < self.max_width
        )

    @property
    def speed_below_max(self) -> bool:
        """True when the link runs slower than it can (normal for an idle GPU)."""
        cur, top = self.current_speed, self.max_speed
        return cur is not None and top is not None and cur.gts < top.gts


@dataclass(frozen=True, slots=True)
class AerCounts:
    """One ``aer_dev_*`` file: the count per error name, and the ``TOTAL_ERR_*`` line.

    The total counts error messages, so it can differ from the sum of ``counts``.
    """

    counts: Mapping[str, int]
    total: int


@dataclass(frozen=True, slots=True)
class AerStats:
    """AER counters of an AER-capable function; each is None when its file is absent."""

    correctable: AerCounts | None
    nonfatal: AerCounts | None
    fatal: AerCounts | None
    rootport_total_err_cor: int | None = None
    rootport_total_err_fatal: int | None = None
    rootport_total_err_nonfatal: int | None = None


@dataclass(frozen=True, slots=True)
class PciFunctionStatus:
    """One poll of one PCI function.

    ``upstream`` is the port above it (None on a root bus). ``aer`` is None for a function that
    is not AER-capable (no ``aer_dev_*`` files). ``unreadable`` names files that were present but
    could not be read or parsed; their fields are None.
    """

    bdf: str
    upstream: str | None
    link: PciLink
    aer: AerStats | None
    unreadable: tuple[str, ...] = ()

    @property
    def read_errors(self) -> int:
        """How many files could not be read or parsed."""
        return len(self.unreadable)


def parse_link_speed(text: str) -> LinkSpeed | None:
    """Parse ``"32.0 GT/s PCIe"`` or ``"16 GT/s"``; None for ``"Unknown"`` (link down).

    Raises:
        ValueError: the text is neither a speed nor an unknown-speed marker.
    """
    text = text.strip()
    if text in _UNKNOWN_SPEEDS:
        return None
    match = _SPEED.fullmatch(text)
    if match is None:
        msg = f"{text[:40]!r} is not a PCIe link speed"
        raise ValueError(msg)
    gts = float(match[1])
    if not math.isfinite(gts):  # hundreds of digits: a float cannot hold it, no link runs at it
        msg = f"{text[:40]!r} is not a PCIe link speed"
        raise ValueError(msg)
    return LinkSpeed(gts=gts, generation=PCIE_GENERATIONS.get(gts))


def parse_aer_counts(text: str) -> AerCounts:
    """Parse an ``aer_dev_*`` file: ``Name count`` lines and a ``TOTAL_ERR_*`` line.

    Raises:
        ValueError: a line does not end in a count, or the total line is missing.
    """
    counts: dict[str, int] = {}
    total: int | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, count_text = line.strip().rpartition(" ")
        count = parse_counter(count_text)
        if not name or count is None:
            msg = f"AER line {line[:60]!r} is not 'Name count'"
            raise ValueError(msg)
        if name.startswith("TOTAL_ERR_"):
            total = count
        else:
            counts[name.strip()] = count
    if total is None:
        msg = "AER counters have no TOTAL_ERR_ line"
        raise ValueError(msg)
    return AerCounts(counts=counts, total=total)


_LINK_FILES = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")
_ALL_FILES = _LINK_FILES + AER_FILES + ROOTPORT_FILES


class PciSysfsReader:
    """Reads PCIe link and AER files below ``root`` (``/sys`` on a real node).

    A function's resolved directory is remembered until a read finds it gone, and a file's
    parsed value is reused while its text is unchanged (AER files rarely change and take the
    most parsing).
    """

    __slots__ = ("_devices", "_parsed", "_resolved", "root")

    def __init__(self, root: Path = Path("/sys")) -> None:
        """Resolve nothing yet; each function is looked up on first use."""
        self.root = root
        self._devices = root / "bus" / "pci" / "devices"
        self._resolved: dict[str, Path] = {}
        self._parsed: dict[tuple[str, str], tuple[bytes, object]] = {}

    def _resolve(self, bdf: str) -> Path:
        bdf = normalize_bus_id(bdf)
        cached = self._resolved.get(bdf)
        if cached is not None:
            return cached
        path = self._devices / bdf
        try:
            resolved = path.resolve(strict=True)
        except OSError as exc:
            msg = f"cannot read {path}: {exc.strerror or exc}"
            raise SourceError("sysfs", msg) from exc
        self._resolved[bdf] = resolved
        return resolved

    def upstream_chain(self, bdf: str) -> tuple[str, ...]:
        """The PCI functions above ``bdf``, nearest first, ending with the root port."""
        chain: list[str] = []
        for parent in self._resolve(bdf).parents:
            if _BDF.fullmatch(parent.name) is None:
                break
            chain.append(parent.name)
        return tuple(chain)

    def upstream_port(self, bdf: str) -> str | None:
        """The port directly above ``bdf`` (a switch downstream port or a root port)."""
        chain = self.upstream_chain(bdf)
        return chain[0] if chain else None

    def _value(
        self,
        base: str,
        name: str,
        batch: FileBatch,
        parse: Callable[[str], _T | None],
        bad: list[str],
    ) -> _T | None:
        """Parse one file of ``batch``; None when absent, None and noted in ``bad`` when not."""
        raw = batch.data.get(name)
        if raw is None:
            if name in batch.failed:
                bad.append(name)
            return None
        key = (base, name)
        seen = self._parsed.get(key)
        if seen is not None and seen[0] == raw:
            return seen[1]  # type: ignore[return-value]
        try:
            value = parse(raw.decode("ascii", errors="replace"))
        except ValueError:
            bad.append(name)
            return None
        self._parsed[key] = (raw, value)
        return value

    def function_status(self, bdf: str) -> PciFunctionStatus:
        """Read link speed and width, AER and root-port counters of one function.

        Raises:
            SourceError: the function does not exist (removed, or fell off the bus).
            ValueError: ``bdf`` is not a PCI bus id.
        """
        base_path = self._resolve(bdf)
        base = str(base_path)
        batch = read_files(base, _ALL_FILES)
        if len(batch.missing) == len(_ALL_FILES):  # the directory itself is gone
            self._resolved.pop(normalize_bus_id(bdf), None)
            msg = f"cannot read {base}: the function is gone"
            raise SourceError("sysfs", msg)
        bad: list[str] = []
        link = PciLink(
            current_speed=self._value(base, "current_link_speed", batch, parse_link_speed, bad),
            max_speed=self._value(base, "max_link_speed", batch, parse_link_speed, bad),
            current_width=self._value(base, "current_link_width", batch, _parse_int, bad),
            max_width=self._value(base, "max_link_width", batch, _parse_int, bad),
        )
        aer: AerStats | None = None
        if any(name in batch.data or name in batch.failed for name in AER_FILES):
            cor, nonfatal, fatal = (
                self._value(base, n, batch, parse_aer_counts, bad) for n in AER_FILES
            )
            root_cor, root_fatal, root_nonfatal = (
                self._value(base, n, batch, _parse_int, bad) for n in ROOTPORT_FILES
            )
            aer = AerStats(cor, nonfatal, fatal, root_cor, root_fatal, root_nonfatal)
        if bad:
            log.debug("pci_files_skipped", bdf=base_path.name, files=bad)
        return PciFunctionStatus(
            bdf=base_path.name,
            upstream=base_path.parent.name if _BDF.fullmatch(base_path.parent.name) else None,
            link=link,
            aer=aer,
            unreadable=tuple(bad),
        )


def _parse_int(text: str) -> int:
    value = parse_counter(text)
    if value is None:
        msg = f"{text.strip()[:40]!r} is not a non-negative integer"
        raise ValueError(msg)
    return value
