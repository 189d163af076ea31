"""The job socket's datagram parser: any bytes from any local process become a checked JobStep
or a JobReportError with a short reason label and a bounded message; the queue stays bounded."""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from agent.jobs.listener import JobQueue
from agent.jobs.report import JobReportError, parse_report, unsent_count
from agent.poll.sampler import NodeInventory
from agent.sources.nvml import GpuIdentity
from fleetwatch.wire.validate_jobs import validate_job_step
from tests.property.hostile import NUMBERS, WEIRD_TEXT, assert_clear, deep, nested, tried

TARGET = "job_socket"
UUID = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"
INVENTORY = NodeInventory("550", "12", (GpuIdentity(0, UUID, "0000:18:00.0", "H100", 18),), ())
REASONS = frozenset(
    {"not_json", "version", "missing_field", "bad_type", "bad_value", "unknown_gpu"}
)
GOOD = {"job": "j1", "rank": 0, "step": 1, "time": 1_767_225_600.0, "step_time": 1.0}
KEYS = [
    "v",
    "job",
    "rank",
    "step",
    "time",
    "step_time",
    "tokens",
    "gpu",
    "world_size",
    "params",
    "flops_per_token",
    "compute_time",
    "checkpoint",
    "unsent",
]
VALUES = st.one_of(NUMBERS, WEIRD_TEXT, st.none(), nested(), st.lists(NUMBERS, max_size=3))


@st.composite
def reports(draw: st.DrawFn) -> bytes:
    """A step report with fields changed, removed or added; or raw bytes."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=300))
    report: dict[str, object] = dict(GOOD)
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=5)):
        if draw(st.booleans()):
            report[key] = draw(VALUES)
        else:
            report.pop(key, None)
    if kind == 3:
        return repr(draw(nested())).encode()
    try:
        return json.dumps(report, allow_nan=True).encode()
    except (ValueError, OverflowError):  # a 400-digit int: write it by hand
        return repr(report).encode()


def check(data: bytes) -> None:
    try:
        step = parse_report(data, INVENTORY)
    except JobReportError as exc:
        assert exc.reason in REASONS
        assert_clear(exc, "step report", "job", "GPU")
        return
    validate_job_step(step)  # what the agent forwards, the collector accepts
    assert 0 <= unsent_count(data) < 2**31


class TestParseReport:
    @given(reports())
    @example(b"[" * 100_000)  # RecursionError inside json
    @example(b'{"v": "' + b"x" * 65_536 + b'"}')  # a 64 KiB value in the message
    @example(b'{"job": "' + b"j" * 65_536 + b'", "rank": 0, "step": 1, "time": 1, "step_time": 1}')
    @example(b'{"job": "j", "rank": ' + b"9" * 5000 + b', "step": 1, "time": 1, "step_time": 1}')
    @example(b'{"job": "j", "rank": 0, "step": 1, "time": 1e308, "step_time": 1}')
    @example(b'{"job": "j", "rank": 0, "step": 1, "time": 1, "step_time": NaN}')
    @example(
        b'{"job": "j", "rank": 0, "step": 1, "time": 1, "step_time": 1, '
        b'"checkpoint": [1e308, 1e308]}'
    )
    @example(
        b'{"job": "j", "rank": 0, "step": 1, "time": 1, "step_time": 1, "gpu": "'
        + b"G" * 5000
        + b'"}'
    )
    @example(deep(5000, '{"a":', "}").encode())
    def test_any_datagram_is_a_step_or_a_clear_rejection(self, data):
        """Any datagram: a step the collector accepts, or JobReportError with a known reason."""
        tried(TARGET)
        check(data)

    @given(st.binary(min_size=1, max_size=64), st.integers(1, 65_536))
    def test_big_datagrams_are_rejected_not_kept(self, chunk, repeat):
        """A 64 KiB datagram of junk is refused; nothing of it is queued."""
        tried(TARGET)
        data = (chunk * repeat)[:65_536]
        queue = JobQueue(limit=4)
        try:
            step = parse_report(data, INVENTORY)
        except JobReportError as exc:
            queue.reject(exc)
            assert_clear(exc)
            assert len(queue) == 0
        else:
            queue.add(step)
            assert len(step.job_id) <= 128


def test_queue_is_bounded():
    """However many good reports arrive, the queue keeps at most its limit and counts the rest."""
    tried(TARGET)
    queue = JobQueue(limit=100)
    step = parse_report(json.dumps(GOOD).encode(), INVENTORY)
    for _ in range(1000):
        queue.add(step)
    assert len(queue) == 100
    assert queue.dropped == 900
