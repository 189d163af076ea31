"""A sysfs tree on disk laid out like the kernel's, for the real :class:`SysfsReader` to read."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


class SimSysfsTree:
    """Writes ``class/infiniband/<dev>/ports/<n>/...`` under a root directory."""

    __slots__ = ("root",)

    def __init__(self, root: Path) -> None:
        """Create the root if needed."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _write(path: Path, text: str) -> None:
        """Replace a file atomically so a concurrent reader never sees half a value."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text + "\n", "ascii")
        tmp.replace(path)

    def write_ib_port(  # noqa: PLR0913 - one argument per sysfs file
        self,
        device: str,
        port: int,
        *,
        state: str,
        phys_state: str,
        rate: str,
        link_layer: str,
        counters: dict[str, int],
    ) -> None:
        """Write (or rewrite) one port's files."""
        base = self.root / "class" / "infiniband" / device / "ports" / str(port)
        (base / "counters").mkdir(parents=True, exist_ok=True)
        self._write(base / "state", state)
        self._write(base / "phys_state", phys_state)
        self._write(base / "rate", rate)
        self._write(base / "link_layer", link_layer)
        for name, value in counters.items():
            self._write(base / "counters" / name, str(value))
