"""py-spy's JSON read into thread stacks: the real captures in tests/fixtures/py-spy/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.probes.py_spy import MAIN_THREAD, PySpyOutputError, error_text, parse_dump
from fleetwatch.wire.validate_jobs import MAX_DUMP_FRAMES, MAX_DUMP_TEXT, MAX_DUMP_THREADS

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "py-spy"
CAPTURED = Path("/", "tmp", "pyspy")  # where the captured programs ran


def capture(name: str) -> tuple[str, int]:
    """A capture's text and the pid it was taken of."""
    text = (FIXTURES / name).read_text()
    return text, json.loads(text)[0]["pid"]


def frames_of(thread) -> list[tuple[str, str, int]]:
    return [(f.function, f.file, f.line) for f in thread.frames]


class TestParseDump:
    def test_a_sleeping_main_thread_innermost_first(self):
        """The capture of sleeper.py: one thread, innermost frame first, with file and line;
        py-spy names it null (threading never imported): the process's own thread is
        MainThread."""
        text, pid = capture("sleeper.json")
        (thread,) = parse_dump(text, pid)
        assert thread.name == MAIN_THREAD
        assert thread.thread_id == pid
        assert not thread.active
        assert frames_of(thread) == [
            ("inner_wait", str(CAPTURED / "sleeper.py"), 5),
            ("outer_step", str(CAPTURED / "sleeper.py"), 9),
            ("<module>", str(CAPTURED / "sleeper.py"), 12),
        ]

    def test_the_main_thread_comes_first(self):
        """py-spy listed the watchdog thread first; the main thread is put before it, and each
        keeps its own name and frames."""
        text, pid = capture("two-threads.json")
        main, other = parse_dump(text, pid)
        assert main.name == MAIN_THREAD
        assert frames_of(main)[0] == ("train_loop", str(CAPTURED / "threaded.py"), 10)
        assert other.name == "allreduce-watchdog"
        assert other.thread_id != pid
        assert [f.function for f in other.frames][:3] == [
            "Condition.wait",
            "Event.wait",
            "collective_wait",
        ]

    def test_only_function_file_and_line_are_kept(self):
        """Whatever else py-spy prints (locals, module, short file name) does not survive."""
        raw = json.loads((FIXTURES / "sleeper.json").read_text())
        raw[0]["frames"][0]["locals"] = [{"name": "password", "repr": "'hunter2'"}]
        (thread,) = parse_dump(json.dumps(raw), raw[0]["pid"])
        assert "hunter2" not in str(thread)
        assert {f.name for f in thread.frames[0].DESCRIPTOR.fields} == {"function", "file", "line"}

    def test_threads_frames_and_texts_are_bounded(self):
        """A process of 100 threads of 100 frames with long names gives at most the wire's
        bounds, the main thread kept although py-spy listed it last."""
        raw = json.loads((FIXTURES / "sleeper.json").read_text())
        pid = raw[0]["pid"]
        frame = dict(raw[0]["frames"][0], name="f" * 1000, filename="/x" * 500)
        threads = [
            dict(raw[0], thread_name=f"worker-{n}", os_thread_id=pid + 1 + n, frames=[frame] * 100)
            for n in range(100)
        ]
        threads.append(dict(raw[0], thread_name=None, os_thread_id=pid))
        parsed = parse_dump(json.dumps(threads), pid)
        assert len(parsed) == MAX_DUMP_THREADS
        assert parsed[0].name == MAIN_THREAD
        assert max(len(t.frames) for t in parsed) == MAX_DUMP_FRAMES
        assert {len(parsed[1].frames[0].function), len(parsed[1].frames[0].file)} == {MAX_DUMP_TEXT}

    def test_threads_of_another_process_are_left_out(self):
        """Only the asked pid's threads count (py-spy's --subprocesses is never passed)."""
        text, pid = capture("sleeper.json")
        assert parse_dump(text, pid + 1) == []

    @pytest.mark.parametrize(
        ("text", "named"),
        [
            ("", "not JSON"),
            ("Error: not json", "not JSON"),
            ('{"pid": 1}', "a JSON dict, not a list of threads"),
            ("[1]", "thread 0 is not an object"),
            ('[{"pid": 1, "frames": 3}]', "thread 0 has no frames list"),
            ('[{"pid": 1, "frames": [{"name": "f"}]}]', "frame 0 of thread 0 has no name"),
        ],
    )
    def test_output_that_is_no_dump_says_why(self, text, named):
        """Output of another shape fails with what is wrong in it."""
        with pytest.raises(PySpyOutputError, match=named):
            parse_dump(text, 1)


class TestErrorText:
    def test_a_process_that_is_not_python(self):
        """What py-spy printed for `sleep 60`, on one line."""
        text = (FIXTURES / "not-python.stderr").read_text()
        assert error_text(text) == "Failed to find python version from target process"

    def test_a_process_that_exited(self):
        """The error line and its first cause, on one line."""
        text = (FIXTURES / "exited.stderr").read_text()
        assert error_text(text) == (
            "Failed to get process executable name. Check that the process is running. "
            "(No such file or directory (os error 2))"
        )

    def test_nothing_printed_is_nothing_said(self):
        """Blank stderr gives no text (the caller says the exit status)."""
        assert error_text("\n \n") == ""
