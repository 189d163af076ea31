"""Run one measuring tool: an argument list (never a shell), a timeout, the whole group killed.

Each tool starts in a session of its own, so a timeout kills what it started too (``mpirun``'s
ranks, torch's workers), not just the first process. Output is read in full up to a bound
(a tool printing without end cannot fill the agent's memory) and kept for parsing and evidence.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

import structlog

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

log = structlog.get_logger(__name__)

MAX_OUTPUT: Final = 4 << 20  # bytes of stdout (and of stderr) kept; the rest is read and dropped
TERM_GRACE_S: Final = 2.0  # after SIGTERM to the group, SIGKILL follows this much later
EVIDENCE_CHARS: Final = 600
REASON_CHARS: Final = 240


@dataclass(frozen=True, slots=True)
class ToolRun:
    """What one run of a tool left: its output, how it ended, and how long it took."""

    argv: tuple[str, ...]
    returncode: int | None  # None: never started (see ``error``)
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    error: str = ""  # why it did not start, or was cut short

    @property
    def ok(self) -> bool:
        """Ran to the end and exited 0."""
        return self.returncode == 0 and not self.timed_out and not self.error

    def why_not(self) -> str:
        """A one-line reason the run is not usable (empty when :attr:`ok`)."""
        if self.error:
            return self.error
        name = Path(self.argv[0]).name if self.argv else "tool"
        if self.timed_out:
            return f"{name} did not finish in {self.seconds:.0f} s and was killed"
        if self.returncode != 0:
            said = last_lines(self.stderr) or last_lines(self.stdout)
            signal_name = _signal_name(self.returncode)
            how = f"was killed by {signal_name}" if signal_name else f"exited {self.returncode}"
            return f"{name} {how}" + (f": {said}" if said else "")
        return ""

    def evidence(self) -> str:
        """The tail of what the tool printed, for the journal."""
        text = (self.stdout.rstrip() + "\n" + self.stderr.rstrip()).strip()
        return text[-EVIDENCE_CHARS:]


def _signal_name(returncode: int | None) -> str:
    if returncode is None or returncode >= 0:
        return ""
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def last_lines(text: str, count: int = 3) -> str:
    """The last ``count`` lines of ``text`` that are not blank, joined with " / ", cut short."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    joined = " / ".join(lines[-count:])
    return joined if len(joined) <= REASON_CHARS else joined[: REASON_CHARS - 3] + "..."


def find_tool(name: str, search_path: str | None = None) -> str | None:
    """The tool's full path on ``search_path`` (default: ``PATH``), or None when missing."""
    return shutil.which(name, path=search_path)


def _drain(stream: IO[bytes], sink: bytearray) -> None:
    """Read ``stream`` to its end into ``sink`` (up to the bound), then close it."""
    try:
        # os.read returns what is there (a buffered read would wait for a whole chunk or EOF)
        while chunk := os.read(stream.fileno(), 65536):
            room = MAX_OUTPUT - len(sink)
            if room > 0:
                sink.extend(chunk[:room])
    finally:
        stream.close()


def run_tool(
    argv: Sequence[str],
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> ToolRun:
    """Run ``argv`` for at most ``timeout_s`` seconds; never raises for the tool's failures."""
    start = time.monotonic()
    args = tuple(argv)
    try:
        proc = subprocess.Popen(  # noqa: S603 - an argument list we built, no shell
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        why = f"{args[0] if args else 'tool'} could not start: {exc.strerror or exc}"
        return ToolRun(args, None, "", "", time.monotonic() - start, error=why)
    out, err = bytearray(), bytearray()
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        proc.wait(timeout=max(timeout_s, 0.0))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
    for reader in readers:
        # a process that left the group may still hold the pipe: its reader (a daemon thread)
        # is left to finish and close it; what was printed so far is kept
        reader.join(timeout=TERM_GRACE_S)
    seconds = time.monotonic() - start
    if timed_out:
        log.warning("preflight_tool_timeout", tool=args[0], timeout_s=timeout_s)
    return ToolRun(
        args,
        proc.returncode,
        bytes(out).decode("utf-8", "replace"),
        bytes(err).decode("utf-8", "replace"),
        seconds,
        timed_out=timed_out,
    )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process's group, then SIGKILL it if it is still there after a grace."""
    for sig, wait_s in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, TERM_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; a child that ignored SIGTERM may still hold the group
        if sig is signal.SIGTERM:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        break


def run_tools(
    argvs: Sequence[Sequence[str]],
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> list[ToolRun]:
    """Run several tools at once (one rank each), each bounded by ``timeout_s``; in order."""
    runs: list[ToolRun | None] = [None] * len(argvs)

    def one(index: int) -> None:
        runs[index] = run_tool(argvs[index], timeout_s, env, cwd)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(argvs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [
        run if run is not None else ToolRun(tuple(argvs[i]), None, "", "", 0.0, error="not run")
        for i, run in enumerate(runs)
    ]
