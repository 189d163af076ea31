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

When the job enabled PyTorch's Flight Recorder (``TORCH_FR_BUFFER_SIZE`` or
``TORCH_NCCL_TRACE_BUFFER_SIZE`` above 0) and ``torch.distributed`` is imported, the first report
also starts a thread that opens a second connection and answers the agent's asks for the
recorder's last collectives (only while the collector looks into a hung job): a rank waiting in
a collective has let go of the interpreter lock, so the thread can answer while the main one is
stuck. ``FLEETWATCH_FLIGHT_RECORDER=0`` turns it off; :func:`serve_flight_recorder` starts it
by hand (with a ``dump`` of your own, a simulated rank's).

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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

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
RECORDER_HELLO = b'{"v":1,"serve":"flight_recorder"}'
RECORDER_ASK = b'{"v":1,"dump":"flight_recorder"}'
MAX_RECORDER_ANSWER = 65_536  # the agent reads no more
RECORDER_KEEP = 8  # collectives kept of each process group in an answer
RECORDER_RETRY_S = 30.0  # a recorder thread that ended is started again after this
_ENTRY_FIELDS = (
    "collective_seq_id",
    "p2p_seq_id",
    "is_p2p",
    "pg_id",
    "process_group",
    "profiling_name",
    "state",
    "retired",
    "time_created_ns",
)
_recorders: dict[int, threading.Thread] = {}  # by pid: the thread serving its recorder
_recorder_checked: dict[int, float] = {}  # by pid: when a report last looked (monotonic)
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


def _torch_trace() -> dict[str, object]:
    """This process's Flight Recorder as torch dumps it (JSON), gloo's and NCCL's together."""
    c10d = sys.modules["torch"]._C._distributed_c10d  # noqa: SLF001 - torch's own dump API
    merged: dict[str, object] = {"pg_status": {}, "entries": []}
    status: dict[str, object] = merged["pg_status"]  # type: ignore[assignment]
    entries: list[object] = merged["entries"]  # type: ignore[assignment]
    for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):  # NCCL's wins a shared group
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        trace = json.loads(dump(True, False))  # noqa: FBT003 - (collectives, only active)
        groups = trace.get("pg_status", {})
        kept = [e for e in entries if str(e.get("pg_id")) not in groups]  # type: ignore[attr-defined]
        entries[:] = kept + list(trace.get("entries", []))
        status.update(groups)
        merged["version"] = trace.get("version", "")
    return merged


def _trimmed(trace: dict[str, object], keep: int) -> dict[str, object]:
    """``trace`` with each group's last ``keep`` collectives, and of each only what is read."""
    entries = trace.get("entries")
    entries = entries if isinstance(entries, list) else []
    by_group: dict[str, list[dict[str, object]]] = {}
    for entry in entries:
        if isinstance(entry, dict):
            by_group.setdefault(str(entry.get("pg_id")), []).append(entry)
    kept = [
        {k: e[k] for k in _ENTRY_FIELDS if k in e}
        for group in by_group.values()
        for e in group[-keep:]
    ]
    return {
        "version": trace.get("version", ""),
        "pg_status": trace.get("pg_status"),
        "entries": kept,
    }


def _recorder_answer(dump: Callable[[], dict[str, object]]) -> bytes:
    """The answer to one ask: the trimmed trace, or what went wrong, in the size the agent reads."""
    try:
        trace = dump()
        keep = RECORDER_KEEP
        while True:
            data = json.dumps({"v": 1, "trace": _trimmed(trace, keep)}, separators=(",", ":"))
            if len(data) <= MAX_RECORDER_ANSWER or keep == 0:
                break
            keep //= 2
        if len(data) > MAX_RECORDER_ANSWER:
            data = json.dumps({"v": 1, "error": "the trace is too large even without entries"})
    except Exception as exc:  # noqa: BLE001 - the rank must never see our failure
        data = json.dumps({"v": 1, "error": f"{type(exc).__name__}: {exc}"[:200]})
    return data.encode()


def _serve_recorder(path: str, dump: Callable[[], dict[str, object]]) -> None:
    """Answer the agent's asks on a connection of its own until it closes (a daemon thread)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(2.0)
        sock.connect(path)
        sock.send(RECORDER_HELLO)
        while True:
            sock.settimeout(None)
            ask = sock.recv(256)
            if not ask:
                return  # the agent closed it
            if ask == RECORDER_ASK:
                sock.settimeout(1.0)
                sock.send(_recorder_answer(dump))
    except OSError:
        return
    finally:
        sock.close()


def serve_flight_recorder(
    socket_path: str | None = None, dump: Callable[[], dict[str, object]] | None = None
) -> bool:
    """Start answering the agent's asks for this process's Flight Recorder; True if started.

    ``dump`` returns the recorder in torch's JSON format (``pg_status``, ``entries``); left out,
    torch's own dump. A thread already serving this process is left as it is (False).
    """
    pid = os.getpid()
    with _lock:
        running = _recorders.get(pid)
        if running is not None and running.is_alive():
            return False
        path = socket_path or os.environ.get("FLEETWATCH_JOB_SOCKET") or DEFAULT_SOCKET
        thread = threading.Thread(
            target=_serve_recorder,
            args=(path, dump or _torch_trace),
            name="fleetwatch-flight-recorder",
            daemon=True,
        )
        _recorders[pid] = thread
    thread.start()
    return True


def _recorder_wanted() -> bool:
    """The job enabled torch's Flight Recorder, and fleetwatch may read it."""
    if os.environ.get("FLEETWATCH_FLIGHT_RECORDER", "1") == "0":
        return False
    if "torch.distributed" not in sys.modules:
        return False
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return True
    return False


def _maybe_serve_recorder(path: str) -> None:
    """After a report: serve the Flight Recorder if wanted and not served.

    Looked at on the first report, then once per ``RECORDER_RETRY_S``: a step pays a dict
    lookup, not the environment's.
    """
    pid, now = os.getpid(), time.monotonic()
    last = _recorder_checked.get(pid)
    if last is not None and now - last < RECORDER_RETRY_S:
        return
    _recorder_checked[pid] = now
    running = _recorders.get(pid)
    if (running is None or not running.is_alive()) and _recorder_wanted():
        serve_flight_recorder(path)


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
        path = socket_path or os.environ.get("FLEETWATCH_JOB_SOCKET") or DEFAULT_SOCKET
        _send(path, data)
        _maybe_serve_recorder(path)
    except Exception:  # noqa: BLE001 - the training loop must never see our failure
        _unsent[0] += 1
        return False
    _unsent[0] -= unsent
    return True
