"""The bounds on a DUMP_RANKS answer: the agent checks them before sending, the collector after."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import WireError
from fleetwatch.wire.validate_jobs import (
    DUMP_REASON,
    MAX_DUMP_FRAMES,
    MAX_DUMP_TEXT,
    MAX_DUMP_THREADS,
    MAX_RANK_DUMPS,
    validate_rank_dumps,
)


def frame(**changes: Any) -> pb.StackFrame:
    fields: dict[str, Any] = {"function": "wait", "file": "train.py", "line": 12}
    return pb.StackFrame(**(fields | changes))


def thread(**changes: Any) -> pb.ThreadStack:
    fields: dict[str, Any] = {"name": "MainThread", "thread_id": 7, "frames": [frame()]}
    return pb.ThreadStack(**(fields | changes))


def dump(**changes: Any) -> pb.RankDump:
    fields: dict[str, Any] = {
        "job_id": "llama-7",
        "rank": 3,
        "pid": 4242,
        "state": "S",
        "wchan": "unix_stream_read_generic",
        "threads": [thread()],
        "took_s": 0.04,
    }
    return pb.RankDump(**(fields | changes))


def answer(*dumps: pb.RankDump) -> pb.CommandResult:
    return pb.CommandResult(command_id="c", ok=True, dumps=dumps)


class TestValidateRankDumps:
    def test_a_plausible_answer_passes(self):
        """The widest answer within every bound passes, as does an error without stacks."""
        widest = dump(
            threads=[thread(frames=[frame(function="f" * MAX_DUMP_TEXT)] * MAX_DUMP_FRAMES)]
            * MAX_DUMP_THREADS
        )
        validate_rank_dumps(answer(*[widest] * MAX_RANK_DUMPS))
        validate_rank_dumps(answer(dump(threads=[], error="py-spy exited 1", state="D")))
        validate_rank_dumps(answer())

    @pytest.mark.parametrize(
        ("bad", "named"),
        [
            (dump(job_id="../x"), "job id '../x'"),
            (dump(job_id=""), "job id ''"),
            (dump(rank=2**31), "rank above"),
            (dump(state="sleeping"), "state 'sleeping' must be one letter"),
            (dump(state=""), "state '' must be one letter"),
            (dump(state="1"), "state '1'"),
            (dump(wchan="a b"), "wchan 'a b'"),
            (dump(error="e" * (MAX_DUMP_TEXT + 1)), "error 'eeee"),
            (dump(took_s=math.nan), "took_s nan"),
            (dump(took_s=math.inf), "took_s inf"),
            (dump(took_s=-1.0), "took_s -1.0"),
            (dump(threads=[thread()] * (MAX_DUMP_THREADS + 1)), "65 threads; limit 64"),
            (dump(threads=[thread(name="n" * 257)]), "thread name 'nnnn"),
            (dump(threads=[thread(frames=[frame()] * 65)]), "has 65 frames; limit 64"),
            (dump(threads=[thread(frames=[frame(function="f" * 257)])]), "function 'ffff"),
            (dump(threads=[thread(frames=[frame(file="/" * 257)])]), "file '////"),
        ],
    )
    def test_what_is_out_of_bounds_is_named(self, bad, named):
        """Each field out of its bound fails with a message naming the job, rank and field."""
        with pytest.raises(WireError, match=named) as caught:
            validate_rank_dumps(answer(dump(), bad))
        assert caught.value.reason == DUMP_REASON
        if bad.job_id == "llama-7":
            assert str(caught.value).startswith("job llama-7 rank")

    def test_too_many_dumps(self):
        """More dumps than a node may send (64) fail as a whole."""
        with pytest.raises(WireError, match="65 dumps in one answer; limit 64"):
            validate_rank_dumps(answer(*[dump()] * (MAX_RANK_DUMPS + 1)))
