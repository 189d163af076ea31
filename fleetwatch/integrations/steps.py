"""Time training steps without synchronising the GPU, and report them to the node's agent.

A loop that calls ``torch.cuda.synchronize()`` to time its backward and its step stalls the host
twice a step: while it waits, it cannot queue the next step's work, and the GPU idles between
steps. :class:`StepTimer` records CUDA events instead (at the step's begin, after its backward, at
its end) and reads their elapsed times later, once ``event.query()`` says the GPU has passed
them: one step later as a rule, never by waiting. :class:`StepReporter` sends each timed step
with :func:`fleetwatch.jobclient.report_step`. The Hugging Face and Lightning callbacks
(``huggingface.py``, ``lightning.py``) and the plain PyTorch loop in docs/jobs.md all use it.

What is measured:

- On a GPU (CUDA events): ``step_time`` is the GPU's time from the step's begin to its end, and
  ``compute_time`` from its begin to the end of its backward (:meth:`StepReporter.compute_done`),
  as the GPU ran them. A collective that the backward overlaps (DDP's all-reduce) counts in it,
  as it does in any timing of the backward (docs/jobs.md).
- On the CPU: the host's wall time (``time.perf_counter``) over the same two spans. There the
  host computes as it goes, so its clock measures the same thing; no CUDA event is made.

A step is reported when the next step ends (on a GPU: once the GPU has finished it), or at
:meth:`StepReporter.checkpoint_begins` and :meth:`StepReporter.close`, which wait for the steps
still held: that is one wait, where the program waits for the GPU anyway (a checkpoint copies the
state off it; the end of training). Nothing here raises into the training loop: a report that did
not reach the agent is counted in :attr:`StepReporter.lost` and logged once, a failure of our own
is counted in :attr:`StepReporter.errors` and logged once, and training goes on.

Standard library only (torch is reached through ``sys.modules`` once the program imported it);
logs go to the standard :mod:`logging` module, which is what training programs configure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fleetwatch.jobclient import DEFAULT_SOCKET, report_step

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

log = logging.getLogger("fleetwatch.integrations")

# Steps held whose events the GPU has not passed yet; past this many, the oldest is told by the
# host's clock, without a compute time (the host is that far ahead only in a pathological loop).
MAX_HELD = 16


class GpuEvent(Protocol):
    """What :class:`StepTimer` uses of a ``torch.cuda.Event``."""

    def record(self) -> object:
        """Mark the point the current stream's queued work has reached."""

    def query(self) -> object:
        """Truthy once the GPU has passed the mark; never waits."""

    def elapsed_time(self, end_event: Any, /) -> float:  # noqa: ANN401 - torch's own Event
        """Milliseconds from this mark to ``end_event``'s, both passed."""

    def synchronize(self) -> object:
        """Wait until the GPU has passed the mark."""


def cuda_event() -> GpuEvent:
    """A CUDA event that keeps time, on the current device (torch's)."""
    event: GpuEvent = sys.modules["torch"].cuda.Event(enable_timing=True)
    return event


def cuda_in_use() -> bool:
    """Whether this process has put CUDA to work: torch is imported and its CUDA initialised."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_initialized())


def current_gpu_uuid() -> str | None:
    """The NVML UUID (``GPU-...``) of the current CUDA device; None when torch cannot tell."""
    with contextlib.suppress(Exception):
        cuda = sys.modules["torch"].cuda
        return "GPU-" + str(cuda.get_device_properties(cuda.current_device()).uuid)
    return None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else default


def rank_and_world() -> tuple[int, int]:
    """This process's global rank and the job's world size.

    torch.distributed's once it is initialised, else ``$RANK`` and ``$WORLD_SIZE`` (what torchrun
    and the frameworks' launchers set), else rank 0 of 1.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)


def batch_tokens(batch: object) -> int:
    """The token ids in ``batch``: its ``input_ids``' element count (a key or attribute), else 0."""
    ids = (
        batch.get("input_ids") if isinstance(batch, Mapping) else getattr(batch, "input_ids", None)
    )
    numel = getattr(ids, "numel", None)
    return int(numel()) if callable(numel) else 0


@dataclass(frozen=True, slots=True)
class TimedStep:
    """One finished step, timed."""

    step: int
    tokens: float
    step_time: float  # seconds
    compute_time: float | None  # seconds; None: not measured


@dataclass(slots=True)
class _Step:
    """A step begun (and, once ``end_at`` is set, queued whole): host times and its events."""

    begin_at: float
    begin_event: GpuEvent | None
    compute_at: float | None = None
    compute_event: GpuEvent | None = None
    end_at: float = 0.0
    end_event: GpuEvent | None = None
    step: int = 0
    tokens: float = 0.0


class StepTimer:
    """Times each step by CUDA events, read once the GPU has passed them, or by the host's clock.

    Call :meth:`begin`, :meth:`compute_done` (optional) and :meth:`end` in each step, then take
    the steps whose times are known with :meth:`ready`, or all with :meth:`flush`.
    """

    __slots__ = ("_clock", "_event", "_held", "_max_held", "_open")

    def __init__(
        self,
        *,
        cuda: bool | None = None,
        event: Callable[[], GpuEvent] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        max_held: int = MAX_HELD,
    ) -> None:
        """Time by CUDA events when ``cuda`` (None: when CUDA is in use here).

        ``event`` makes the events instead (a fake's); without events, ``clock`` times the steps.
        """
        if max_held < 1:
            msg = f"max_held must be at least 1, not {max_held}"
            raise ValueError(msg)
        if event is None and (cuda_in_use() if cuda is None else cuda):
            event = cuda_event
        self._event = event
        self._clock = clock
        self._max_held = max_held
        self._held: deque[_Step] = deque()
        self._open: _Step | None = None

    @property
    def on_gpu(self) -> bool:
        """Whether steps are timed by GPU events."""
        return self._event is not None

    @property
    def held(self) -> int:
        """Steps ended but not yet taken."""
        return len(self._held)

    def _mark(self) -> GpuEvent | None:
        if self._event is None:
            return None
        event = self._event()
        event.record()
        return event

    def begin(self) -> None:
        """A step begins (before its forward); a step begun and not ended is forgotten."""
        self._open = _Step(self._clock(), self._mark())

    def compute_done(self) -> None:
        """The step's forward and backward are queued; the last call in a step counts.

        What follows (the optimizer) is not compute.
        """
        if self._open is not None:
            self._open.compute_at = self._clock()
            self._open.compute_event = self._mark()

    def end(self, step: int, tokens: float = 0.0) -> bool:
        """Step ``step`` is queued whole, with ``tokens``; False when no step was begun."""
        ended, self._open = self._open, None
        if ended is None:
            return False
        ended.end_at = self._clock()
        ended.end_event = self._mark()
        ended.step = step
        ended.tokens = tokens
        self._held.append(ended)
        return True

    def ready(self, keep: int = 0) -> list[TimedStep]:
        """The held steps the GPU has finished, oldest first, leaving the newest ``keep``."""
        out: list[TimedStep] = []
        while len(self._held) > keep:
            oldest = self._held[0]
            if _passed(oldest):
                out.append(_timed(oldest))
            elif len(self._held) > self._max_held:
                out.append(_by_host(oldest, with_compute=False))
            else:
                break
            self._held.popleft()
        return out

    def flush(self) -> list[TimedStep]:
        """Every held step, oldest first, waiting for the GPU to pass their ends (one wait)."""
        for held in self._held:
            if held.end_event is not None and not held.end_event.query():
                held.end_event.synchronize()
        out = [_timed(held) for held in self._held]
        self._held.clear()
        return out


def _passed(step: _Step) -> bool:
    events = (step.begin_event, step.compute_event, step.end_event)
    return all(event.query() for event in events if event is not None)


def _by_host(step: _Step, *, with_compute: bool) -> TimedStep:
    compute = step.compute_at - step.begin_at if with_compute and step.compute_at else None
    return TimedStep(step.step, step.tokens, step.end_at - step.begin_at, compute)


def _timed(step: _Step) -> TimedStep:
    """The step's times from its events, else (no events: on the CPU) from the host's clock."""
    begin, end = step.begin_event, step.end_event
    if begin is None or end is None:
        return _by_host(step, with_compute=True)
    try:
        step_time = begin.elapsed_time(end) / 1000
        mark = step.compute_event
        compute = begin.elapsed_time(mark) / 1000 if mark is not None else None
    except RuntimeError:  # an event torch could not time: the host's clock, without compute
        return _by_host(step, with_compute=False)
    return TimedStep(step.step, step.tokens, step_time, compute)


class StepReporter:
    """Reports each step of this rank to the node's agent, timed by a :class:`StepTimer`.

    In each step call :meth:`begin`, :meth:`compute_done` after the backward, and :meth:`end`
    after the optimizer; :meth:`close` after the last. ``job``, ``params``, ``flops_per_token``,
    ``gpu`` and ``socket_path`` are :func:`~fleetwatch.jobclient.report_step`'s; ``gpu`` left out
    is the current CUDA device's UUID when steps are timed on the GPU (else ``$LOCAL_RANK``'s, as
    the jobclient takes it). The rank and world size are :func:`rank_and_world`'s, read at each
    report (torch.distributed may be initialised after this is made). No method raises.
    """

    def __init__(  # noqa: PLR0913 - report_step's options, all but the job keyword-only
        self,
        job: str | None = None,
        *,
        cuda: bool | None = None,
        params: float | None = None,
        flops_per_token: float | None = None,
        gpu: int | str | None = None,
        socket_path: str | None = None,
    ) -> None:
        """Time on the GPU when ``cuda`` (None: when CUDA is in use when this is made)."""
        self.job = job
        self.params = params
        self.flops_per_token = flops_per_token
        self.gpu = gpu
        self.socket_path = socket_path
        self.sent = 0  # reports the agent's socket took
        self.lost = 0  # reports that did not reach it
        self.errors = 0  # failures of our own, kept from the training loop
        self._told_lost = False
        self._told_error = False
        self._gpu_looked = gpu is not None
        self._checkpoint_start: float | None = None
        self._checkpoint: tuple[float, float] | None = None  # travels with the next report
        self.timer = StepTimer(cuda=False)
        with self.guard():
            self.timer = StepTimer(cuda=cuda)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Run a block whose failure must not reach the training loop: count it, log the first."""
        try:
            yield
        except Exception:  # the training loop must never see our failure
            self.errors += 1
            if not self._told_error:
                self._told_error = True
                log.warning(
                    "fleetwatch: step reporting failed; training goes on, later failures are "
                    "only counted",
                    exc_info=True,
                )

    def begin(self) -> None:
        """A step begins, before its forward."""
        with self.guard():
            self.timer.begin()

    def compute_done(self) -> None:
        """The step's forward and backward are queued."""
        with self.guard():
            self.timer.compute_done()

    def end(self, step: int, tokens: float = 0.0, *, checkpointing: bool = False) -> None:
        """Step ``step`` is queued whole: send the earlier steps the GPU has finished.

        ``tokens`` is this rank's share of the step's global batch. ``checkpointing``: a
        checkpoint is written now, before the next step (:meth:`checkpoint_begins`).
        """
        with self.guard():
            self.timer.end(step, tokens)
            self._send(self.timer.ready(keep=1))
        if checkpointing:
            self.checkpoint_begins()

    def checkpoint_begins(self) -> None:
        """A checkpoint is written now: send every step held, the last marked ``checkpointing``.

        It waits for the GPU to finish them (the checkpoint's copy off the GPU would wait anyway);
        marked, the job is not called hung while the checkpoint is written.
        """
        with self.guard():
            self._send(self.timer.flush(), checkpointing=True)
            self._checkpoint_start = time.time()

    def checkpoint_done(self) -> None:
        """The checkpoint begun is written; it travels with the next report."""
        with self.guard():
            if self._checkpoint_start is not None:
                self._checkpoint = (self._checkpoint_start, time.time())
                self._checkpoint_start = None

    def close(self) -> None:
        """After the last step: send the steps held, waiting for the GPU to finish them."""
        self.checkpoint_done()
        with self.guard():
            self._send(self.timer.flush())

    def _gpu(self) -> int | str | None:
        if not self._gpu_looked:
            self._gpu_looked = True
            if self.timer.on_gpu and cuda_in_use():
                self.gpu = current_gpu_uuid()
        return self.gpu

    def _send(self, steps: list[TimedStep], *, checkpointing: bool = False) -> None:
        if not steps:
            return
        rank, world = rank_and_world()
        gpu = self._gpu()
        for timed in steps:
            sent = report_step(
                self.job,
                rank,
                timed.step,
                timed.step_time,
                timed.tokens,
                compute_time=timed.compute_time,
                checkpoint=self._checkpoint,
                checkpointing=checkpointing and timed is steps[-1],
                gpu=gpu,
                world_size=world,
                params=self.params,
                flops_per_token=self.flops_per_token,
                socket_path=self.socket_path,
            )
            if sent:
                self.sent += 1
                self._checkpoint = None
            else:
                self._lost(timed.step)

    def _lost(self, step: int) -> None:
        self.lost += 1
        if self._told_lost:
            return
        self._told_lost = True
        path = self.socket_path or os.environ.get("FLEETWATCH_JOB_SOCKET") or DEFAULT_SOCKET
        why = "no agent listens or it is busy" if Path(path).exists() else "no socket there"
        log.warning(
            "fleetwatch: the report of step %d did not reach the agent at %s (%s); training "
            "goes on, later reports lost are only counted",
            step,
            path,
            why,
        )


class CallbackSteps:
    """What the framework callbacks share: a reporter, the step's tokens, the model's size.

    ``huggingface.py`` and ``lightning.py`` put it before the framework's own base class.
    """

    def __init__(  # noqa: PLR0913 - report_step's options, all keyword-only but the job
        self,
        job: str | None = None,
        *,
        tokens_per_step: float | None = None,
        params: float | None = None,
        flops_per_token: float | None = None,
        gpu: int | str | None = None,
        socket_path: str | None = None,
    ) -> None:
        """Report with :func:`~fleetwatch.jobclient.report_step`'s options.

        ``tokens_per_step``: this rank's tokens in each step (None: counted from the ids).
        """
        self.reporter = StepReporter(
            job,
            cuda=False,
            params=params,
            flops_per_token=flops_per_token,
            gpu=gpu,
            socket_path=socket_path,
        )
        self.tokens_per_step = tokens_per_step
        self._tokens = 0

    def _training_starts(self, *, on_gpu: bool, parameters: Iterable[Any]) -> None:
        """Time on the GPU when training runs on one; count the parameters unless given."""
        with self.reporter.guard():
            self.reporter.timer = StepTimer(cuda=on_gpu)
            if self.reporter.params is None:
                self.reporter.params = float(sum(p.numel() for p in parameters))

    def _step_tokens(self) -> float:
        """The step's tokens: as given, else those counted."""
        return self._tokens if self.tokens_per_step is None else self.tokens_per_step
