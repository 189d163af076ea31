"""sysfs source: how each IB/RoCE port trained, its RoCE GID table, and the NVSwitches' PCI ids.

Under ``<root>/class/infiniband/<hca>/`` (``drivers/infiniband/core/sysfs.c``):

* ``ports/<p>/rate``: ``"%d%s Gb/sec (%dX%s)"``, the active rate, width and per-lane speed:
  ``400 Gb/sec (4X NDR)``, ``200 Gb/sec (4X HDR)``, ``100 Gb/sec (2X NDR)``, ``2.5 Gb/sec (1X
  SDR)``, ``56 Gb/sec (4X FDR)``. The file names what the port runs at now, not what it could;
  RoCE ports show the Ethernet speed in the same form.
* ``ports/<p>/gids/<i>``: the GID table, ``fe80:0000:...:c2`` (all zeros when the entry is
  unused); ``ports/<p>/gid_attrs/types/<i>``: ``IB/RoCE v1`` or ``RoCE v2`` (reading an unused
  entry fails with EINVAL). NCCL over RoCE needs a RoCE v2 entry with an address.
* ``hca_type`` (``MT4129``) and ``board_id`` (``MT_0000000838``): which card this is.
* ``device``: a link to the HCA's PCI function.

NVSwitches are PCI functions of vendor ``0x10de`` and class ``0x0680xx`` (bridge, other).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.exceptions import SourceError
from agent.probes.pci import normalize_bus_id
from agent.sources.sysfs_io import list_dir, read_files
from fleetwatch.wire.validate import MAX_TEXT

__all__ = ["IbLinkReader", "IbRate", "PortLink", "RoceGids", "parse_ib_rate"]

_RATE: Final = re.compile(
    r"(?P<gbps>\d{1,6}(?:\.\d{1,3})?) Gb/sec(?: \((?P<width>\d{1,2})X ?(?P<speed>[A-Z0-9]*)\))?"
)
_ZERO_GID: Final = re.compile(r"[0:]+")
NVIDIA_VENDOR: Final = "0x10de"
NVSWITCH_CLASS_PREFIX: Final = "0x0680"  # PCI class 06 (bridge), subclass 80 (other)
ROCE_V2: Final = "RoCE v2"


@dataclass(frozen=True, slots=True)
class IbRate:
    """A port's ``rate`` file: Gb/s, lanes (None when not printed) and per-lane speed name."""

    gbps: float
    width: int | None
    speed: str
    text: str


def parse_ib_rate(text: str) -> IbRate:
    """Parse a ``rate`` file (any rate, width and speed name the kernel prints).

    Raises:
        ValueError: the text is not a rate.
    """
    text = text.strip()
    match = _RATE.fullmatch(text)
    if match is None:
        msg = f"{text[:60]!r} is not an IB rate"
        raise ValueError(msg)
    width = int(match["width"]) if match["width"] else None
    return IbRate(float(match["gbps"]), width, match["speed"] or "", text[:MAX_TEXT])


@dataclass(frozen=True, slots=True)
class PortLink:
    """How a port runs now: its rate and its link layer (``InfiniBand`` or ``Ethernet``)."""

    rate: IbRate
    link_layer: str


@dataclass(frozen=True, slots=True)
class RoceGids:
    """The port's GID table: entries with an address, and of them the RoCE v2 ones."""

    entries: int
    roce_v2: int


class IbLinkReader:
    """Reads port rates, GID tables and HCA identities below ``root`` (``/sys`` on a node)."""

    __slots__ = ("_functions", "_ib", "_kinds", "root")

    def __init__(self, root: Path = Path("/sys")) -> None:
        """Nothing is read yet; an HCA's identity is read once and kept."""
        self.root = root
        self._ib = root / "class" / "infiniband"
        self._kinds: dict[str, str] = {}
        self._functions: dict[str, str] = {}

    def link(self, device: str, port: int) -> PortLink:
        """The port's current rate and link layer (``InfiniBand`` or ``Ethernet``).

        Both are read each time: a port's link type follows its HCA's configuration, which can
        change without the agent restarting.

        Raises:
            SourceError: the rate cannot be read or is no rate.
        """
        base = f"{self._ib}/{device}/ports/{port}"
        batch = read_files(base, ("rate", "link_layer"))
        raw = batch.data.get("rate")
        if raw is None:
            msg = f"cannot read {base}/rate"
            raise SourceError("sysfs", msg)
        try:
            rate = parse_ib_rate(raw.decode("ascii", "replace"))
        except ValueError as exc:
            msg = f"{base}/rate: {exc}"
            raise SourceError("sysfs", msg) from exc
        layer = batch.data.get("link_layer", b"").decode("ascii", "replace").strip()
        return PortLink(rate, layer[:MAX_TEXT])

    def hca_kind(self, device: str) -> str:
        """``hca_type/board_id`` of the HCA ("" for what is absent): ports of one kind of card."""
        kind = self._kinds.get(device)
        if kind is None:
            batch = read_files(f"{self._ib}/{device}", ("hca_type", "board_id"))
            parts = [
                batch.data[name].decode("ascii", "replace").strip()
                for name in ("hca_type", "board_id")
                if name in batch.data
            ]
            kind = self._kinds[device] = "/".join(parts)[:MAX_TEXT]
        return kind

    def hca_function(self, device: str) -> str | None:
        """The PCI function (``dddd:bb:dd.f``) behind the HCA; None when it has none."""
        found = self._functions.get(device)
        if found is None:  # not kept while absent: a function can appear later
            try:
                name = (self._ib / device / "device").readlink().name
                found = self._functions[device] = normalize_bus_id(name)
            except (OSError, ValueError):
                return None
        return found

    def roce_gids(self, device: str, port: int) -> RoceGids:
        """Count the port's GID entries with an address, and the RoCE v2 ones among them.

        Raises:
            SourceError: the port has no GID table.
        """
        base = f"{self._ib}/{device}/ports/{port}"
        names = list_dir(f"{base}/gids")
        if not names:
            msg = f"cannot read {base}/gids: no GID table"
            raise SourceError("sysfs", msg)
        gids = read_files(f"{base}/gids", names)
        used = [
            name
            for name, raw in gids.data.items()
            if not _ZERO_GID.fullmatch(raw.decode("ascii", "replace").strip())
        ]
        types = read_files(f"{base}/gid_attrs/types", used)
        v2 = sum(
            1 for raw in types.data.values() if raw.decode("ascii", "replace").strip() == ROCE_V2
        )
        return RoceGids(entries=len(used), roce_v2=v2)

    def nvswitches(self) -> tuple[str, ...]:
        """The PCI functions that are NVSwitches, sorted."""
        devices = self.root / "bus" / "pci" / "devices"
        found: list[str] = []
        for name in list_dir(str(devices)):
            batch = read_files(f"{devices}/{name}", ("vendor", "class"))
            vendor = batch.data.get("vendor", b"").decode("ascii", "replace").strip()
            cls = batch.data.get("class", b"").decode("ascii", "replace").strip()
            if vendor == NVIDIA_VENDOR and cls.startswith(NVSWITCH_CLASS_PREFIX):
                try:
                    found.append(normalize_bus_id(name))
                except ValueError:
                    continue
        return tuple(sorted(found))
