import os
from pathlib import Path

import pytest

from agent.exceptions import SourceError
from agent.sources.kmsg import DevKmsgReader, parse_record


class TestParseRecord:
    def test_parses_header_and_text(self):
        """prio, seq and monotonic timestamp come from the header; facility and level from prio."""
        rec = parse_record(b"4,1234,5678901,-;NVRM: Xid (PCI:0000:91:00): 79, pid=1, name=x, y\n")
        assert (rec.level, rec.facility, rec.seq, rec.ts_us) == (4, 0, 1234, 5678901)
        assert rec.text.startswith("NVRM: Xid")

    def test_continuation_lines_are_not_part_of_the_text(self):
        """Key=value continuation lines after the message are dropped from the text."""
        rec = parse_record(b"3,9,10,c;pcieport 0000:00:01.0: AER\n SUBSYSTEM=pci\n DEVICE=+pci:x\n")
        assert rec.text == "pcieport 0000:00:01.0: AER"

    def test_extra_header_fields_are_allowed(self):
        """Newer kernels may add header fields after the flag."""
        rec = parse_record(b"30,5,6,-,caller=T1;hello\n")
        assert (rec.facility, rec.level, rec.text) == (3, 6, "hello")

    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            (b"no separator here", "separator"),
            (b"4,5;text", "fields"),
            (b"x,y,z,-;text", "not numeric"),
        ],
    )
    def test_malformed_records_name_the_problem(self, raw, message):
        """Truncated or corrupt records are refused with a reason."""
        with pytest.raises(ValueError, match=message):
            parse_record(raw)


class TestDevKmsgReader:
    def test_missing_device_is_a_source_error(self, tmp_path: Path):
        """Without /dev/kmsg (or CAP_SYSLOG) the error names the path."""
        with pytest.raises(SourceError, match="cannot open"):
            DevKmsgReader(str(tmp_path / "kmsg"))

    def test_reads_one_record_per_read_and_counts_malformed(self, tmp_path: Path):
        """Records are drained without blocking; a corrupt one is counted, not fatal."""
        fifo = tmp_path / "kmsg"
        os.mkfifo(fifo)
        writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        try:
            reader = DevKmsgReader(str(fifo))
            assert reader.read() == []
            os.write(writer, b"4,1,2,-;hello\n")
            records = reader.read()
            assert [r.text for r in records] == ["hello"]
            os.write(writer, b"garbage")
            assert reader.read() == []
            assert reader.malformed == 1
            reader.close()
        finally:
            os.close(writer)
