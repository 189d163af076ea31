"""Links read every counter interval: how IB/RoCE ports trained, RoCE GIDs, NIC/NVSwitch PCIe.

A port's ``rate`` file says what it runs at now, not what it could: the kernel has no file for
the supported rate. What a port is expected to run at is the most it ran at since the agent
started, or the most any active port of the same kind of card (``hca_type``/``board_id``) and
link layer on the node runs at now, whichever is higher: a rail that trained at 200 Gb/s beside
seven at 400 is low from the first poll, and one that came back lower after a flap is low
against its own past. (A node whose every rail trained low looks consistent; pre-flight's rate
gate catches that.) Down ports are not judged: ``ib_port_down`` is their rule.

A RoCE port (link layer Ethernet) needs RoCE v2 entries in its GID table for NCCL; an active
one with none is a fault.

The PCIe link of each HCA is read too, and of each NVSwitch: a NIC does not slow its link when
idle as a GPU does, so a speed or width below what the card and the port above it both support
is a fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import structlog

from agent.exceptions import SourceError
from agent.poll.failure_episodes import FailureEpisodes
from agent.poll.pcie import pcie_samples
from fleetwatch.model import EventKind, Target

if TYPE_CHECKING:
    from collections import Counter

    from agent.poll.findings import PollResult
    from agent.sources.ib_link import IbLinkReader, IbRate
    from agent.sources.pci_sysfs import PciFunctionStatus, PciSysfsReader
    from agent.sources.sysfs import IbPortInfo

log = structlog.get_logger("agent.ib_link")

ETHERNET: Final = "Ethernet"
ACTIVE: Final = "ACTIVE"
_EPSILON: Final = 1e-6


@dataclass(frozen=True, slots=True)
class _Expected:
    """What a link can run at: the best seen, and where (for the event's words)."""

    gbps: float
    text: str


@dataclass(frozen=True, slots=True)
class PcieShortfall:
    """A PCIe link against what both of its ends support (None where unknown)."""

    speed: float | None
    width: int | None
    speed_max: float | None
    width_max: int | None

    @property
    def degraded(self) -> bool:
        """True when the link runs narrower or slower than both ends support."""
        return (
            self.width is not None and self.width_max is not None and self.width < self.width_max
        ) or (self.speed is not None and self.speed_max is not None and self.speed < self.speed_max)

    def describe(self) -> str:
        """``16 GT/s x8, can run 32 GT/s x16``."""
        return f"{_link(self.speed, self.width)}, can run {_link(self.speed_max, self.width_max)}"


def _link(speed: float | None, width: int | None) -> str:
    s = "? GT/s" if speed is None else f"{speed:g} GT/s"
    return f"{s} x{'?' if width is None else width}"


def _lower(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def shortfall(status: PciFunctionStatus, above: PciFunctionStatus | None) -> PcieShortfall:
    """The link of ``status`` against its own maximum and that of the port ``above`` it."""
    link = status.link
    up = above.link if above is not None else None
    speed_max = link.max_speed.gts if link.max_speed else None
    width_max = link.max_width
    if up is not None:
        speed_max = _lower(speed_max, up.max_speed.gts if up.max_speed else None)
        lower_width = _lower(width_max, up.max_width)
        width_max = None if lower_width is None else int(lower_width)
    return PcieShortfall(
        speed=link.current_speed.gts if link.current_speed else None,
        width=link.current_width,
        speed_max=speed_max,
        width_max=width_max,
    )


class IbLinkPoller:
    """Samples and edge events for port rates, RoCE GIDs and NIC/NVSwitch PCIe links."""

    def __init__(self, reader: IbLinkReader, pci: PciSysfsReader | None) -> None:
        """NVSwitches are listed at :meth:`discover`."""
        self._reader = reader
        self._pci = pci
        self._best: dict[tuple[str, int], _Expected] = {}
        self._low: dict[tuple[str, int], bool] = {}
        self._gid_missing: dict[tuple[str, int], bool] = {}
        self._pcie_low: dict[str, bool] = {}
        self._upstream: dict[str, str | None] = {}
        self._nvswitches: tuple[str, ...] = ()
        self._nic_failures = FailureEpisodes(log, "nic_pcie_read_failed")
        self._nvswitch_failures = FailureEpisodes(log, "nvswitch_pcie_read_failed")

    def discover(self) -> tuple[str, ...]:
        """List the node's NVSwitches (PCI functions); they do not come and go."""
        self._nvswitches = self._reader.nvswitches()
        return self._nvswitches

    def poll(
        self,
        ports: tuple[IbPortInfo, ...],
        result: PollResult,
        now_ms: int,
        errors: Counter[str],
    ) -> None:
        """Read every port's rate (and GIDs on RoCE), each HCA's and NVSwitch's PCIe link.

        Run after the port states are in ``result`` (only active ports are judged).
        """
        rates: dict[tuple[str, int], IbRate] = {}
        layers: dict[tuple[str, int], str] = {}
        for port in ports:
            try:
                link = self._reader.link(port.device, port.port)
                rates[port.device, port.port] = link.rate
                layers[port.device, port.port] = link.link_layer or port.link_layer
            except SourceError as exc:
                errors["sysfs"] += 1
                log.warning(
                    "ib_rate_read_failed", device=port.device, port=port.port, error=str(exc)
                )
        active = {
            (p.device, p.port)
            for p in ports
            if result.samples.get((Target.ib_port(p.device, p.port), "ib_state")) == ACTIVE
        }
        self._rates(ports, rates, layers, active, result, now_ms)
        for port in ports:
            key = (port.device, port.port)
            if layers.get(key) == ETHERNET and key in active:
                self._gids(port, result, now_ms, errors)
        if self._pci is not None:
            self._nic_pcie(self._pci, ports, result, now_ms, errors)
            self._nvswitch_pcie(self._pci, result, now_ms, errors)

    def _rates(  # noqa: PLR0913, PLR0917 - one poll's readings of every port
        self,
        ports: tuple[IbPortInfo, ...],
        rates: dict[tuple[str, int], IbRate],
        layers: dict[tuple[str, int], str],
        active: set[tuple[str, int]],
        result: PollResult,
        now_ms: int,
    ) -> None:
        peers: dict[tuple[str, str], _Expected] = {}
        for port in ports:
            key = (port.device, port.port)
            rate = rates.get(key)
            if rate is None or key not in active:
                continue
            seen = _Expected(rate.gbps, rate.text)
            best = self._best.get(key)
            if best is None or rate.gbps > best.gbps:
                self._best[key] = seen
            group = (layers[key], self._reader.hca_kind(port.device))
            top = peers.get(group)
            if top is None or rate.gbps > top.gbps:
                peers[group] = seen
        for port in ports:
            key = (port.device, port.port)
            rate = rates.get(key)
            if rate is None:
                continue
            target = Target.ib_port(port.device, port.port)
            result.samples[target, "ib_rate_gbps"] = rate.gbps
            if rate.width is not None:
                result.samples[target, "ib_link_width"] = rate.width
            if key not in active:
                result.samples[target, "ib_rate_low"] = 0
                self._low[key] = False
                continue
            group = (layers[key], self._reader.hca_kind(port.device))
            expected = max(self._best[key], peers[group], key=lambda e: e.gbps)
            low = rate.gbps < expected.gbps - _EPSILON
            result.samples[target, "ib_rate_expected_gbps"] = expected.gbps
            result.samples[target, "ib_rate_low"] = int(low)
            if low and not self._low.get(key, False):
                result.event(
                    EventKind.IB_RATE_LOW,
                    target,
                    now_ms,
                    f"{port.device}/{port.port} runs at {rate.text}, expected {expected.text}",
                )
            self._low[key] = low

    def _gids(
        self, port: IbPortInfo, result: PollResult, now_ms: int, errors: Counter[str]
    ) -> None:
        key = (port.device, port.port)
        try:
            gids = self._reader.roce_gids(port.device, port.port)
        except SourceError as exc:
            errors["sysfs"] += 1
            log.warning("roce_gids_read_failed", device=port.device, port=port.port, error=str(exc))
            return
        target = Target.ib_port(port.device, port.port)
        missing = gids.roce_v2 == 0
        result.samples[target, "roce_v2_gids"] = gids.roce_v2
        result.samples[target, "roce_gid_missing"] = int(missing)
        if missing and not self._gid_missing.get(key, False):
            result.event(
                EventKind.ROCE_GID_MISSING,
                target,
                now_ms,
                f"{port.device}/{port.port}: no RoCE v2 GID ({gids.entries} GID entries in use)",
            )
        self._gid_missing[key] = missing

    def _status(
        self, pci: PciSysfsReader, bdf: str, errors: Counter[str]
    ) -> tuple[PciFunctionStatus, PciFunctionStatus | None]:
        """The card's own link, and the port above it where that can be read.

        The port above only caps what the card could train to: when it cannot be read (a
        missing parent, a file gone), the card's own readings still count.
        """
        status = pci.function_status(bdf)
        try:
            if bdf not in self._upstream:
                self._upstream[bdf] = pci.upstream_port(bdf)
            upstream = self._upstream[bdf]
            above = pci.function_status(upstream) if upstream is not None else None
        except SourceError as exc:
            errors["sysfs"] += 1
            self._nic_failures.failed(f"{bdf} upstream", str(exc), device=bdf)
            return status, None
        return status, above

    def _nic_pcie(
        self,
        pci: PciSysfsReader,
        ports: tuple[IbPortInfo, ...],
        result: PollResult,
        now_ms: int,
        errors: Counter[str],
    ) -> None:
        for device in dict.fromkeys(p.device for p in ports):
            bdf = self._reader.hca_function(device)
            if bdf is None:
                continue
            try:
                status, above = self._status(pci, bdf, errors)
            except SourceError as exc:
                errors["sysfs"] += 1
                self._nic_failures.failed(device, str(exc), device=device)
                continue
            self._nic_failures.succeeded(device, device=device)
            link = shortfall(status, above)
            targets = [Target.ib_port(p.device, p.port) for p in ports if p.device == device]
            for target in targets:
                for name, value in (
                    ("nic_pcie_link_width", link.width),
                    ("nic_pcie_link_width_max", link.width_max),
                    ("nic_pcie_link_speed_gts", link.speed),
                    ("nic_pcie_link_speed_gts_max", link.speed_max),
                ):
                    if value is not None:
                        result.samples[target, name] = value
                result.samples[target, "nic_pcie_link_degraded"] = int(link.degraded)
            if link.degraded and not self._pcie_low.get(bdf, False):
                result.event(
                    EventKind.PCIE_LINK_DEGRADED,
                    targets[0],
                    now_ms,
                    f"NIC {device} ({bdf}) PCIe link at {link.describe()}",
                )
            self._pcie_low[bdf] = link.degraded

    def _nvswitch_pcie(
        self, pci: PciSysfsReader, result: PollResult, now_ms: int, errors: Counter[str]
    ) -> None:
        if not self._nvswitches:
            return
        degraded = 0
        for bdf in self._nvswitches:
            try:
                status, above = self._status(pci, bdf, errors)
            except SourceError as exc:
                errors["sysfs"] += 1
                self._nvswitch_failures.failed(bdf, str(exc), bdf=bdf)
                continue
            self._nvswitch_failures.succeeded(bdf, bdf=bdf)
            target = Target.pci(bdf)
            result.samples.update(pcie_samples(target, status))
            link = shortfall(status, above)
            degraded += link.degraded
            if link.degraded and not self._pcie_low.get(bdf, False):
                result.event(
                    EventKind.PCIE_LINK_DEGRADED,
                    target,
                    now_ms,
                    f"NVSwitch {bdf} PCIe link at {link.describe()}",
                )
            self._pcie_low[bdf] = link.degraded
        result.samples[Target.node(), "nvswitch_pcie_links_degraded"] = degraded
