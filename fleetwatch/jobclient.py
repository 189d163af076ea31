"""Report training steps to the fleetwatch agent on this node: one function, standard library only.

Call :func:`report_step` once per step from every rank of a training job::

    from fleetwatch.jobclient import report_step

    report_step(None, rank, step, step_time=dt, tokens=tokens_this_rank,
                compute_time=compute_dt, world_size=world_size, params=72e9)

It sends one small message to the agent's Unix socket and returns at once. It never blocks the
step and never raises into the training code: when the agent is not there, is busy, or a value is
unusable, the report is dropped and the function returns False. A rank that reports nothing loses
nothing but its own visibility.

What to pass:

- ``job``: the job's id. None (or "") takes the scheduler's: ``$SLURM_JOB_ID``, else
  ``$TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``; its default ``none`` is not an id). Under
  Slurm the agent accepts only the Slurm job id, which it reads from the rank's cgroup; it fills
  it in when the report names no job.
- ``tokens``: this rank's share of the step's global batch (global tokens / world size), so that
  the sum over ranks is the job's tokens per step.
- ``compute_time``: the part of ``step_time`` spent computing, without waiting in collectives.
  Stragglers are judged on it (in a synchronous job every rank's ``step_time`` is the same).
  Without it, the step time stands in and stragglers cannot be told apart.
- ``checkpoint``: ``(start, end)`` in Unix seconds of a checkpoint written since the last report.
- ``checkpointing``: True when the rank writes a checkpoint right after this report, before its
  next step: a job whose steps stop while it checkpoints is not called hung for that (docs/jobs.md
  "Hangs").
- ``gpu``: the GPU this rank runs on, as the NVML index or the ``GPU-...`` UUID. Left out, it is
  taken from ``LOCAL_RANK`` (through ``CUDA_VISIBLE_DEVICES`` when that is set). CUDA numbers
  devices fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; pass the UUID to be exact
  (``torch.cuda.get_device_properties(i).uuid``).
- ``world_size``, ``params`` (parameter count) or ``flops_per_token``: once is enough; they let
  the collector compute MFU (6 x params FLOPs per token unless ``flops_per_token`` is given).

A report that could not be sent (the agent's queue was full, or it was down) is counted, and the
count travels with the next report that gets through, so the agent knows what it missed.

A process that reported says farewell as the interpreter exits: ``ok``, or ``error`` when an
uncaught exception ended it. A rank that ends without a word (killed, a crash of the
interpreter) is what the collector suspects first when a job fails (docs/jobs.md "Hangs").

The socket is ``$FLEETWATCH_JOB_SOCKET``, else ``/run/fleetwatch/jobs.sock``. Each process keeps
one connection to it (``SOCK_SEQPACKET``; a forked child opens its own, and a connection the agent
closed is opened again on the next report), so its reports wait in a queue of its own, which no
other user's flood can fill. The wire format is one JSON object per message (``docs/jobs.md``).
An agent from before connections (a datagram socket) is sent datagrams.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import math
import os
import socket
import sys
import threading
import time

DEFAULT_SOCKET = "/run/fleetwatch/jobs.sock"
MAX_DATAGRAM = 2048  # the agent refuses longer reports
_NOT_AN_ID = frozenset({"", "none"})  # torchrun's default --rdzv-id
# Never wait, and never take SIGPIPE from an agent that went away (Python ignores it, a process
# that embeds Python may not).
_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL

_lock = threading.Lock()
_sockets: dict[tuple[int, str], socket.socket] = {}  # by (pid, path): a forked child opens its own
_unsent = [0]  # reports this process could not send; told to the agent with the next one
_closed_at_exit = [False]
_crashed = [False]  # an uncaught exception reached sys.excepthook: the farewell is "error"
FAREWELL_OK = b'{"v":1,"bye":"ok"}'
FAREWELL_ERROR = b'{"v":1,"bye":"error"}'


def _connect(path: str) -> socket.socket:
    """A connection to the agent at ``path`` (OSError when it cannot be made now)."""
    for kind in (socket.SOCK_SEQPACKET, socket.SOCK_DGRAM):
        sock = socket.socket(socket.AF_UNIX, kind)
        sock.setblocking(False)  # noqa: FBT003 - the socket API
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EPROTOTYPE:  # EPROTOTYPE: an older agent's datagram socket
                raise
            continue
        if not _closed_at_exit[0]:
            _closed_at_exit[0] = True
            atexit.register(_farewell)
            _note_crashes()
        return sock
    msg = f"{path} takes neither connections nor datagrams"
    raise OSError(errno.EPROTOTYPE, msg)


def _send(path: str, data: bytes) -> None:
    """Send ``data`` on this process's connection to ``path``; OSError when it was not sent."""
    key = (os.getpid(), path)
    with _lock:
        sock = _sockets.get(key)
        if sock is not None:
            try:
                sock.send(data, _FLAGS)
            except (BlockingIOError, InterruptedError):
                raise  # the queue is full: the agent is busy, the connection is good
            except OSError:  # the agent closed it (it restarted): connect again
                _sockets.pop(key, None)
                sock.close()
            else:
                return
        sock = _connect(path)
        _sockets[key] = sock
        sock.send(data, _FLAGS)


def _note_crashes() -> None:
    """Have an uncaught exception noted before the interpreter reports it (and exits)."""
    previous = sys.excepthook

    def noted(*args: object) -> None:
        _crashed[0] = True
        previous(*args)  # type: ignore[arg-type]

    sys.excepthook = noted


def _farewell() -> None:
    """At exit: tell the agent how this process ends, then close its connections."""
    pid = os.getpid()
    word = FAREWELL_ERROR if _crashed[0] else FAREWELL_OK
    with _lock:
        for (owner, _), sock in _sockets.items():
            if owner == pid and sock.type == socket.SOCK_SEQPACKET:
                with contextlib.suppress(OSError):
                    sock.send(word, _FLAGS)
    close()


def close() -> None:
    """Close this process's connections (done at exit; the next report opens a new one)."""
    pid = os.getpid()
    with _lock:
        mine = [key for key in _sockets if key[0] == pid]
        socks = [_sockets.pop(key) for key in mine]
    for sock in socks:
        sock.close()


def _default_gpu() -> int | str | None:
    local = os.environ.get("LOCAL_RANK")
    if local is None or not local.isdigit():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
        if int(local) < len(devices):
            device = devices[int(local)]
            return int(device) if device.isdigit() else device
        return None
    return int(local)


def _default_job() -> str | None:
    for name in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(name, "").strip()
        if value.lower() not in _NOT_AN_ID:
            return value
    return None


def _number(value: float | None) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def report_step(  # noqa: PLR0913 - one call carries the whole report, all but four optional
    job: str | None,
    rank: int,
    step: int,
    step_time: float,
    tokens: float = 0,
    *,
    compute_time: float | None = None,
    checkpoint: tuple[float, float] | None = None,
    checkpointing: bool = False,
    gpu: int | str | None = None,
    world_size: int | None = None,
    params: float | None = None,
    flops_per_token: float | None = None,
    socket_path: str | None = None,
) -> bool:
    """Send one step report to the node's agent; True if it left, never raises."""
    try:
        report: dict[str, object] = {
            "v": 1,
            "rank": int(rank),
            "step": int(step),
            "step_time": _number(step_time),
            "tokens": _number(tokens),
            "time": time.time(),
        }
        optional: dict[str, object] = {
            "job": str(job) if job else _default_job(),
            "compute_time": _number(compute_time),
            "gpu": gpu if gpu is not None else _default_gpu(),
            "world_size": int(world_size) if world_size is not None else None,
            "params": _number(params),
            "flops_per_token": _number(flops_per_token),
        }
        if checkpoint is not None:
            optional["checkpoint"] = [float(checkpoint[0]), float(checkpoint[1])]
        if checkpointing:
            optional["checkpointing"] = True
        unsent = _unsent[0]
        if unsent:
            optional["unsent"] = unsent
        report.update({k: v for k, v in optional.items() if v is not None})
        data = json.dumps(report, separators=(",", ":")).encode()
        if len(data) > MAX_DATAGRAM:
            _unsent[0] += 1
            return False
        _send(socket_path or os.environ.get("FLEETWATCH_JOB_SOCKET") or DEFAULT_SOCKET, data)
    except Exception:  # noqa: BLE001 - the training loop must never see our failure
        _unsent[0] += 1
        return False
    _unsent[0] -= unsent
    return True
