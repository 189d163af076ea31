"""The protobuf ingest: whatever bytes or fields an agent sends, the collector's decoding and
checks raise WireError with a reason from a small fixed set (a metric label), or accept it; and
what they accept converts to the domain types without error."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from collector.ingest.session import parse_message
from fleetwatch import PROTOCOL_VERSION
from fleetwatch.model import Target, event_kind_from_pb, sample_value_from_pb
from fleetwatch.wire.settings import MAX_MESSAGE_BYTES
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import (
    Inventory,
    WireError,
    validate_event,
    validate_hello,
    validate_report,
)
from fleetwatch.wire.validate_jobs import validate_job_report, validate_job_step
from tests.property.hostile import WEIRD_TEXT, assert_clear, tried

TARGET = "wire"
# Every reason the decoding and the validators may give; the collector counts rejections by it.
REASONS = frozenset(
    {
        "oversized",
        "malformed",
        "invalid_hello",
        "invalid_report",
        "invalid_event",
        "invalid_job_step",
    }
)
UUID = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"
GOOD_HELLO = pb.Hello(
    node="gpu-001",
    boot_id="4b6f1c1e-0d2a-4c55-9a0e-3f2b8a6b7c11",
    agent_version="0.1.0",
    protocol_version=PROTOCOL_VERSION,
    gpus=[pb.Gpu(index=0, uuid=UUID, pci_bus_id="0000:18:00.0", model="H100", nvlink_count=18)],
    ib_ports=[pb.IbPort(device="mlx5_0", port=1, rate="400 Gb/sec (4X NDR)")],
)
INVENTORY = validate_hello(GOOD_HELLO)
GOOD_MESSAGES = [
    pb.AgentMessage(hello=GOOD_HELLO),
    pb.AgentMessage(
        report=pb.Report(
            time_unix_ms=1,
            samples=[
                pb.Sample(
                    target=pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=UUID),
                    signal="gpu_temp",
                    real_value=40.5,
                ),
                pb.Sample(
                    target=pb.Target(kind=pb.TARGET_KIND_IB_PORT, device="mlx5_0", index=1),
                    signal="ib_state",
                    text_value="ACTIVE",
                ),
            ],
        )
    ),
    pb.AgentMessage(
        event=pb.Event(
            seq=1,
            time_unix_ms=1_767_225_600_000,
            kind=pb.EVENT_KIND_XID,
            target=pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=UUID),
            xid=79,
            detail="NVRM: Xid (PCI:0000:18:00): 79, pid=1",
        )
    ),
    pb.AgentMessage(
        job_report=pb.JobReport(
            steps=[
                pb.JobStep(
                    job_id="job-1",
                    rank=0,
                    step=1,
                    time_unix_ms=1,
                    step_time_s=1.0,
                    tokens=1000.0,
                    gpu_uuid=UUID,
                )
            ]
        )
    ),
    pb.AgentMessage(command_result=pb.CommandResult(command_id="c1", ok=True)),
]
GOOD_BYTES = [m.SerializeToString() for m in GOOD_MESSAGES]

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
DOUBLES = st.floats(allow_nan=True, allow_infinity=True)
ENUMS = st.one_of(st.integers(0, 12), st.sampled_from([100, 101, 2**31 - 1, -1, -(2**31)]))
TEXT = st.one_of(WEIRD_TEXT, st.sampled_from([UUID, "mlx5_0", "0000:18:00.0", "gpu_temp"]))


def check(message: pb.AgentMessage, inventory: Inventory = INVENTORY) -> None:
    """What the collector runs on a decoded message; on success, the conversions it does next."""
    body = message.WhichOneof("body")
    if body == "hello":
        inv = validate_hello(message.hello)
        assert len(inv.nvlinks_by_gpu) <= len(message.hello.gpus)
    elif body == "report":
        validate_report(message.report, inventory)
        for sample in message.report.samples:
            Target.from_pb(sample.target)
            value = sample_value_from_pb(sample)
            assert not isinstance(value, float) or math.isfinite(value)
    elif body == "event":
        validate_event(message.event, inventory)
        event_kind_from_pb(message.event.kind)
        Target.from_pb(message.event.target)
        # Every integer the journal keeps of an accepted event fits a signed 64-bit column.
        event = message.event
        for value in (event.seq, event.time_unix_ms, event.xid, event.target.index):
            assert -(2**63) <= value < 2**63
    elif body == "job_report":
        validate_job_report(message.job_report, inventory)


def ingest(raw: bytes) -> None:
    """Decode and check ``raw`` as the collector does; a rejection must be a bounded WireError."""
    try:
        check(parse_message(raw))
    except WireError as exc:
        assert exc.reason in REASONS
        assert_clear(exc)


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, byte) edits: 0 flips, 1 inserts, 2 deletes, 3 truncates."""
    buf = bytearray(data)
    for kind, pos, byte in edits:
        at = pos % (len(buf) + 1)
        if kind == 0 and buf:
            buf[at % len(buf)] ^= byte or 1
        elif kind == 1:
            buf.insert(at, byte)
        elif kind == 2 and buf:
            del buf[at % len(buf)]
        elif kind == 3:
            del buf[at:]
    return bytes(buf)


class TestRawBytes:
    @given(st.binary(max_size=512))
    @example(b"")
    @example(b"\x0a\x00")  # an empty hello
    @example(b"\xff" * 16)
    @example(b"\x08" + b"\xff" * 10)  # a varint that never ends
    @example(b"\x1a\xff\xff\xff\xff\x0f")  # a length far beyond the data
    @example(b"\x0b" * 200)  # groups opened and never closed
    def test_random_bytes_reject_with_a_known_reason(self, raw):
        """Random bytes decode to a checked message or a WireError with a known reason."""
        tried(TARGET)
        ingest(raw)

    @given(
        st.sampled_from(GOOD_BYTES),
        st.lists(
            st.tuples(st.integers(0, 3), st.integers(0, 2**16), st.integers(0, 255)), max_size=8
        ),
    )
    def test_mutated_messages_reject_with_a_known_reason(self, good, edits):
        """Good messages with bytes flipped, inserted, deleted or cut: accepted or WireError."""
        tried(TARGET)
        ingest(mutate(good, edits))

    def test_oversized_message_is_refused_before_decoding(self):
        """A message above the limit is refused as oversized, whatever it holds."""
        tried(TARGET)
        with pytest.raises(WireError) as info:
            parse_message(b"\x00" * (MAX_MESSAGE_BYTES + 1))
        assert info.value.reason == "oversized"
        assert_clear(info.value, str(MAX_MESSAGE_BYTES))


gpus = st.builds(pb.Gpu, index=U32, uuid=TEXT, pci_bus_id=TEXT, model=TEXT, nvlink_count=U32)
ib_ports = st.builds(pb.IbPort, device=TEXT, port=U32, rate=TEXT, link_layer=TEXT)
targets = st.builds(pb.Target, kind=ENUMS, gpu_uuid=TEXT, index=U32, device=TEXT)


@st.composite
def samples(draw: st.DrawFn) -> pb.Sample:
    sample = pb.Sample(target=draw(targets), signal=draw(TEXT))
    which = draw(st.sampled_from(["int", "real", "text", "none"]))
    if which == "int":
        sample.int_value = draw(I64)
    elif which == "real":
        sample.real_value = draw(DOUBLES)
    elif which == "text":
        sample.text_value = draw(TEXT)
    return sample


hellos = st.builds(
    pb.Hello,
    node=TEXT,
    boot_id=TEXT,
    agent_version=TEXT,
    protocol_version=st.one_of(st.just(PROTOCOL_VERSION), U32),
    driver_version=TEXT,
    nvml_version=TEXT,
    gpus=st.lists(gpus, max_size=4),
    ib_ports=st.lists(ib_ports, max_size=4),
    time_unix_ms=I64,
    resume_seq=U64,
)
events = st.builds(
    pb.Event,
    seq=U64,
    time_unix_ms=I64,
    kind=ENUMS,
    target=targets,
    xid=U32,
    xid_class=TEXT,
    detail=st.one_of(TEXT, st.just("d" * 5000)),
)


@st.composite
def job_steps(draw: st.DrawFn) -> pb.JobStep:
    step = pb.JobStep(
        job_id=draw(TEXT),
        rank=draw(U32),
        step=draw(U64),
        time_unix_ms=draw(I64),
        step_time_s=draw(DOUBLES),
        tokens=draw(DOUBLES),
        gpu_uuid=draw(TEXT),
        world_size=draw(U32),
        params=draw(DOUBLES),
        flops_per_token=draw(DOUBLES),
        checkpoint_start_unix_ms=draw(I64),
        checkpoint_end_unix_ms=draw(I64),
    )
    if draw(st.booleans()):
        step.compute_time_s = draw(DOUBLES)
    return step


messages = st.one_of(
    st.builds(pb.AgentMessage, hello=hellos),
    st.builds(
        pb.AgentMessage,
        report=st.builds(pb.Report, time_unix_ms=I64, samples=st.lists(samples(), max_size=5)),
    ),
    st.builds(pb.AgentMessage, event=events),
    st.builds(
        pb.AgentMessage,
        job_report=st.builds(pb.JobReport, steps=st.lists(job_steps(), max_size=4), dropped=U64),
    ),
)


class TestHostileFields:
    @given(messages)
    @example(  # a number no 64-bit column holds, on an event otherwise fine (issue 18)
        pb.AgentMessage(
            event=pb.Event(
                seq=2**63,
                time_unix_ms=1,
                kind=pb.EVENT_KIND_XID,
                target=pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=UUID),
            )
        )
    )
    def test_hostile_fields_reject_with_a_known_reason(self, message):
        """Well-formed messages with absurd values: NaN, huge, unicode, overlong, unknown enums."""
        tried(TARGET)
        raw = message.SerializeToString()
        ingest(raw)

    @given(job_steps())
    def test_job_step_check_names_the_job(self, step):
        """A refused step report says invalid_job_step and names its job (or its id's form)."""
        tried(TARGET)
        try:
            validate_job_step(step, INVENTORY)
        except WireError as exc:
            assert exc.reason == "invalid_job_step"
            assert_clear(exc, "job")
        else:
            assert math.isfinite(step.step_time_s)
            assert step.step_time_s > 0
