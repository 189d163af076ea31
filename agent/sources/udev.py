"""udev source: PCI and InfiniBand device add/remove/change uevents.

The real reader uses pyudev on the *kernel* netlink source: the ``udev`` source is silent (and
says nothing) inside a container without udevd.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agent.exceptions import SourceError

if TYPE_CHECKING:
    from agent.sources.wakeup import Waker

SUBSYSTEMS = ("pci", "infiniband")
MAX_EVENTS_PER_POLL = 10_000


@dataclass(frozen=True, slots=True)
class UdevEvent:
    """One uevent: ``action`` is add, remove, change, bind or unbind."""

    action: str
    subsystem: str
    sys_name: str
    properties: dict[str, str] = field(default_factory=dict)


class UdevSource(Protocol):
    """Anything that hands out new uevents."""

    def poll(self) -> list[UdevEvent]:
        """Return the uevents that arrived since the last call (never blocks)."""
        ...

    def watch(self, waker: Waker) -> None:
        """Wake the poll loop through ``waker`` when uevents arrive."""
        ...

    def close(self) -> None:
        """Release the source."""
        ...


class PyudevSource:
    """Kernel uevents through pyudev, filtered to PCI and InfiniBand in the kernel (BPF)."""

    __slots__ = ("_monitor",)

    def __init__(self) -> None:
        """Open the netlink monitor; raise SourceError when netlink is unavailable."""
        try:
            import pyudev  # noqa: PLC0415 - only the real source needs libudev

            context = pyudev.Context()
            monitor: Any = pyudev.Monitor.from_netlink(context, source="kernel")
            for subsystem in SUBSYSTEMS:
                monitor.filter_by(subsystem)
            monitor.start()
        except (ImportError, OSError) as exc:
            msg = f"cannot open the kernel uevent socket: {exc}"
            raise SourceError("udev", msg) from exc
        self._monitor = monitor

    def poll(self) -> list[UdevEvent]:
        """Drain pending uevents without blocking."""
        events: list[UdevEvent] = []
        while len(events) < MAX_EVENTS_PER_POLL:
            device = self._monitor.poll(timeout=0)
            if device is None:
                break
            events.append(
                UdevEvent(
                    action=str(device.action or ""),
                    subsystem=str(device.subsystem or ""),
                    sys_name=str(device.sys_name),
                    properties={str(k): str(v) for k, v in device.properties.items()},
                ),
            )
        return events

    def watch(self, waker: Waker) -> None:
        """The netlink socket is readable when uevents are waiting."""
        waker.watch_fd(int(self._monitor.fileno()))

    def close(self) -> None:
        """Nothing to release beyond the monitor's socket, closed with the object."""
