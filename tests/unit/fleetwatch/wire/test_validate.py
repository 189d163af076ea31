import math

import pytest

from collector.ingest.session import parse_message
from fleetwatch import PROTOCOL_VERSION
from fleetwatch.wire.settings import MAX_MESSAGE_BYTES
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import (
    MAX_SEQ,
    MAX_XID,
    WireError,
    validate_event,
    validate_hello,
    validate_report,
)

UUID = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"


def hello(**changes: object) -> pb.Hello:
    msg = pb.Hello(
        node="gpu-001",
        boot_id="4b6f1c1e-0d2a-4c55-9a0e-3f2b8a6b7c11",
        agent_version="0.1.0",
        protocol_version=PROTOCOL_VERSION,
        gpus=[pb.Gpu(index=0, uuid=UUID, pci_bus_id="0000:18:00.0", model="H100", nvlink_count=18)],
        ib_ports=[pb.IbPort(device="mlx5_0", port=1, rate="400 Gb/sec (4X NDR)")],
    )
    for key, value in changes.items():
        if isinstance(value, list):
            del getattr(msg, key)[:]
            getattr(msg, key).extend(value)
        else:
            setattr(msg, key, value)
    return msg


def event(**changes: object) -> pb.Event:
    msg = pb.Event(
        seq=1,
        time_unix_ms=1_767_225_600_000,
        kind=pb.EVENT_KIND_XID,
        target=pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=UUID),
        xid=79,
    )
    for key, value in changes.items():
        if key == "target":
            msg.target.CopyFrom(value)  # type: ignore[arg-type]
        else:
            setattr(msg, key, value)
    return msg


class TestHello:
    def test_valid_hello_gives_inventory(self):
        """A good Hello declares GPUs with link counts and IB ports."""
        inv = validate_hello(hello())
        assert inv.nvlinks_by_gpu == {UUID: 18}
        assert inv.ib_ports == frozenset({("mlx5_0", 1)})

    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"node": ""}, "node name"),
            ({"node": "bad name; rm -rf"}, "node name"),
            ({"boot_id": ""}, "boot_id"),
            ({"protocol_version": 99}, "protocol_version 99"),
            ({"agent_version": "x" * 300}, "agent_version longer"),
            ({"gpus": [pb.Gpu(uuid="nope", pci_bus_id="0000:18:00.0")]}, "uuid 'nope'"),
            ({"gpus": [pb.Gpu(uuid=UUID, pci_bus_id="18:00")]}, "pci_bus_id"),
            (
                {"gpus": [pb.Gpu(uuid=UUID, pci_bus_id="0000:18:00.0")] * 2},
                "declared twice",
            ),
            ({"gpus": [pb.Gpu(uuid=UUID, pci_bus_id="0000:18:00.0", nvlink_count=999)]}, "NVLinks"),
            ({"ib_ports": [pb.IbPort(device="mlx5_0", port=0)]}, "out of range"),
            ({"resume_seq": 2**63}, "resume_seq 9223372036854775808 out of range"),
            ({"ib_ports": [pb.IbPort(device="../etc", port=1)]}, "malformed"),
        ],
    )
    def test_bad_hello_names_the_field(self, changes, message):
        """Each contract breach in a Hello is refused with a message naming what was wrong."""
        with pytest.raises(WireError, match=message) as info:
            validate_hello(hello(**changes))
        assert info.value.reason == "invalid_hello"


class TestEventAndReport:
    def test_valid_event_passes(self):
        """A well-formed Xid event on a declared GPU is accepted."""
        validate_event(event(), validate_hello(hello()))

    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"seq": 0}, "seq must start at 1"),
            ({"seq": MAX_SEQ + 1}, "seq 9007199254740992 out of range"),
            ({"seq": 2**63}, "seq 9223372036854775808 out of range"),
            ({"seq": 2**64 - 1}, "out of range: sequence numbers go from 1 to"),
            ({"kind": pb.EVENT_KIND_NODE_UNREACHABLE}, "may not be sent by an agent"),
            ({"kind": 0}, "may not be sent"),
            ({"time_unix_ms": 0}, "time_unix_ms"),
            ({"detail": "x" * 5000}, "detail longer"),
            (
                {"target": pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid="GPU-ffffffff-0")},
                "unknown GPU",
            ),
            (
                {"target": pb.Target(kind=pb.TARGET_KIND_NVLINK, gpu_uuid=UUID, index=18)},
                "no NVLink 18",
            ),
            (
                {"target": pb.Target(kind=pb.TARGET_KIND_IB_PORT, device="mlx5_9", index=1)},
                "unknown IB",
            ),
            ({"target": pb.Target(kind=pb.TARGET_KIND_PCI, device="zz")}, "PCI target"),
            ({"target": pb.Target()}, "target kind 0"),
        ],
    )
    def test_bad_event_names_the_problem(self, changes, message):
        """Events must be numbered, of an agent kind, and aimed at declared hardware."""
        with pytest.raises(WireError, match=message) as info:
            validate_event(event(**changes), validate_hello(hello()))
        assert info.value.reason == "invalid_event"

    def test_every_integer_an_event_journals_fits_a_signed_64_bit_column(self):
        """The largest of each integer an event may carry is accepted, and is one that SQLite's
        INTEGER and PostgreSQL's bigint hold (and JSON readers of the API read exactly)."""
        inventory = validate_hello(hello())
        largest = event(seq=MAX_SEQ, time_unix_ms=2**63 - 1, xid=MAX_XID)
        validate_event(largest, inventory)
        for value in (largest.seq, largest.time_unix_ms, largest.xid, largest.target.index):
            assert -(2**63) <= value < 2**63
        assert largest.seq <= 2**53 - 1

    @pytest.mark.parametrize(
        ("sample", "message"),
        [
            (pb.Sample(signal="Bad-Name", int_value=1), "snake_case"),
            (pb.Sample(signal="x"), "no value"),
            (pb.Sample(signal="x", real_value=math.nan), "not finite"),
            (pb.Sample(signal="x", real_value=math.inf), "not finite"),
            (pb.Sample(signal="x", text_value="y" * 300), "text longer"),
        ],
    )
    def test_bad_sample_names_the_problem(self, sample, message):
        """NaN, unnamed or valueless samples are refused."""
        sample.target.CopyFrom(pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=UUID))
        with pytest.raises(WireError, match=message):
            validate_report(pb.Report(samples=[sample]), validate_hello(hello()))


class TestParseMessage:
    def test_oversized_is_refused_before_parsing(self):
        """Bytes over the limit are refused as oversized, naming the size."""
        with pytest.raises(WireError, match="exceeds") as info:
            parse_message(b"\x00" * (MAX_MESSAGE_BYTES + 1))
        assert info.value.reason == "oversized"

    @pytest.mark.parametrize("raw", [b"\xff\xff\xff\xff", b"\x0a\x05ab", b""])
    def test_garbage_is_malformed(self, raw):
        """Undecodable bytes, and messages with no body, are malformed."""
        with pytest.raises(WireError) as info:
            parse_message(raw)
        assert info.value.reason == "malformed"

    def test_round_trip(self):
        """A real message decodes to itself."""
        msg = pb.AgentMessage(event=event())
        assert parse_message(msg.SerializeToString()) == msg
