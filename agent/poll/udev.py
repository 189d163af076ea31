"""udev: PCI removal and error recovery, InfiniBand devices coming and going.

A GPU's PCI function being removed is the same fault as the GPU falling off the bus, so it is
handed to the sampler's GPU-lost path (one event per loss, whichever source saw it first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import structlog

from agent.exceptions import SourceError
from agent.probes.pci import normalize_bus_id
from fleetwatch.model import EventKind, Target

if TYPE_CHECKING:
    from collections import Counter

    from agent.poll.findings import PollResult
    from agent.poll.kernel_log import GpuLost
    from agent.sources.nvml import GpuIdentity
    from agent.sources.udev import UdevEvent, UdevSource
    from agent.sources.wakeup import Waker

log = structlog.get_logger("agent.udev")

RECOVERY_STATES: Final = frozenset({"BEGIN_RECOVERY", "SUCCESSFUL_RECOVERY", "FAILED_RECOVERY"})


class UdevPoller:
    """Turns uevents into events."""

    def __init__(self, udev: UdevSource) -> None:
        """Keep the source."""
        self._udev = udev

    def watch(self, waker: Waker) -> None:
        """Wake the poll loop when uevents arrive."""
        self._udev.watch(waker)

    def poll(
        self,
        by_bus: dict[str, GpuIdentity],
        gpu_lost: GpuLost,
        result: PollResult,
        now_ms: int,
        errors: Counter[str],
    ) -> None:
        """Handle every uevent since the last poll."""
        try:
            uevents = self._udev.poll()
        except SourceError as exc:
            errors["udev"] += 1
            log.warning("udev_poll_failed", error=str(exc))
            return
        for uevent in uevents:
            if uevent.subsystem == "pci":
                self._pci(uevent, by_bus, gpu_lost, result, now_ms=now_ms, errors=errors)
            elif uevent.subsystem == "infiniband" and uevent.action in ("add", "remove"):
                kind = (
                    EventKind.IB_DEVICE_ADDED
                    if uevent.action == "add"
                    else EventKind.IB_DEVICE_REMOVED
                )
                result.event(
                    kind,
                    Target.node_device(uevent.sys_name),
                    now_ms,
                    f"udev {uevent.action} infiniband {uevent.sys_name}",
                )

    def _pci(  # noqa: PLR0913 - the poll's context, passed through
        self,
        uevent: UdevEvent,
        by_bus: dict[str, GpuIdentity],
        gpu_lost: GpuLost,
        result: PollResult,
        *,
        now_ms: int,
        errors: Counter[str],
    ) -> None:
        try:
            bus_id = normalize_bus_id(uevent.sys_name)
        except ValueError:
            errors["udev"] += 1
            return
        gpu = by_bus.get(bus_id)
        target = Target.gpu(gpu.uuid) if gpu else Target.pci(bus_id)
        if uevent.action == "remove":
            if gpu is not None:
                gpu_lost(gpu, result, now_ms, detail=f"udev: PCI function {bus_id} removed")
            else:
                result.event(EventKind.PCI_REMOVED, target, now_ms, f"udev remove {bus_id}")
            return
        state = uevent.properties.get("ERROR_EVENT", "")
        if uevent.action == "change" and state in RECOVERY_STATES:
            online = uevent.properties.get("DEVICE_ONLINE", "?")
            result.event(
                EventKind.PCI_RECOVERY,
                target,
                now_ms,
                f"{state} on {bus_id}, device online {online}",
            )
