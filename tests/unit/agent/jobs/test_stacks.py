"""Reading a process's stacks: the real py-spy on real processes, and programs standing in for a
py-spy that hangs, floods or babbles."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.jobs.stacks import (
    PySpyDumper,
    SimulatedDumper,
    StackResult,
    find_py_spy,
    simulated_stack,
)
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

SLEEPER = """\
import threading
import time


def wait_in_collective():
    time.sleep(600)


def train_step():
    wait_in_collective()


threading.Thread(target=time.sleep, args=(600,), name="watchdog", daemon=True).start()
train_step()
"""


def dump_until(dumper: PySpyDumper, pid: int, function: str) -> StackResult:
    """Dump ``pid`` until ``function`` is on its main thread (the child is starting up)."""
    deadline = time.monotonic() + 10
    while True:
        result = dumper(pid)
        if result.threads and any(f.function == function for f in result.threads[0].frames):
            return result
        assert time.monotonic() < deadline, f"never in {function}: {result}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def py_spy() -> str:
    """The pinned py-spy, next to this interpreter; skipped only where it may not read others."""
    binary = find_py_spy()
    assert Path(binary).is_file(), f"py-spy is a pinned dependency, not found: {binary}"
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            said = PySpyDumper(binary)(other.pid).error
        finally:
            other.kill()
    if "ermission" in said:
        pytest.skip(f"this host lets no process read another's memory: {said}")
    return binary


@pytest.fixture
def sleeper(tmp_path: Path):
    script = tmp_path / "rank.py"
    script.write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, str(script)])
    yield proc
    proc.kill()
    proc.wait()


def stand_in(tmp_path: Path, body: str) -> str:
    """A program in py-spy's place: a shell script with ``body``."""
    path = tmp_path / "py-spy"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


class TestPySpyDumper:
    def test_a_real_dump_of_a_sleeping_rank(self, py_spy, sleeper, tmp_path):
        """The real py-spy reads a real Python process: the main thread first, innermost frame
        first (the function it sleeps in, from its file), then the other thread."""
        result = dump_until(PySpyDumper(py_spy), sleeper.pid, "wait_in_collective")
        assert result.error == ""
        main = result.threads[0]
        assert main.name == "MainThread"
        assert [(f.function, f.file) for f in main.frames[:3]] == [
            ("wait_in_collective", str(tmp_path / "rank.py")),
            ("train_step", str(tmp_path / "rank.py")),
            ("<module>", str(tmp_path / "rank.py")),
        ]
        assert main.frames[0].line == 6
        assert [t.name for t in result.threads] == ["MainThread", "watchdog"]

    def test_it_never_asks_for_locals(self):
        """The command line reads frames only, without stopping the process."""
        argv = PySpyDumper("/opt/py-spy").argv(4242)
        assert argv == ["/opt/py-spy", "dump", "--pid", "4242", "--json", "--nonblocking"]
        assert not {"--locals", "-l", "--native", "-n", "--subprocesses"} & set(argv)

    def test_a_process_that_is_not_python(self, py_spy):
        """py-spy's own complaint, on one line, with its exit status."""
        with subprocess.Popen(["sleep", "30"]) as other:
            try:
                result = PySpyDumper(py_spy)(other.pid)
            finally:
                other.kill()
        assert result == StackResult(
            error="py-spy exited 1: Failed to find python version from target process"
        )

    def test_a_process_that_has_exited(self, py_spy):
        """A pid with no process: py-spy's complaint and its first cause."""
        gone = subprocess.Popen(["true"])
        gone.wait()
        result = PySpyDumper(py_spy)(gone.pid)
        assert result.threads == ()
        assert result.error.startswith("py-spy exited 1: Failed to get process executable name")

    def test_a_missing_py_spy(self, tmp_path):
        """No binary where the agent looked: an error naming it, no exception."""
        result = PySpyDumper(str(tmp_path / "no-py-spy"))(os.getpid())
        assert result == StackResult(
            error=f"py-spy could not start ({tmp_path / 'no-py-spy'}): No such file or directory"
        )

    def test_a_py_spy_that_hangs_is_killed_at_its_timeout(self, tmp_path):
        """A dump that does not end in time is killed: the answer says so, in about that time."""
        binary = stand_in(tmp_path, "exec sleep 30")
        start = time.monotonic()
        result = PySpyDumper(binary, timeout_s=0.3)(os.getpid())
        assert time.monotonic() - start < 2
        assert result == StackResult(error="py-spy did not finish in 0.3 s: killed")

    def test_a_py_spy_that_closes_its_output_but_runs_on_is_killed_too(self, tmp_path):
        """Ended output is not an ended program: the time bound holds still."""
        binary = stand_in(tmp_path, "exec sleep 30 >&- 2>&-")
        result = PySpyDumper(binary, timeout_s=0.3)(os.getpid())
        assert result == StackResult(error="py-spy did not finish in 0.3 s: killed")

    def test_output_beyond_the_bound_is_not_read(self, tmp_path):
        """A py-spy printing without end is killed once past the bound."""
        binary = stand_in(tmp_path, "exec head -c 100000000 /dev/zero")
        result = PySpyDumper(binary, max_output=4096)(os.getpid())
        assert result == StackResult(error="py-spy printed more than 4 KiB: killed")

    def test_output_that_is_no_dump(self, tmp_path):
        """Exit status 0 but no JSON: an error saying so."""
        binary = stand_in(tmp_path, "echo 'py-spy 9: a new format'")
        result = PySpyDumper(binary)(os.getpid())
        assert result.error.startswith("py-spy printed no stack dump: not JSON")

    def test_a_non_zero_exit_without_words(self, tmp_path):
        """A failure with nothing on stderr still says how it ended."""
        assert PySpyDumper(stand_in(tmp_path, "exit 3"))(1) == StackResult(error="py-spy exited 3")

    def test_py_spy_gets_none_of_the_agents_environment(self, tmp_path, monkeypatch):
        """The agent's environment (tokens, paths) is not handed to py-spy; backtraces are off."""
        monkeypatch.setenv("FLEETWATCH_SECRET", "s3cret")
        seen = tmp_path / "env"
        PySpyDumper(stand_in(tmp_path, f"env > {seen}; echo []"))(1)
        env = dict(line.split("=", 1) for line in seen.read_text().splitlines())
        assert "FLEETWATCH_SECRET" not in env
        assert env["RUST_BACKTRACE"] == "0"

    def test_bad_bounds_are_refused_at_construction(self):
        """A zero time bound is a configuration error, raised when built."""
        with pytest.raises(ValueError, match="must be above 0"):
            PySpyDumper(timeout_s=0)


class TestSimulatedDumper:
    def test_given_stacks_by_pid_else_the_default(self):
        """A test gives a pid its stacks or an error; other pids get the simulated all-reduce;
        every call is recorded."""
        mine = pb.ThreadStack(name="MainThread", frames=[pb.StackFrame(function="barrier")])
        dumper = SimulatedDumper({7: [mine]})
        dumper.errors[9] = "py-spy did not finish in 2 s: killed"
        assert dumper(7).threads == (mine,)
        assert dumper(8).threads == simulated_stack()
        assert dumper(9) == StackResult(error="py-spy did not finish in 2 s: killed")
        assert dumper.calls == [7, 8, 9]

    def test_answers_are_copies(self):
        """Cutting one answer to fit does not change what the next one gets."""
        dumper = SimulatedDumper()
        del dumper(1).threads[0].frames[:]
        assert len(dumper(1).threads[0].frames) == 3
