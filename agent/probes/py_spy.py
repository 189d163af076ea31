"""What ``py-spy dump --json`` prints, read into thread stacks: frames only, bounded.

py-spy prints a JSON list with one object per thread (``thread_name``, ``os_thread_id``,
``active``, ``frames``: innermost first, each with ``name``, ``filename`` and ``line``, and more).
Only the function, file and line of each frame are kept; everything else (``locals`` among it,
which the agent never asks for) is dropped. The main thread comes first (py-spy names it only
once ``threading`` is imported: the thread whose id is the process's is ``MainThread``), then the
active ones, then the rest; at most ``MAX_DUMP_THREADS`` threads of ``MAX_DUMP_FRAMES`` frames,
every text cut to ``MAX_DUMP_TEXT`` characters. Captures: ``tests/fixtures/py-spy/``.
"""

from __future__ import annotations

import json
from typing import Final

from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate_jobs import MAX_DUMP_FRAMES, MAX_DUMP_TEXT, MAX_DUMP_THREADS

MAIN_THREAD: Final = "MainThread"
_MAX_LINE: Final = 2**32 - 1
_MAX_THREAD_ID: Final = 2**64 - 1
_ERROR_CHARS: Final = 200


class PySpyOutputError(ValueError):
    """py-spy's output is not the stack dump it should be; the message says what is wrong."""


def _cut(value: str) -> str:
    return value[:MAX_DUMP_TEXT]


def _int(value: object, high: int) -> int:
    """A JSON integer within 0..high (anything else reads as 0)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return min(max(value, 0), high)


def _frame(raw: object, where: str) -> pb.StackFrame:
    if not isinstance(raw, dict):
        msg = f"{where} is not an object"
        raise PySpyOutputError(msg)
    function, file = raw.get("name"), raw.get("filename")
    if not isinstance(function, str) or not isinstance(file, str):
        msg = f"{where} has no name or filename"
        raise PySpyOutputError(msg)
    return pb.StackFrame(
        function=_cut(function), file=_cut(file), line=_int(raw.get("line"), _MAX_LINE)
    )


def _thread(raw: object, index: int, pid: int) -> pb.ThreadStack:
    where = f"thread {index}"
    if not isinstance(raw, dict):
        msg = f"{where} is not an object"
        raise PySpyOutputError(msg)
    frames = raw.get("frames")
    if not isinstance(frames, list):
        msg = f"{where} has no frames list"
        raise PySpyOutputError(msg)
    os_id = _int(raw.get("os_thread_id"), _MAX_THREAD_ID)
    name = raw.get("thread_name")
    if not isinstance(name, str):
        name = MAIN_THREAD if os_id == pid else ""
    return pb.ThreadStack(
        name=_cut(name),
        thread_id=os_id or _int(raw.get("thread_id"), _MAX_THREAD_ID),
        active=raw.get("active") is True,
        frames=[_frame(f, f"frame {i} of {where}") for i, f in enumerate(frames[:MAX_DUMP_FRAMES])],
    )


def parse_dump(text: str, pid: int) -> list[pb.ThreadStack]:
    """The threads of process ``pid`` in py-spy's JSON; PySpyOutputError when it is not one.

    Threads of another process (py-spy's ``--subprocesses``, which the agent does not pass) are
    left out.
    """
    try:
        raw = json.loads(text)
    except ValueError as exc:
        msg = f"not JSON ({exc})"
        raise PySpyOutputError(msg) from exc
    if not isinstance(raw, list):
        msg = f"a JSON {type(raw).__name__}, not a list of threads"
        raise PySpyOutputError(msg)
    mine = [t for t in raw if not isinstance(t, dict) or t.get("pid", pid) == pid]
    threads = [_thread(t, i, pid) for i, t in enumerate(mine)]
    threads.sort(key=lambda t: (t.name != MAIN_THREAD, not t.active))  # stable: py-spy's order
    return threads[:MAX_DUMP_THREADS]


def error_text(stderr: str) -> str:
    """py-spy's complaint on one line: its ``Error:`` line and the first cause it gives."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return ""
    first = lines[0].removeprefix("Error:").strip()
    causes = [line.partition(":")[2].strip() for line in lines[1:] if line[:1].isdigit()]
    said = f"{first} ({causes[0]})" if causes and causes[0] else first
    return said[:_ERROR_CHARS]
