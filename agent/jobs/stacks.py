"""Reading a rank process's Python stacks: one seam, py-spy behind it, and a simulated one.

:class:`PySpyDumper` runs ``py-spy dump --pid <pid> --json --nonblocking`` as an argument list
(never a shell), with a time limit (2 s) and a bound on what it may print (256 KiB), and reads
its JSON with :func:`agent.probes.py_spy.parse_dump`: function, file and line per frame, nothing
else. It never passes ``--locals`` (the values in a rank's frames are its data, not ours to
read) nor ``--native``. ``--nonblocking`` reads the process without stopping it: py-spy then
needs no ``ptrace`` system call (the agent's unit keeps it filtered), only
``process_vm_readv``, which ``CAP_SYS_PTRACE`` allows on other users' processes; the stack of a
hung rank does not move while it is read. Whatever goes wrong (no py-spy, a timeout, an exit
status, output that is not a dump) comes back as an error text, never as an exception.
"""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from agent.probes.py_spy import MAIN_THREAD, PySpyOutputError, error_text, parse_dump
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

DUMP_TIMEOUT_S: Final = 2.0
MAX_OUTPUT: Final = 256 << 10  # bytes of py-spy's JSON
_MAX_STDERR: Final = 16 << 10
# py-spy's environment: nothing of the agent's; no Rust backtrace after its error line.
_ENV: Final = {"RUST_BACKTRACE": "0", "LC_ALL": "C"}
_CHUNK: Final = 65536


@dataclass(frozen=True, slots=True)
class StackResult:
    """One process's threads (main first, innermost frame first), or why there are none."""

    threads: tuple[pb.ThreadStack, ...] = ()
    error: str = ""


class StackDumper(Protocol):
    """Reads the Python stacks of one process. Runs in a thread: it may block, briefly."""

    def __call__(self, pid: int) -> StackResult:
        """The stacks of process ``pid`` (one the agent watches), or an error saying why not."""
        ...


def find_py_spy() -> str:
    """py-spy next to this interpreter (the agent's virtualenv), else on ``PATH``, else its name.

    A missing binary is not an error here: each dump then says that py-spy could not start.
    """
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy") or "py-spy"


@dataclass(slots=True)
class _Capture:
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    why: str = ""  # why it was cut short


def _read(proc: subprocess.Popen[bytes], deadline: float, max_output: int) -> _Capture:
    """Read stdout and stderr until both end, the deadline passes or one is too long.

    ``why`` says which of the last two cut it short.
    """
    captured = _Capture()
    pipes = ((proc.stdout, captured.out, max_output), (proc.stderr, captured.err, _MAX_STDERR))
    sinks = {pipe.fileno(): (sink, limit) for pipe, sink, limit in pipes if pipe is not None}
    with selectors.DefaultSelector() as selector:
        for fd in sinks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and not captured.why:
            left = deadline - time.monotonic()
            if left <= 0:
                captured.why = "timed_out"
                break
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                sink, limit = sinks[key.fd]
                sink.extend(chunk)
                if len(sink) > limit:
                    captured.why = f"printed more than {limit >> 10} KiB"
    return captured


class PySpyDumper:
    """``py-spy dump --pid <pid> --json --nonblocking``, bounded in time and output."""

    def __init__(
        self,
        binary: str = "py-spy",
        timeout_s: float = DUMP_TIMEOUT_S,
        max_output: int = MAX_OUTPUT,
    ) -> None:
        """Use ``binary`` (a path, or a name looked up on ``PATH``)."""
        if timeout_s <= 0 or max_output <= 0:
            msg = f"timeout_s {timeout_s} and max_output {max_output} must be above 0"
            raise ValueError(msg)
        self._binary = binary
        self._timeout_s = timeout_s
        self._max_output = max_output

    def argv(self, pid: int) -> list[str]:
        """The command line for process ``pid``: frames only, never ``--locals``."""
        return [self._binary, "dump", "--pid", str(pid), "--json", "--nonblocking"]

    def __call__(self, pid: int) -> StackResult:
        """Dump ``pid``'s stacks; every failure is a one-line error."""
        try:
            proc = subprocess.Popen(  # noqa: S603 - our binary and a pid the agent watches
                self.argv(pid),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_ENV,
            )
        except OSError as exc:
            return StackResult(
                error=f"py-spy could not start ({self._binary}): {exc.strerror or exc}"
            )
        deadline = time.monotonic() + self._timeout_s
        with proc:
            captured = _read(proc, deadline, self._max_output)
            if captured.why:
                proc.kill()
            try:
                code = proc.wait(timeout=max(deadline - time.monotonic(), 0.05))
            except subprocess.TimeoutExpired:  # it closed its output, but runs on
                proc.kill()
                proc.wait()
                captured.why = captured.why or "timed_out"
        if captured.why == "timed_out":
            return StackResult(error=f"py-spy did not finish in {self._timeout_s:g} s: killed")
        if captured.why:
            return StackResult(error=f"py-spy {captured.why}: killed")
        if code != 0:
            said = error_text(captured.err.decode("utf-8", "replace"))
            return StackResult(error=f"py-spy exited {code}" + (f": {said}" if said else ""))
        try:
            threads = parse_dump(captured.out.decode("utf-8", "replace"), pid)
        except PySpyOutputError as exc:
            return StackResult(error=f"py-spy printed no stack dump: {exc}"[:200])
        return StackResult(tuple(threads))


def simulated_stack() -> tuple[pb.ThreadStack, ...]:
    """What a simulated rank waits in: an all-reduce called from its training step."""
    frames = [
        pb.StackFrame(
            function="all_reduce", file="torch/distributed/distributed_c10d.py", line=2806
        ),
        pb.StackFrame(function="train_step", file="train.py", line=88),
        pb.StackFrame(function="<module>", file="train.py", line=120),
    ]
    return (pb.ThreadStack(name=MAIN_THREAD, thread_id=1, frames=frames),)


class SimulatedDumper:
    """Stacks a test or the simulator gives, by pid; an error where it says so.

    Attributes:
        stacks: the threads to answer for a pid; a pid not in it gets ``default``.
        errors: the error to answer for a pid, instead of stacks.
        calls: the pids asked about, in order.
    """

    def __init__(
        self,
        stacks: Mapping[int, Sequence[pb.ThreadStack]] | None = None,
        default: Sequence[pb.ThreadStack] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """``default`` None: :func:`simulated_stack`; ``delay_s``: how long each dump takes."""
        self.stacks = {pid: tuple(threads) for pid, threads in (stacks or {}).items()}
        self.default = simulated_stack() if default is None else tuple(default)
        self.errors: dict[int, str] = {}
        self.delay_s = delay_s
        self.calls: list[int] = []

    def __call__(self, pid: int) -> StackResult:
        """The stacks given for ``pid`` (copies: a dump may be cut to fit its answer)."""
        self.calls.append(pid)
        if self.delay_s:
            time.sleep(self.delay_s)
        if pid in self.errors:
            return StackResult(error=self.errors[pid])
        threads = self.stacks.get(pid, self.default)
        copies = []
        for thread in threads:
            copy = pb.ThreadStack()
            copy.CopyFrom(thread)
            copies.append(copy)
        return StackResult(tuple(copies))
