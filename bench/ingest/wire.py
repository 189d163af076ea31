"""Recorded agent traffic for ``bench/collector_ingest.py``, and its replay as many nodes.

A :class:`Recording` holds the wire messages real agents on simulated nodes sent
(``bench/ingest/record.py``): one busy node's Hello, its first Report (every value), its
steady-state Reports (one a second: the samples that changed, or none as a heartbeat), one of
its events (a corrected PCIe AER error, read from the kernel log), and for each kind of fault the
messages a node sent right after the fault.

Replaying them as another node (:class:`NodeWire`) changes only what must differ:

* the GPU UUIDs, replaced byte for byte by the node's own (the same length, so every length
  prefix of the protobuf encoding stays right), once per message at send;
* a Report's time, spliced in at send: a Report is ``time`` (field 1) then ``samples``
  (field 2), and the recording keeps each Report's encoded samples; a 2026 time in
  milliseconds is a 6-byte varint, so every Report of a template has one length;
* an Event's sequence number and time (it is parsed, changed and encoded again: events are
  rare);
* the Hello's node name, boot id and GPU UUIDs.

The recording is saved as JSON (bytes in base64).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetwatch.testing import made_up_uuid
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from pathlib import Path

REPORT_FIELD = 2  # AgentMessage.report
EVENT_FIELD = 3  # AgentMessage.event


def varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int."""
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def report_message(time_ms: int, samples: bytes) -> bytes:
    """An encoded ``AgentMessage(report=Report(time_unix_ms, samples))``.

    ``samples``: an encoded Report that holds only samples (its time left at 0).
    """
    body = b"\x08" + varint(time_ms) + samples
    return bytes([REPORT_FIELD << 3 | 2]) + varint(len(body)) + body


def samples_of(report: pb.Report) -> bytes:
    """``report`` encoded without its time, for :func:`report_message`."""
    bare = pb.Report()
    bare.CopyFrom(report)
    bare.time_unix_ms = 0
    return bare.SerializeToString()


@dataclass(slots=True)
class FaultScript:
    """What a node's agent sent in the seconds after one fault, in order."""

    gpu: int  # the GPU the fault hit
    uuids: list[str]  # the recorded node's GPU UUIDs, by index
    messages: list[tuple[str, bytes]]  # ("event", Event) or ("report", samples-only Report)


@dataclass(slots=True)
class Recording:
    """What real agents sent, to be replayed per node (see the module docstring)."""

    hello: bytes  # pb.Hello of the busy node
    first: bytes  # its first Report, samples only
    steady: list[bytes]  # its steady-state Reports, samples only, one a second
    probe: bytes  # pb.Event: a corrected PCIe AER error of the busy node
    uuids: list[str]  # the busy node's GPU UUIDs, by index
    faults: dict[str, FaultScript] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        """Write the recording as JSON."""

        def b64(raw: bytes) -> str:
            return base64.b64encode(raw).decode()

        doc = {
            "hello": b64(self.hello),
            "first": b64(self.first),
            "steady": [b64(r) for r in self.steady],
            "probe": b64(self.probe),
            "uuids": self.uuids,
            "faults": {
                name: {
                    "gpu": f.gpu,
                    "uuids": f.uuids,
                    "messages": [[kind, b64(raw)] for kind, raw in f.messages],
                }
                for name, f in self.faults.items()
            },
            "meta": self.meta,
        }
        path.write_text(json.dumps(doc))

    @classmethod
    def load(cls, path: Path) -> Recording:
        """Read a recording written by :meth:`save`."""
        doc = json.loads(path.read_text())
        raw = base64.b64decode
        return cls(
            hello=raw(doc["hello"]),
            first=raw(doc["first"]),
            steady=[raw(r) for r in doc["steady"]],
            probe=raw(doc["probe"]),
            uuids=list(doc["uuids"]),
            faults={
                name: FaultScript(
                    gpu=int(f["gpu"]),
                    uuids=list(f["uuids"]),
                    messages=[(str(kind), raw(b)) for kind, b in f["messages"]],
                )
                for name, f in doc["faults"].items()
            },
            meta=dict(doc["meta"]),
        )


def node_name(index: int) -> str:
    """The name of generated node ``index`` (fixed width, so names sort by number)."""
    return f"gen-{index:05d}"


class NodeWire:
    """The recorded messages as one generated node sends them."""

    __slots__ = ("_pairs", "boot_id", "name", "uuids")

    def __init__(self, recording: Recording, index: int) -> None:
        """Node ``index``: its name, boot id and GPU UUIDs (stable for an index)."""
        self.name = node_name(index)
        self.boot_id = f"00000000-0000-4000-8000-{index:012d}"
        self.uuids = [made_up_uuid(self.name, i) for i in range(len(recording.uuids))]
        self._pairs = self.pairs(recording.uuids)

    def pairs(self, recorded: list[str]) -> list[tuple[bytes, bytes]]:
        """(recorded UUID, this node's UUID) pairs, as bytes, for a recorded node's UUIDs."""
        out = []
        for old, new in zip(recorded, self.uuids, strict=True):
            if len(old) != len(new):
                msg = f"recorded GPU UUID {old!r} and {new!r} differ in length"
                raise ValueError(msg)
            out.append((old.encode(), new.encode()))
        return out

    def render(self, raw: bytes, pairs: list[tuple[bytes, bytes]] | None = None) -> bytes:
        """``raw`` with the recorded node's GPU UUIDs replaced by this node's."""
        for old, new in pairs if pairs is not None else self._pairs:
            raw = raw.replace(old, new)
        return raw

    def hello(self, recording: Recording, time_ms: int) -> bytes:
        """This node's Hello, as an encoded AgentMessage."""
        hello = pb.Hello.FromString(recording.hello)
        hello.node = self.name
        hello.boot_id = self.boot_id
        hello.time_unix_ms = time_ms
        for gpu, uuid in zip(hello.gpus, self.uuids, strict=True):
            gpu.uuid = uuid
        return pb.AgentMessage(hello=hello).SerializeToString()

    def report(self, samples: bytes, time_ms: int) -> bytes:
        """A recorded Report (samples only) as this node's, sent at ``time_ms``."""
        return report_message(time_ms, self.render(samples))

    def event(
        self,
        raw: bytes,
        seq: int,
        time_ms: int,
        pairs: list[tuple[bytes, bytes]] | None = None,
    ) -> bytes:
        """A recorded Event as this node's event ``seq`` at ``time_ms``."""
        event = pb.Event.FromString(self.render(raw, pairs))
        event.seq = seq
        event.time_unix_ms = time_ms
        return pb.AgentMessage(event=event).SerializeToString()


def check_rendering(recording: Recording) -> None:
    """Raise ValueError unless the spliced Reports decode to what protobuf itself encodes."""
    wire = NodeWire(recording, 1)
    time_ms = 1_795_000_000_123
    for samples in [recording.first, *recording.steady[:5]]:
        spliced = wire.report(samples, time_ms)
        expected = pb.Report.FromString(wire.render(samples))
        expected.time_unix_ms = time_ms
        decoded = pb.AgentMessage.FromString(spliced)
        if decoded.report != expected or len(spliced) != len(
            pb.AgentMessage(report=expected).SerializeToString()
        ):
            msg = "a spliced Report does not decode to the recorded one"
            raise ValueError(msg)
        if any(u.encode() in spliced for u in recording.uuids):
            msg = "a recorded GPU UUID survived the rewrite"
            raise ValueError(msg)
