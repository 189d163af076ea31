"""NVML calls on one worker thread, each waited for at most a deadline.

A driver call can block for good (a GPU that fell off the bus mid-call, a wedged driver). Run
inline it would freeze the agent's event loop: no heartbeats, no kernel log, and systemd's
watchdog killing the agent over and over. :class:`NvmlGuard` hands the work to its worker thread
and waits ``timeout_s``. A call that has not returned by then raises :class:`NvmlHungError`; the
worker stays stuck in it (a thread cannot be killed), so every later call fails at once with
the same error, without queueing behind it, until the stuck call returns. Then the guard is used
again. There is only ever the one worker thread, so at most one thread is stuck.

The event loop awaits the work (:meth:`NvmlGuard.call`): the loop goes on reading the kernel log,
udev and the job socket and sending heartbeats while the worker is busy, up to and past the
deadline. :meth:`NvmlGuard.run` blocks its caller instead, for threads that have nothing else to
do (discovery runs on one at start). Use one of them at a time.

Handing work to a thread costs about 20 µs of CPU: callers batch (one hand-off for every GPU's
reading in a poll), and a call made from the worker thread itself runs inline.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, cast

import structlog

from agent.exceptions import NvmlError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["DEFAULT_TIMEOUT_S", "NvmlGuard", "NvmlHungError"]

T = TypeVar("T")

log = structlog.get_logger("agent.nvml_guard")

DEFAULT_TIMEOUT_S: Final = 5.0
ERROR_TIMEOUT: Final = 10  # NVML_ERROR_TIMEOUT: the code a hung call is reported with
IDLE_EXIT_S: Final = 60.0  # a worker with nothing to do this long ends; the next call starts one


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class NvmlHungError(NvmlError):
    """An NVML call did not return within the deadline, or one before it still has not."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        """``timed_out``: this call passed its deadline (False: refused, one is stuck)."""
        super().__init__(ERROR_TIMEOUT, message)
        self.timed_out = timed_out


class _Job(Generic[T]):
    """One hand-off: the work, and what came of it once ``done`` is released."""

    __slots__ = (
        "done",
        "ended",
        "error",
        "finished",
        "fn",
        "notify",
        "started",
        "value",
        "what",
    )

    def __init__(
        self,
        what: str,
        fn: Callable[[], T],
        notify: Callable[[], None] | None = None,
    ) -> None:
        self.what = what
        self.fn = fn
        self.notify = notify  # called on the worker once fn has returned or raised
        self.done = _thread.allocate_lock()
        self.done.acquire()  # released by the worker when fn has returned or raised
        self.finished = False
        self.value: T | None = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.ended = 0.0

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller, who re-raises
            self.error = exc
        self.ended = time.monotonic()
        self.finished = True
        self.done.release()
        if self.notify is not None:
            self.notify()


class NvmlGuard:
    """Runs NVML work on one worker thread, waiting at most ``timeout_s`` for each call.

    Await :meth:`call` on the event loop, or call :meth:`run` from a thread that may block; one
    caller at a time. Counters: ``timed_out`` (calls that passed their deadline), ``refused``
    (calls failed at once because one was stuck).
    """

    __slots__ = (
        "_jobs",
        "_lock",
        "_stuck",
        "_thread",
        "_worker",
        "refused",
        "timed_out",
        "timeout_s",
    )

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """No thread runs until the first call."""
        if not timeout_s > 0:
            msg = f"timeout_s must be positive, got {timeout_s!r}"
            raise ValueError(msg)
        self.timeout_s = timeout_s
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._worker = -1  # the worker thread's ident
        self._stuck: _Job[Any] | None = None
        self.timed_out = 0
        self.refused = 0

    @property
    def hung(self) -> bool:
        """True while a call that passed its deadline has not returned."""
        stuck = self._stuck
        return stuck is not None and not stuck.finished

    def run(self, what: str, fn: Callable[[], T]) -> T:
        """Return ``fn()`` run on the worker thread; NvmlHungError if it takes too long.

        Blocks the calling thread for up to the deadline: never call it on the event loop
        (await :meth:`call` there). Whatever ``fn`` raises is raised here. ``what`` names the
        call in errors and logs.
        """
        if threading.get_ident() == self._worker:  # nested: already on the worker
            return fn()
        self._refuse_if_stuck(what)
        job: _Job[T] = _Job(what, fn)
        self._submit(job)
        if not job.done.acquire(timeout=self.timeout_s):
            raise self._hung(job)
        return self._outcome(job)

    async def call(self, what: str, fn: Callable[[], T]) -> T:
        """Await ``fn()`` run on the worker thread; NvmlHungError if it takes too long.

        The event loop runs on while the worker works: only the awaiting task waits, at most
        ``timeout_s``. The deadline, the refusal while a call is stuck and the errors are those
        of :meth:`run`. A caller cancelled while waiting leaves the work running on the worker.
        """
        self._refuse_if_stuck(what)
        loop = asyncio.get_running_loop()
        returned: asyncio.Future[None] = loop.create_future()

        def wake() -> None:  # on the worker thread
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_resolve, returned)

        job: _Job[T] = _Job(what, fn, wake)
        self._submit(job)
        # The deadline resolves the same future (not asyncio.wait_for, which in 3.11 can swallow
        # a cancellation that comes as the call returns: a cancelled poll must end).
        deadline = loop.call_later(self.timeout_s, _resolve, returned)
        try:
            await returned
        finally:
            deadline.cancel()
        if not job.finished:  # checked, not the future: it may have returned just now
            raise self._hung(job)
        return self._outcome(job)

    def _refuse_if_stuck(self, what: str) -> None:
        """Raise at once while an earlier call is stuck; note it once it has returned."""
        stuck = self._stuck
        if stuck is None:
            return
        if not stuck.finished:
            self.refused += 1
            age = time.monotonic() - stuck.started
            msg = f"{what}: not tried, NVML has not answered {stuck.what} for {age:.0f} s"
            raise NvmlHungError(msg, timed_out=False)
        self._stuck = None
        stuck_s = round(stuck.ended - stuck.started, 1)
        log.warning("nvml_call_returned", call=stuck.what, stuck_s=stuck_s)

    def _hung(self, job: _Job[Any]) -> NvmlHungError:
        """Mark ``job`` stuck (later calls are refused until it returns); the error to raise."""
        self._stuck = job
        self.timed_out += 1
        log.error(
            "nvml_call_hung",
            call=job.what,
            timeout_s=self.timeout_s,
            note="NVML values are left out until the call returns",
        )
        msg = f"{job.what}: no answer from NVML within {self.timeout_s:g} s"
        return NvmlHungError(msg, timed_out=True)

    @staticmethod
    def _outcome(job: _Job[T]) -> T:
        if job.error is not None:
            raise job.error
        return cast("T", job.value)

    def _submit(self, job: _Job[Any]) -> None:
        with self._lock:  # the worker may be ending for idleness: it ends, or it takes the job
            if self._thread is None:
                thread = threading.Thread(target=self._serve, name="nvml-calls", daemon=True)
                self._thread = thread
                thread.start()
            self._jobs.put(job)

    def _serve(self) -> None:
        me = self._worker = threading.get_ident()
        try:
            self._take_jobs()
        finally:
            if self._worker == me:  # thread idents are reused once a thread has ended
                self._worker = -1

    def _take_jobs(self) -> None:
        jobs = self._jobs
        while True:
            try:
                job = jobs.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if jobs.empty():
                        if self._thread is threading.current_thread():
                            self._thread = None
                        return
                continue
            if job is None:
                return
            job.run()

    def close(self) -> None:
        """Let the worker thread end (a stuck one ends once its call returns)."""
        with self._lock:
            if self._thread is not None:
                self._jobs.put(None)
                self._thread = None
