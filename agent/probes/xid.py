"""Xid lines in the kernel log, parsed by a pure function.

NVIDIA's driver prints ``NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:..][ GPU-CI:..]): %d, ...``: four
lowercase hex digits of domain and no function number. Older drivers (before the ``PCI:`` tag)
printed the bus id alone: ``NVRM: Xid (0000:03:00): 13, 0002 00000000 ...``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.probes.pci import normalize_bus_id
from fleetwatch.wire.validate import MAX_DETAIL

# The driver prints an unsigned 32-bit number; a longer run of digits is not an Xid it printed.
_MAX_XID_DIGITS = 10
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): (\d+),"
)


@dataclass(frozen=True, slots=True)
class XidLine:
    """An Xid reported by the kernel for the GPU at ``pci_bus_id`` (normalised)."""

    pci_bus_id: str
    xid: int
    text: str


def parse_xid_line(text: str) -> XidLine | None:
    """Return the Xid in ``text``, or None when the line is not an NVRM Xid line.

    The number fits 32 bits (larger is None: no driver printed it); ``text`` is kept up to
    ``MAX_DETAIL`` characters, what an event's detail may carry.
    """
    match = _XID.search(text)
    if match is None or len(match[2]) > _MAX_XID_DIGITS or int(match[2]) > 0xFFFF_FFFF:  # noqa: PLR2004
        return None
    detail = text.strip()[:MAX_DETAIL]
    return XidLine(pci_bus_id=normalize_bus_id(match[1]), xid=int(match[2]), text=detail)
