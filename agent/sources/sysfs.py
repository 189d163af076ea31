"""sysfs source: InfiniBand ports under ``<root>/class/infiniband``.

Every path is relative to an injected root, so tests and the simulator point the same reader at a
tree of their own (``agent.sim.sysfs_tree`` writes one the way the kernel lays it out).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.exceptions import SourceError

IB_COUNTER_WIDTH_BITS = {"link_downed": 8}


@dataclass(frozen=True, slots=True)
class IbPortInfo:
    """An InfiniBand port as found at start-up."""

    device: str
    port: int
    rate: str
    link_layer: str


@dataclass(frozen=True, slots=True)
class IbPortStatus:
    """One poll of one port."""

    state: str  # NOP, DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER
    phys_state: str  # Sleep, Polling, Disabled, PortConfigurationTraining, LinkUp, ...
    link_downed: int


def strip_enum(text: str) -> str:
    """Turn sysfs ``"4: ACTIVE"`` into ``"ACTIVE"`` (and leave ``"ACTIVE"`` alone)."""
    head, sep, tail = text.strip().partition(":")
    return tail.strip() if sep and head.strip().isdigit() else text.strip()


class SysfsReader:
    """Reads InfiniBand port files below ``root`` (``/sys`` on a real node)."""

    __slots__ = ("_ib", "root")

    def __init__(self, root: Path = Path("/sys")) -> None:
        """Resolve nothing yet; a missing tree simply means no IB ports."""
        self.root = root
        self._ib = root / "class" / "infiniband"

    def _read(self, path: Path) -> str:
        try:
            return path.read_text("ascii", errors="replace").strip()
        except OSError as exc:
            msg = f"cannot read {path}: {exc.strerror or exc}"
            raise SourceError("sysfs", msg) from exc

    def ib_ports(self) -> list[IbPortInfo]:
        """List every port of every HCA, sorted by device then port."""
        if not self._ib.is_dir():
            return []
        found: list[IbPortInfo] = []
        for dev in sorted(self._ib.iterdir()):
            ports = dev / "ports"
            if not ports.is_dir():
                continue
            for port_dir in sorted(ports.iterdir(), key=lambda p: (len(p.name), p.name)):
                if not port_dir.name.isdigit():
                    continue
                found.append(
                    IbPortInfo(
                        device=dev.name,
                        port=int(port_dir.name),
                        rate=self._read(port_dir / "rate"),
                        link_layer=self._read(port_dir / "link_layer"),
                    ),
                )
        return found

    def ib_port_status(self, device: str, port: int) -> IbPortStatus:
        """Read state, physical state and the ``link_downed`` counter of one port."""
        base = self._ib / device / "ports" / str(port)
        downed_text = self._read(base / "counters" / "link_downed")
        try:
            downed = int(downed_text)
        except ValueError as exc:
            msg = f"{base}/counters/link_downed holds {downed_text[:40]!r}, not a number"
            raise SourceError("sysfs", msg) from exc
        return IbPortStatus(
            state=strip_enum(self._read(base / "state")),
            phys_state=strip_enum(self._read(base / "phys_state")),
            link_downed=downed,
        )
