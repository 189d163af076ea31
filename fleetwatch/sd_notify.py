"""systemd's notify protocol (``Type=notify``, ``WatchdogSec=``), standard library only.

systemd starts a notify service with ``NOTIFY_SOCKET`` in its environment: a Unix datagram
socket (a leading ``@`` names an abstract one) to which the service sends newline-separated
``KEY=VALUE`` lines. fleetwatch sends ``READY=1`` once it serves, ``STATUS=...`` for
``systemctl status``, ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` from its event loop (a wedged
loop stops pinging, and systemd restarts the daemon), ``EXTEND_TIMEOUT_USEC=...`` while it
waits for hardware before it is ready, ``RELOADING=1`` (with ``MONOTONIC_USEC``) when a SIGHUP
makes it read its files again and ``READY=1`` once that is done, and ``STOPPING=1`` when it
begins to stop. Without ``NOTIFY_SOCKET`` (a terminal, a test) every call does nothing.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Final

import structlog

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from fleetwatch.clock import Clock

log = structlog.get_logger("sd_notify")

ENVIRONMENT: Final = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _address(path: str) -> str | bytes:
    """The ``sendto`` address of a NOTIFY_SOCKET value; ValueError for one we cannot use."""
    if path.startswith("@") and len(path) > 1:
        return b"\0" + path[1:].encode()
    if path.startswith("/"):
        return path
    msg = f"NOTIFY_SOCKET must be a path or an @abstract name, got {path!r}"
    raise ValueError(msg)


class SdNotifier:
    """Sends notify messages to systemd; does nothing when there is no socket."""

    __slots__ = ("_address", "_failing", "watchdog_interval_s")

    def __init__(self, socket_path: str | None = None, watchdog_usec: int | None = None) -> None:
        """Send to ``socket_path``; ping the watchdog every ``watchdog_usec`` / 2.

        Raises:
            ValueError: the socket is neither a path nor an ``@`` name, or the watchdog
                period is not a positive number of microseconds.
        """
        self._address = _address(socket_path) if socket_path else None
        if watchdog_usec is not None and watchdog_usec <= 0:
            msg = f"WATCHDOG_USEC must be a positive number of microseconds, got {watchdog_usec}"
            raise ValueError(msg)
        self.watchdog_interval_s: float | None = None
        if watchdog_usec is not None and self._address is not None:
            self.watchdog_interval_s = watchdog_usec / 2e6
        self._failing = False

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str], pid: int) -> SdNotifier:
        """Take systemd's variables out of ``environ`` (children must not inherit them).

        The watchdog is ours only when ``WATCHDOG_PID`` is unset or names ``pid``. A value we
        cannot use is logged and leaves notifications off rather than stopping the daemon.
        """
        path, usec, watchdog_pid = (environ.pop(key, "") for key in ENVIRONMENT)
        watchdog_usec = None
        if usec and (not watchdog_pid or watchdog_pid == str(pid)):
            if usec.isdigit() and int(usec) > 0:
                watchdog_usec = int(usec)
            else:
                log.warning("sd_notify_watchdog_disabled", watchdog_usec=usec)
        try:
            return cls(path or None, watchdog_usec)
        except ValueError as exc:
            log.warning("sd_notify_disabled", error=str(exc))
            return cls()

    @property
    def enabled(self) -> bool:
        """Whether systemd listens (``NOTIFY_SOCKET`` was set)."""
        return self._address is not None

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram; False when nothing was sent.

        The socket is non-blocking, so a busy systemd costs a lost message, never a stalled
        event loop. A failure is logged once, until a send succeeds again.
        """
        if self._address is None:
            return False
        message = "\n".join(assignments).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.setblocking(False)  # noqa: FBT003 - the socket API's own flag
            try:
                sock.sendto(message, self._address)
            except OSError as exc:
                if not self._failing:
                    log.warning("sd_notify_failed", error=str(exc), message=assignments[0])
                self._failing = True
                return False
        self._failing = False
        return True

    def ready(self, status: str) -> bool:
        """Start-up is complete: systemd moves the unit to active."""
        return self.send("READY=1", _status(status))

    def status(self, status: str) -> bool:
        """A one-line state for ``systemctl status``."""
        return self.send(_status(status))

    def reloading(self, monotonic_s: float, status: str = "reloading") -> bool:
        """The daemon begins to read its files again; :meth:`ready` says when it is done.

        ``monotonic_s`` is ``CLOCK_MONOTONIC`` now (the system clock's ``monotonic()``): systemd
        tells this reload from an earlier one by it.
        """
        usec = max(1, int(monotonic_s * 1e6))
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", _status(status))

    def stopping(self, status: str = "stopping") -> bool:
        """The daemon begins to shut down."""
        return self.send("STOPPING=1", _status(status))

    def extend_timeout(self, seconds: float, status: str) -> bool:
        """Ask systemd to wait ``seconds`` more for start-up (or stop) to finish."""
        usec = max(1, int(seconds * 1e6))
        return self.send(f"EXTEND_TIMEOUT_USEC={usec}", _status(status))

    def watchdog(self) -> bool:
        """One keep-alive ping."""
        return self.send("WATCHDOG=1")

    async def keep_alive(self, clock: Clock) -> None:
        """Ping the watchdog every half period until cancelled; return at once without one.

        Run it as a task on the daemon's own event loop: the pings then prove the loop runs.
        """
        interval = self.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.watchdog()
            await clock.sleep(interval)


def _status(text: str) -> str:
    return "STATUS=" + " ".join(text.split())
