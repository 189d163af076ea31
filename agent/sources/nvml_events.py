"""Xid events from NVML: a thread blocks in ``nvmlEventSetWait_v2`` and queues what arrives.

NVML is thread-safe and ctypes releases the GIL while the call blocks, so the wait costs the
event loop nothing. The poll loop drains the queue, which never blocks; the thread stops within
one wait timeout. A wait that hangs past its timeout (a wedged driver) stops only the NVML
events: the poll loop never waits on this thread, and :meth:`NvmlEventWatcher.stop` leaves the
event set alone (freeing it under a waiting call is not safe) and lets the daemon thread be.
"""

from __future__ import annotations

import contextlib
import ctypes
import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import structlog

if TYPE_CHECKING:
    from agent.sources.nvml_api import NvmlLibrary
    from agent.sources.wakeup import Waker
    from fleetwatch.clock import Clock

log = structlog.get_logger("agent.nvml_events")

EVENT_XID: Final = 0x8  # nvmlEventTypeXidCriticalError
ERROR_NOT_SUPPORTED: Final = 3
ERROR_TIMEOUT: Final = 10
ERROR_FUNCTION_NOT_FOUND: Final = 13
ERROR_GPU_IS_LOST: Final = 15
ERROR_BACKOFF_S: Final = 1.0
MAX_QUEUED: Final = 100_000


@dataclass(frozen=True, slots=True)
class NvmlXid:
    """An Xid NVML delivered for the GPU ``gpu_uuid``, at monotonic time ``mono``."""

    gpu_uuid: str
    xid: int
    mono: float


def handle_key(handle: Any) -> int:  # noqa: ANN401 - NVML handles are opaque
    """A hashable identity for a handle: the pointer value for ctypes handles, else ``id``."""
    try:
        address = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return address if address is not None else id(handle)


class NvmlEventWatcher:
    """Owns one NVML event set and the thread that waits on it."""

    def __init__(self, lib: NvmlLibrary, clock: Clock, timeout_ms: int = 500) -> None:
        """Nothing is registered until :meth:`start`."""
        self._lib = lib
        self._clock = clock
        self._timeout_ms = timeout_ms
        self._queue: queue.Queue[NvmlXid] = queue.Queue(maxsize=MAX_QUEUED)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._uuids: dict[int, str] = {}
        self.errors = 0
        self.dropped = 0
        self.waits = 0
        self._waker: Waker | None = None

    def watch(self, waker: Waker) -> None:
        """Wake the poll loop through ``waker`` (thread-safe) when an Xid event arrives."""
        self._waker = waker

    @property
    def running(self) -> bool:
        """True while the waiting thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _code(self, exc: Exception) -> int:
        return int(getattr(exc, "value", -1))

    def start(self, handles: dict[str, Any]) -> bool:
        """Register every GPU (uuid -> handle) for Xid events and start waiting.

        Returns False, having logged why, when this driver or GPU cannot deliver events, or
        when :meth:`cancel` was called while it registered.
        """
        lib = self._lib
        try:
            self._event_set = lib.nvmlEventSetCreate()
            for uuid, handle in handles.items():
                supported = lib.nvmlDeviceGetSupportedEventTypes(handle)
                if supported & EVENT_XID:
                    lib.nvmlDeviceRegisterEvents(handle, EVENT_XID, self._event_set)
                    self._uuids[handle_key(handle)] = uuid
        except lib.NVMLError as exc:
            log.warning("nvml_events_unavailable", error=str(exc), code=self._code(exc))
            self._free()
            return False
        if not self._uuids:
            log.warning("nvml_events_unavailable", error="no GPU supports Xid events")
            self._free()
            return False
        if self._stop.is_set():  # cancelled: the caller stopped waiting for this start
            self._free()
            return False
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        lib = self._lib
        while not self._stop.is_set():
            self.waits += 1
            try:
                data = lib.nvmlEventSetWait_v2(self._event_set, self._timeout_ms)
            except lib.NVMLError as exc:
                code = self._code(exc)
                if code == ERROR_TIMEOUT:
                    continue
                self.errors += 1
                log.warning("nvml_event_wait_failed", error=str(exc), code=code)
                self._stop.wait(ERROR_BACKOFF_S)
                continue
            if not data.eventType & EVENT_XID:
                continue
            uuid = self._uuids.get(handle_key(data.device))
            if uuid is None:
                with contextlib.suppress(lib.NVMLError):
                    uuid = lib.nvmlDeviceGetUUID(data.device)
            if uuid is None:
                self.errors += 1
                continue
            try:
                self._queue.put_nowait(NvmlXid(uuid, int(data.eventData), self._clock.monotonic()))
            except queue.Full:
                self.dropped += 1
            waker = self._waker
            if waker is not None:
                waker.notify()

    def drain(self) -> list[NvmlXid]:
        """Return what arrived since the last call, oldest first."""
        out: list[NvmlXid] = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def _free(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(self._lib.NVMLError):
                self._lib.nvmlEventSetFree(self._event_set)
            self._event_set = None

    def cancel(self) -> None:
        """Ask the thread to stop, without waiting or calling NVML; a pending start gives up."""
        self._stop.set()

    def stop(self) -> None:
        """Stop the thread (within one wait timeout) and free the event set.

        A thread still in its wait after that (NVML hung) keeps the set; it is not freed.
        """
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=max(2 * self._timeout_ms / 1000, 1.0))
            if thread.is_alive():
                log.warning("nvml_event_wait_hung", timeout_ms=self._timeout_ms)
                return
            self._thread = None
        self._free()
