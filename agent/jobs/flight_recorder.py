"""A rank's PyTorch Flight Recorder, asked over the rank's own connection to the job socket.

A rank whose job enabled the Flight Recorder (``TORCH_FR_BUFFER_SIZE``, or NCCL's
``TORCH_NCCL_TRACE_BUFFER_SIZE``) and reports through :mod:`fleetwatch.jobclient` opens a second
connection to the job socket and says :data:`HELLO` on it. The kernel names that process
(``SO_PEERCRED``, its start time read from ``/proc``), so its channel is filed under the process,
never under what the rank claims. When the collector asks for a hung job's dumps, the agent asks
each watched rank's channel (:meth:`RecorderChannels.ask`) while py-spy reads its stack: the rank
answers from a thread of its own (a rank waiting in a collective has released the interpreter
lock) with torch's own JSON dump, cut to each group's last collectives. A rank that does not
answer within ``timeout_s`` (stopped, or holding the lock) says so; its stack still speaks.

What a rank answers is its own word about itself: :func:`groups_of` reads torch's format
(``pg_status``, ``entries``; docs/jobs.md "Hangs"), bounded, and keeps only sequence numbers,
operation names and states. Dump files that torch writes on a timeout (``TORCH_FR_DUMP_TEMP_FILE``)
are not read: they are pickles, and unpickling what another user wrote runs their code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import TYPE_CHECKING, Any, Final

import structlog

from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate_jobs import MAX_DUMP_GROUPS, MAX_DUMP_RECENT, MAX_DUMP_TEXT

if TYPE_CHECKING:
    from collections.abc import Mapping

log = structlog.get_logger("agent.jobs")

HELLO: Final = b'{"v":1,"serve":"flight_recorder"}'  # the rank's first message on its channel
ASK: Final = b'{"v":1,"dump":"flight_recorder"}'
MAX_ANSWER_BYTES: Final = 65_536  # a rank's answer, at most (the jobclient cuts to fit)
TIMEOUT_S: Final = 1.0
RECENT: Final = 8  # collectives kept of each group
MAX_OP: Final = 64  # characters of an operation's name
NOT_SERVED: Final = "the rank serves no Flight Recorder (the job did not enable it)"

Process = tuple[int, int]  # (pid, start ticks)


class RecorderError(ValueError):
    """A rank's Flight Recorder answer that cannot be read."""


def _int(value: object, what: str) -> int:
    """A sequence number as torch writes it (a string or a number; -1: none)."""
    if isinstance(value, bool):
        msg = f"{what} is {value!r}, not a number"
        raise RecorderError(msg)
    try:
        number: int = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        msg = f"{what} is {str(value)[:40]!r}, not a number"
        raise RecorderError(msg) from None
    if not -1 <= number <= 2**53:
        msg = f"{what} {number} is out of range"
        raise RecorderError(msg)
    return number


def _text(value: object) -> str:
    return value[:MAX_DUMP_TEXT] if isinstance(value, str) else ""


def _op(entry: Mapping[str, Any]) -> str:
    """``all_reduce`` of torch's ``gloo:all_reduce`` (the backend prefix cut)."""
    name = _text(entry.get("profiling_name"))
    return name.split(":", 1)[-1][:MAX_OP] if name else "?"


def _entry_group(entry: Mapping[str, Any]) -> str:
    """The process group id an entry belongs to (its ``pg_id``, else its group's name)."""
    pg_id = entry.get("pg_id")
    if isinstance(pg_id, int) and not isinstance(pg_id, bool):
        return str(pg_id)
    group = entry.get("process_group")
    return _text(group[0]) if isinstance(group, list) and group else ""


def groups_of(trace: object) -> list[pb.CollectiveGroup]:
    """Each process group's standing in torch's Flight Recorder JSON (RecorderError: not one)."""
    if not isinstance(trace, dict):
        raise RecorderError("the answer is not a JSON object")
    status = trace.get("pg_status")
    entries = trace.get("entries", [])
    if not isinstance(status, dict) or not isinstance(entries, list):
        raise RecorderError("the answer has no pg_status object or no entries list")
    names: dict[str, str] = {}
    recent: dict[str, list[pb.Collective]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("is_p2p") is True:
            continue  # point-to-point ops have sequence numbers of their own
        group = _entry_group(entry)
        label = entry.get("process_group")
        if isinstance(label, list) and len(label) > 1:
            names.setdefault(group, _text(label[1]))
        seq = _int(entry.get("collective_seq_id"), "an entry's collective_seq_id")
        state = _text(entry.get("state"))
        recent.setdefault(group, []).append(pb.Collective(seq=seq, op=_op(entry), state=state))
    groups = []
    for key, standing in list(status.items())[:MAX_DUMP_GROUPS]:
        if not isinstance(standing, dict):
            msg = f"pg_status of group {str(key)[:40]!r} is not an object"
            raise RecorderError(msg)
        group_id = _text(key)
        mine = sorted(recent.get(group_id, []), key=lambda c: c.seq)[
            -min(RECENT, MAX_DUMP_RECENT) :
        ]
        groups.append(
            pb.CollectiveGroup(
                id=group_id,
                name=names.get(group_id, ""),
                last_enqueued=_int(standing.get("last_enqueued_collective", -1), "last_enqueued"),
                last_started=_int(standing.get("last_started_collective", -1), "last_started"),
                last_completed=_int(
                    standing.get("last_completed_collective", -1), "last_completed"
                ),
                recent=mine,
            )
        )
    return groups


def read_answer(data: bytes) -> tuple[list[pb.CollectiveGroup], str]:
    """(groups, "") of a rank's answer, or ([], why not)."""
    try:
        answer = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return [], "its Flight Recorder answer is not JSON"
    if not isinstance(answer, dict):
        return [], "its Flight Recorder answer is not a JSON object"
    if "error" in answer:
        return [], f"its Flight Recorder: {_text(answer['error'])}"[:MAX_DUMP_TEXT]
    try:
        return groups_of(answer.get("trace")), ""
    except RecorderError as exc:
        return [], f"its Flight Recorder answer: {exc}"[:MAX_DUMP_TEXT]


class RecorderChannels:
    """The Flight Recorder channels of the rank processes on this node, by process."""

    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        """No channels; the job socket files them as ranks open them."""
        self._timeout_s = timeout_s
        self._channels: dict[Process, socket.socket] = {}
        self._waiting: dict[Process, asyncio.Future[bytes]] = {}
        self.bad_answers = 0

    def __len__(self) -> int:
        return len(self._channels)

    def opened(self, process: Process, sock: socket.socket) -> None:
        """``process`` (named by the kernel) serves its Flight Recorder on ``sock``."""
        self._channels[process] = sock

    def closed(self, process: Process, sock: socket.socket) -> None:
        """``sock`` closed; its process serves no more (unless it opened another since)."""
        if self._channels.get(process) is sock:
            del self._channels[process]
            waiting = self._waiting.pop(process, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(b'{"error":"the rank closed its Flight Recorder channel"}')

    def answered(self, process: Process, data: bytes) -> None:
        """The channel of ``process`` sent ``data``: the answer asked for, or nothing of use."""
        waiting = self._waiting.get(process)
        if waiting is None or waiting.done():
            self.bad_answers += 1  # unasked: dropped
            return
        waiting.set_result(data)

    async def ask(self, process: Process) -> tuple[list[pb.CollectiveGroup], str]:
        """(groups, "") of the process's Flight Recorder, or ([], why not) within the timeout."""
        sock = self._channels.get(process)
        if sock is None:
            return [], NOT_SERVED
        waiting = self._waiting.get(process)
        if waiting is None or waiting.done():
            waiting = asyncio.get_running_loop().create_future()
            self._waiting[process] = waiting
            try:
                sock.send(ASK, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except OSError as exc:
                del self._waiting[process]
                return [], f"its Flight Recorder could not be asked: {exc.strerror or exc}"
        try:
            async with asyncio.timeout(self._timeout_s):
                data = await asyncio.shield(waiting)
        except TimeoutError:
            return [], f"its Flight Recorder did not answer within {self._timeout_s:g} s"
        finally:
            if waiting.done() and self._waiting.get(process) is waiting:
                del self._waiting[process]
        groups, error = read_answer(data)
        if error:
            self.bad_answers += 1
            log.info("flight_recorder_unread", pid=process[0], error=error)
        return groups, error

    def close(self) -> None:
        """Forget every channel (the job socket closes the sockets)."""
        for waiting in self._waiting.values():
            with contextlib.suppress(asyncio.InvalidStateError):
                waiting.cancel()
        self._waiting.clear()
        self._channels.clear()
