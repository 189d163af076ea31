"""PCI bus id normalisation, so NVML, the kernel log and sysfs name a GPU the same way."""

from __future__ import annotations

import re

_BUS_ID = re.compile(
    r"(?P<domain>[0-9A-Fa-f]{1,8}):(?P<bus>[0-9A-Fa-f]{2}):(?P<dev>[0-9A-Fa-f]{2})(?:\.(?P<fn>[0-7]))?",
)


def normalize_bus_id(text: str) -> str:
    """Return ``dddd:bb:dd.f`` in lowercase.

    Accepts NVML's ``00000000:1B:00.0``, the kernel log's ``0000:1b:00`` (no function number,
    taken as 0) and sysfs's ``0000:1b:00.0``.
    """
    match = _BUS_ID.fullmatch(text.strip())
    if match is None:
        msg = f"{text!r} is not a PCI bus id"
        raise ValueError(msg)
    domain = int(match["domain"], 16)
    if domain > 0xFFFF:  # noqa: PLR2004 - PCI domains are 16 bits
        msg = f"{text!r} has a PCI domain above ffff"
        raise ValueError(msg)
    fn = match["fn"] or "0"
    return f"{domain:04x}:{match['bus'].lower()}:{match['dev'].lower()}.{fn}"
