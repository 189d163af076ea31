"""The kernel log: raw /dev/kmsg records, Xid lines and AER lines from hostile text never crash
the parsers; what comes out is bounded and makes events the wire accepts or refuses cleanly."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.poll.findings import PollResult
from agent.poll.kernel_log import KernelLogPoller
from agent.probes.aer import aer_detail, group_reports, parse_aer_line
from agent.probes.xid import parse_xid_line
from agent.probes.xid_merge import XidMerger
from agent.sources.kmsg import MAX_TEXT, KmsgRecord, parse_record
from agent.sources.nvml import GpuIdentity
from fleetwatch.testing import FakeClock
from fleetwatch.wire.validate import MAX_DETAIL, Inventory, WireError, validate_event
from rules.xid_catalog import load_catalog
from tests.property.hostile import assert_clear, tried

TARGET = "kmsg"
UUID = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"
GPU = GpuIdentity(0, UUID, "0000:18:00.0", "H100", 18)
INVENTORY = Inventory(nvlinks_by_gpu={UUID: 18})
CATALOG = load_catalog()

# Pieces real lines are made of, so random combinations get past the first checks.
FRAGMENTS = st.sampled_from(
    [
        "NVRM: Xid (PCI:0000:18:00): ",
        "NVRM: Xid (PCI:ffffffff:18:00): ",
        "NVRM: Xid (PCI:0000:18:00 GPU-I:1",
        "79, pid=1, name=python",
        "99999999999, ",
        "9" * 4400 + ", ",
        "pcieport 0000:15:01.0: AER: ",
        "nvidia 0000:18:00.0: ",
        "Corrected error received: 0000:18:00.0",
        "Multiple Uncorrectable (Fatal) error message received from id=00e8",
        "PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
        "  device [10de:2330] error status/mask=00000001/0000e000",
        "   [ 0] RxErr                  (First)",
        "   [31] " + "N" * 3000,
        "  TLP Header: 4a000001 0100000f 00180000 00000000",
        "aer_status: 0x00000040, aer_mask: 0x00000000",
        "aer_layer=Transaction Layer, aer_agent=Requester ID",
        "aer_uncor_severity: 0x00062030",
        "aer_ratelimit: " + "9" * 5000 + " callbacks suppressed",
        "[ 1234.567890] ",
        "found no error details for 0000:18:00.0",
        "can't find device of ID00e8",
        "\x00",
        "\ufffd",
        " ",
        ",",
        ")",
        "(",
    ]
)
LINES = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(FRAGMENTS, st.text(max_size=8)), max_size=8).map("".join),
)


@st.composite
def raw_records(draw: st.DrawFn) -> bytes:
    """Something like ``prio,seq,ts,flag;text\\n KEY=value`` with any part broken."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=300))
    numbers = st.one_of(
        st.integers(0, 2**64).map(str),
        st.sampled_from(["-1", "", "+3", "1_0", "٣", "²", " 6", "9" * 5000, "0x10", "nan"]),
    )
    head = ",".join(draw(st.lists(numbers, min_size=0, max_size=6)))
    text = draw(LINES)
    tail = draw(st.sampled_from(["", "\n SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0", "\n" * 3]))
    return f"{head},-;{text}{tail}".encode(errors="surrogatepass")


class TestParseRecord:
    @given(raw_records())
    @example(b"6,1,2,-;" + b"x" * (1 << 20))  # a 1 MiB message is cut, not kept whole
    @example(b"-6,-3,-1,-;negative header")
    @example("٣,1,2,-;non-ASCII digits".encode())
    @example(b"6," + b"9" * 5000 + b",2,-;huge sequence number")
    @example(b"6,18446744073709551616,2,-;sequence number past u64")
    def test_a_record_parses_or_raises_value_error(self, raw):
        """A record parses into bounded, non-negative fields, or ValueError names what is wrong."""
        tried(TARGET)
        try:
            record = parse_record(raw)
        except ValueError as exc:
            assert_clear(exc, "kmsg record")
            return
        assert 0 <= record.seq < 2**64
        assert record.ts_us >= 0
        assert 0 <= record.level <= 7
        assert record.facility >= 0
        assert len(record.text) <= MAX_TEXT
        assert "\n" not in record.text


class TestXidLine:
    @given(LINES)
    @example("NVRM: Xid (PCI:0000:18:00): " + "9" * 5000 + ", pid=1")  # int() digit limit
    @example("NVRM: Xid (PCI:0000:18:00): 99999999999, pid=1")  # beyond uint32
    @example("NVRM: Xid (PCI:0000:18:00): 79, " + "x" * 20_000)  # longer than an event carries
    def test_xid_line_is_none_or_fits_the_wire(self, text):
        """An Xid line gives a uint32 Xid and a detail an event may carry, or None."""
        tried(TARGET)
        line = parse_xid_line(text)
        if line is None:
            return
        assert 0 <= line.xid <= 0xFFFF_FFFF
        assert len(line.text) <= MAX_DETAIL
        assert len(line.pci_bus_id) == len("0000:18:00.0")


class TestAerLines:
    @given(st.lists(LINES, max_size=12))
    @example(["aer_ratelimit: " + "9" * 5000 + " callbacks suppressed"])
    @example(["nvidia 0000:18:00.0:    [ 0] " + "E" * 3000] * 3)
    def test_aer_lines_never_raise(self, texts):
        """parse_aer_line never raises; grouped reports make a detail an event may carry."""
        tried(TARGET)
        lines = [parse_aer_line(t) for t in texts]
        for report in group_reports(lines):
            assert len(aer_detail([report])) <= MAX_DETAIL


class _Source:
    def __init__(self, records: list[KmsgRecord]) -> None:
        self.records = records

    def read(self) -> list[KmsgRecord]:
        records, self.records = self.records, []
        return records

    def watch(self, waker: object) -> None:
        pass

    def close(self) -> None:
        pass


def _lost(gpu, result, now_ms, *, xid=0, detail=""):
    assert len(detail) <= MAX_DETAIL


class TestKernelLogPoller:
    @given(st.lists(st.tuples(st.integers(0, 2**64 - 1), LINES), max_size=20))
    @example([(1, "NVRM: Xid (PCI:0000:18:00): 99999999999, pid=1")])
    @example([(1, "NVRM: Xid (PCI:0000:18:00): 13, " + "x" * 20_000)])
    @example([(i, f"nvidia 0000:18:00.0:    [{i % 32:2d}] Err{i}" + "y" * 200) for i in range(40)])
    def test_any_log_makes_events_the_wire_accepts_or_refuses(self, entries):
        """Every event the poller makes renders to the wire; the check accepts it or says why."""
        tried(TARGET)
        records = [KmsgRecord(seq, 0, 3, 0, text[:MAX_TEXT]) for seq, text in entries]
        poller = KernelLogPoller(_Source(records), CATALOG, XidMerger(), FakeClock())
        result = PollResult()
        errors: Counter[str] = Counter()
        poller.poll({GPU.pci_bus_id: GPU}, _lost, result, 1_767_225_600_000, errors)
        for seq, event in enumerate(result.events, start=1):
            message = event.to_pb(seq)  # a value the wire cannot carry would raise here
            try:
                validate_event(message, INVENTORY)
            except WireError as exc:
                assert exc.reason == "invalid_event"
                assert_clear(exc)
            assert len(event.detail) <= MAX_DETAIL


@pytest.mark.parametrize("size", [1 << 20])
def test_a_megabyte_line_is_not_stored_whole(size):
    """A 1 MiB kernel message is cut to MAX_TEXT; an Xid in it keeps at most MAX_DETAIL."""
    tried(TARGET)
    text = "NVRM: Xid (PCI:0000:18:00): 79, " + "z" * size
    record = parse_record(b"3,7,100,-;" + text.encode())
    assert len(record.text) == MAX_TEXT
    line = parse_xid_line(text)
    assert line is not None
    assert len(line.text) == MAX_DETAIL
