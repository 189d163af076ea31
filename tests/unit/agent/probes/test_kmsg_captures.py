"""Golden kernel-log captures: every parser against what it must produce, record by record.

Each ``tests/fixtures/kmsg/<name>.txt`` holds raw /dev/kmsg records as one ``read()`` returns
them (``prio,seq,ts_usec,flag;text``, continuation lines start with a space). Next to it,
``<name>-expected.json`` lists per record either ``{"error": <part of the ValueError>}`` or the
parsed record with its Xid and AER line, then the AER reports the whole capture folds into.
AER lines and reports leave out fields that are None or False, and the line's own text.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from agent.probes.aer import AerLine, AerLineKind, AerReport, group_reports, parse_aer_line
from agent.probes.xid import parse_xid_line
from agent.sources.kmsg import parse_record

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "kmsg"
CAPTURES = sorted(FIXTURES.glob("*.txt"))


def split_records(data: bytes) -> list[bytes]:
    """Cut a capture into raw records: a line that starts with a space continues the record."""
    records: list[bytes] = []
    for line in data.splitlines(keepends=True):
        if line.startswith(b" ") and records:
            records[-1] += line
        else:
            records.append(line)
    return records


def compact(value: AerLine | AerReport) -> dict[str, Any]:
    """The fields that say something: no None, no False, no empty tuple, no own text."""
    fields = dataclasses.asdict(value)
    fields.pop("text", None)
    return {k: v for k, v in fields.items() if v is not None and v is not False and v != ()}


def parse_capture(path: Path) -> dict[str, Any]:
    """Run every parser over one capture and shape the result like the expected JSON."""
    entries: list[dict[str, Any]] = []
    aer_lines: list[AerLine | None] = []
    for raw in split_records(path.read_bytes()):
        try:
            record = parse_record(raw)
        except ValueError as exc:
            entries.append({"error": str(exc)})
            continue
        xid = parse_xid_line(record.text)
        aer = parse_aer_line(record.text)
        aer_lines.append(aer)
        entries.append(
            {
                "record": dataclasses.asdict(record),
                "xid": None if xid is None else {"pci_bus_id": xid.pci_bus_id, "xid": xid.xid},
                "aer": None if aer is None else compact(aer),
            },
        )
    reports = [compact(report) for report in group_reports(aer_lines)]
    return {"records": entries, "aer_reports": json.loads(json.dumps(reports))}


def expected_for(path: Path) -> dict[str, Any]:
    expected: dict[str, Any] = json.loads(
        path.with_name(f"{path.stem}-expected.json").read_text("utf-8"),
    )
    return expected


class TestCaptures:
    def test_every_capture_has_its_expectation(self):
        """Captures and expected files come in pairs, and there are captures at all."""
        expected = {p.name.removesuffix("-expected.json") for p in FIXTURES.glob("*-expected.json")}
        assert {p.stem for p in CAPTURES} == expected
        assert len(CAPTURES) >= 4

    @pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.stem)
    def test_records_parse_as_expected(self, path: Path):
        """Each record gives the expected header, text, Xid and AER line, or the expected error."""
        got = parse_capture(path)["records"]
        want = expected_for(path)["records"]
        assert len(want) == len(got)
        for index, (expected, actual) in enumerate(zip(want, got, strict=True)):
            if "error" in expected:
                assert "error" in actual, f"record {index} should be refused"
                assert expected["error"] in actual["error"], f"record {index}"
            else:
                assert expected == actual, f"record {index}"

    @pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.stem)
    def test_aer_lines_fold_into_expected_reports(self, path: Path):
        """The AER lines of a capture fold into the expected reports, evidence included."""
        assert expected_for(path)["aer_reports"] == parse_capture(path)["aer_reports"]

    @pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.stem)
    def test_parsed_text_is_the_record_text(self, path: Path):
        """Xid and AER lines keep the record's text, stripped, and never a continuation line."""
        for raw in split_records(path.read_bytes()):
            try:
                record = parse_record(raw)
            except ValueError:
                continue
            assert "SUBSYSTEM=" not in record.text
            for parsed in (parse_xid_line(record.text), parse_aer_line(record.text)):
                if parsed is not None:
                    assert record.text.strip() == parsed.text


class TestCaptureCoverage:
    def texts(self) -> list[str]:
        texts = []
        for path in CAPTURES:
            for raw in split_records(path.read_bytes()):
                try:
                    texts.append(parse_record(raw).text)
                except ValueError:
                    continue
        return texts

    def test_every_xid_format_is_captured(self):
        """Plain, MIG, unknown-process and pre-pid Xid lines and the announcement are covered."""
        xids = [t for t in self.texts() if parse_xid_line(t) is not None]
        assert any("GPU-I:" in t and "GPU-CI:" in t for t in xids)
        assert any("GPU-I:" in t and "GPU-CI:" not in t for t in xids)
        assert any("pid='<unknown>', name=<unknown>" in t for t in xids)
        assert any("pid=" not in t for t in xids)
        assert any("pid=" in t and "<unknown>" not in t and "GPU-I:" not in t for t in xids)
        assert any(t.startswith("NVRM: GPU at PCI:") for t in self.texts())

    def test_every_aer_line_kind_is_captured(self):
        """Each kind of AER line appears in some capture, so the golden files test it."""
        kinds = {line.kind for t in self.texts() if (line := parse_aer_line(t)) is not None}
        assert set(AerLineKind) == kinds

    def test_unrelated_and_malformed_records_are_captured(self):
        """Captures include mlx5, NCCL and systemd lines, and records the parser refuses."""
        texts = self.texts()
        for marker in ("mlx5_core", "NCCL", "systemd["):
            assert any(marker in t for t in texts), marker
        refused = [e for path in CAPTURES for e in expected_for(path)["records"] if "error" in e]
        assert len(refused) >= 3
