import random
import string

import pytest

import agent.probes.aer as aer_module
from agent.probes.aer import (
    AerAgent,
    AerLayer,
    AerLine,
    AerLineKind,
    AerSeverity,
    group_reports,
    parse_aer_line,
)

SOURCE = "pcieport 0000:15:01.0: AER: Corrected error received: 0000:18:00.0"
ERROR = (
    "nvidia 0000:18:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
)
STATUS = "nvidia 0000:18:00.0:   device [10de:2330] error status/mask=00000001/0000e000"
BIT = "nvidia 0000:18:00.0:    [ 0] RxErr                  (First)"
NO_DETAILS_SOURCE = (
    "pcieport 0000:28:01.0: AER: Correctable error message received from 0000:2a:00.0 "
    "(no details found)"
)


def parse_all(*texts: str) -> list[AerLine | None]:
    return [parse_aer_line(t) for t in texts]


class TestParseSourceLine:
    def test_port_names_the_error_source(self):
        """A root port's line gives the port, the normalised source device and the severity."""
        line = parse_aer_line(SOURCE)
        assert line is not None
        assert line.kind is AerLineKind.SOURCE
        assert (line.reporter_bus_id, line.device_bus_id) == ("0000:15:01.0", "0000:18:00.0")
        assert (line.driver, line.severity, line.multiple) == ("pcieport", "correctable", False)
        assert line.text == SOURCE

    @pytest.mark.parametrize(
        ("text", "severity", "multiple"),
        [
            ("AER: Uncorrected (Non-Fatal) error received: 0000:18:00.0", "nonfatal", False),
            ("AER: Uncorrected (Fatal) error received: 0000:18:00.0", "fatal", False),
            ("AER: Multiple Corrected error received: 0000:18:00.0", "correctable", True),
            ("AER: Correctable error message received from 0000:18:00.0", "correctable", False),
            (
                "AER: Multiple Uncorrectable (Fatal) error message received from 0000:18:00.0",
                "fatal",
                True,
            ),
            (
                (
                    "AER: Uncorrectable (Non-Fatal) error message received from 0000:18:00.0 "
                    "(no details found)"
                ),
                "nonfatal",
                False,
            ),
            ("Corrected error received: 0000:18:00.0", "correctable", False),
        ],
    )
    def test_every_wording_and_severity(self, text, severity, multiple):
        """Old and new wordings, "Multiple" and a missing "AER: " all give the same fields."""
        line = parse_aer_line(f"pcieport 0000:15:01.0: {text}")
        assert line is not None
        assert (line.kind, line.severity, line.multiple) == ("source", severity, multiple)
        assert line.device_bus_id == "0000:18:00.0"

    def test_old_kernels_give_a_requester_id(self):
        """``id=0018`` (bus 0, device 3, function 0) becomes a bus id in the port's domain."""
        line = parse_aer_line("pcieport 0002:00:03.0: AER: Corrected error received: id=0018")
        assert line is not None
        assert line.device_bus_id == "0002:00:03.0"

    def test_source_line_without_device_prefix(self):
        """A source line is recognised on its own; the reporter is then unknown."""
        line = parse_aer_line("AER: Uncorrected (Fatal) error received: 0000:DB:00.0")
        assert line is not None
        assert (line.reporter_bus_id, line.device_bus_id) == (None, "0000:db:00.0")


class TestParseDetailLines:
    def test_bus_error_line(self):
        """The ``PCIe Bus Error`` line gives severity, layer and agent of the printing device."""
        line = parse_aer_line(ERROR)
        assert line is not None
        assert line.kind is AerLineKind.ERROR
        assert (line.reporter_bus_id, line.device_bus_id, line.driver) == (
            "0000:18:00.0",
            "0000:18:00.0",
            "nvidia",
        )
        assert (line.severity, line.error_type, line.agent) == (
            AerSeverity.CORRECTABLE,
            AerLayer.PHYSICAL,
            AerAgent.RECEIVER,
        )

    @pytest.mark.parametrize(
        ("severity", "expected"),
        [
            ("Corrected", "correctable"),
            ("Correctable", "correctable"),
            ("Uncorrected (Non-Fatal)", "nonfatal"),
            ("Uncorrectable (Non-Fatal)", "nonfatal"),
            ("Uncorrected (Fatal)", "fatal"),
            ("Uncorrectable (Fatal)", "fatal"),
        ],
    )
    def test_every_severity_spelling(self, severity, expected):
        """Both the old and the new kernel names of each severity are understood."""
        line = parse_aer_line(
            f"nvidia 0000:18:00.0: PCIe Bus Error: severity={severity}, type=Transaction Layer, "
            "(Requester ID)",
        )
        assert line is not None
        assert (line.severity, line.error_type, line.agent) == (
            expected,
            "transaction",
            "requester",
        )

    @pytest.mark.parametrize(
        ("tail", "layer", "agent"),
        [
            ("type=Data Link Layer, (Transmitter ID)", "data_link", "transmitter"),
            ("type=Transaction Layer, (Completer ID)", "transaction", "completer"),
            ("type=Inaccessible, (Unregistered Agent ID)", "inaccessible", "unregistered"),
            ("type=Unaccessible, id=1800(Unregistered Agent ID)", "inaccessible", "unregistered"),
            ("type=Physical Layer, id=1800(Receiver ID)", "physical", "receiver"),
        ],
    )
    def test_every_layer_and_agent(self, tail, layer, agent):
        """Layers and agents, including the pre-4.19 ``id=`` form and the old "Unaccessible"."""
        line = parse_aer_line(
            f"nvidia 0000:18:00.0: AER: PCIe Bus Error: severity=Corrected, {tail}"
        )
        assert line is not None
        assert (line.error_type, line.agent) == (layer, agent)

    def test_unknown_words_leave_fields_empty(self):
        """A severity or layer a future kernel invents is None, not an error."""
        line = parse_aer_line(
            "nvidia 0000:18:00.0: PCIe Bus Error: severity=Deferred, type=Warp Layer, "
            "(Observer ID)",
        )
        assert line is not None
        assert (line.kind, line.severity, line.error_type, line.agent) == (
            "error",
            None,
            None,
            None,
        )

    def test_status_line(self):
        """The status line gives vendor and device ids and the status and mask registers."""
        line = parse_aer_line(STATUS)
        assert line is not None
        assert line.kind is AerLineKind.STATUS
        assert (line.vendor_id, line.device_id, line.status, line.mask) == (
            0x10DE,
            0x2330,
            0x1,
            0xE000,
        )

    @pytest.mark.parametrize(
        ("text", "bit", "name", "first"),
        [
            (BIT, 0, "RxErr", True),
            ("nvidia 0000:18:00.0:    [ 6] BadTLP                ", 6, "BadTLP", False),
            (
                "nvidia 0000:18:00.0: AER:    [20] UnsupReq               (First)",
                20,
                "UnsupReq",
                True,
            ),
            (
                "pcieport 0000:00:03.0:    [ 0] Receiver Error         (First)",
                0,
                "Receiver Error",
                True,
            ),
            ("nvidia 0000:18:00.0:    [31] Unknown Error Bit", 31, "Unknown Error Bit", False),
        ],
    )
    def test_bit_lines(self, text, bit, name, first):
        """Each set status bit gives its number, its name (old names have spaces) and (First)."""
        line = parse_aer_line(text)
        assert line is not None
        assert (line.kind, line.bit, line.bit_name, line.first) == ("bit", bit, name, first)

    def test_firmware_first_lines(self):
        """The APEI path's ``aer_status``, ``aer_layer`` and ``aer_uncor_severity`` lines parse."""
        status, layer, severity = parse_all(
            "nvidia 0000:9a:00.0: AER: aer_status: 0x00100000, aer_mask: 0x00000000",
            "nvidia 0000:9a:00.0: AER: aer_layer=Transaction Layer, aer_agent=Requester ID",
            "nvidia 0000:9a:00.0: AER: aer_uncor_severity: 0x00462030",
        )
        assert status is not None
        assert (status.kind, status.status, status.mask, status.vendor_id) == (
            "status",
            0x100000,
            0,
            None,
        )
        assert layer is not None
        assert (layer.kind, layer.error_type, layer.agent, layer.severity) == (
            "error",
            "transaction",
            "requester",
            None,
        )
        assert severity is not None
        assert (severity.kind, severity.uncor_severity) == ("uncor_severity", 0x00462030)

    def test_tlp_header_and_reported_first(self):
        """The TLP header keeps its words; "reported first" is recognised as part of a report."""
        tlp, first = parse_all(
            "nvidia 0000:db:00.0: AER:   TLP Header: 40000001 0000000f 9cf00000 00000000",
            "nvidia 0000:db:00.0: AER:   Error of this Agent is reported first",
        )
        assert tlp is not None
        assert (tlp.kind, tlp.tlp_header) == ("tlp_header", "40000001 0000000f 9cf00000 00000000")
        assert first is not None
        assert first.kind is AerLineKind.REPORTED_FIRST

    @pytest.mark.parametrize(
        ("text", "device"),
        [
            ("pcieport 0000:28:01.0: AER: found no error details for 0000:2a:00.0", "0000:2a:00.0"),
            ("pcieport 0000:28:01.0: AER: can't find device of ID2a00", "0000:2a:00.0"),
        ],
    )
    def test_no_details_lines(self, text, device):
        """A port that found no device with the error logged still names the source."""
        line = parse_aer_line(text)
        assert line is not None
        assert (line.kind, line.device_bus_id) == ("no_details", device)

    @pytest.mark.parametrize(
        "text",
        [
            "aer_ratelimit: 30 callbacks suppressed",
            "[  280.383143] aer_ratelimit: 30 callbacks suppressed",
        ],
    )
    def test_rate_limiter_lines(self, text):
        """The kernel's rate-limit notice says how many AER messages were dropped."""
        line = parse_aer_line(text)
        assert line is not None
        assert (line.kind, line.suppressed) == ("suppressed", 30)

    def test_dmesg_timestamp_is_allowed(self):
        """Text copied from dmesg, with its timestamp, parses like the bare message."""
        line = parse_aer_line(f"[ 4021.338871] {STATUS}")
        assert line is not None
        assert (line.kind, line.reporter_bus_id, line.status) == ("status", "0000:18:00.0", 1)


class TestParseNonAer:
    @pytest.mark.parametrize(
        "text",
        [
            "",
            "   ",
            "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off",
            "mlx5_core 0000:31:00.0: poll_health:835:(pid 0): device's health compromised",
            "nvidia 0000:18:00.0: AER: can't recover (no error_detected callback)",
            "pcieport 0000:d9:01.0: AER: device recovery failed",
            "   [ 0] RxErr                  (First)",
            "mlx5_core 0000:31:00.0: [1] port module event",
            "systemd[1]: Started nvidia-persistenced.service - NVIDIA Persistence Daemon.",
            "aer-inject[5521]: Corrected error received: 0000:18:00.0",
            "aer_ratelimit: many callbacks suppressed",
        ],
    )
    def test_other_lines_are_none(self, text):
        """Xid, mlx5, systemd, recovery chatter and a bare bit line without a device are not AER."""
        assert parse_aer_line(text) is None

    @pytest.mark.parametrize(
        "text",
        [
            "pcieport 0000:15:01.0: AER: Corrected error rec",
            "pcieport 0000:15:01.0: AER: Corrected error received: 0000:18:00",
            "nvidia 0000:18:00.0: PCIe Bus Error: severity=Corrected, type=Phys",
            "nvidia 0000:18:00.0:   device [10de:2330] error status/mask=0000",
            "nvidia 0000:18:00.0:    [ 0",
            "nvidia 0000:18:00.0:    [32] NoSuchBit",
            "nvidia 0000:18:00.0: AER: aer_status: 0x0010",
        ],
    )
    def test_truncated_lines_are_none(self, text):
        """A line cut short is not half parsed."""
        assert parse_aer_line(text) is None

    def test_unnormalisable_bus_id_is_none(self):
        """A VMD domain above ffff cannot be normalised, so the line is dropped, not raised."""
        assert (
            parse_aer_line("pcieport 10000:e0:06.0: AER: Corrected error received: 0000:e1:00.0")
            is None
        )
        assert (
            parse_aer_line("pcieport 0000:e0:06.0: AER: Corrected error received: 10000:e1:00.0")
            is None
        )

    def test_garbage_never_raises(self):
        """Random text built from AER fragments returns a line or None, never an exception."""
        rng = random.Random(20240611)  # noqa: S311 - reproducible noise, not secrets
        pieces = [SOURCE, ERROR, STATUS, BIT, "AER: ", "[", "]", "(First)", "id=", ":", " ", "\x00"]
        alphabet = string.printable + "äß\u2028"
        for _ in range(3000):
            parts = [rng.choice(pieces) for _ in range(rng.randint(0, 4))]
            noise = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
            text = "".join(parts)
            cut = rng.randint(0, len(text))
            parse_aer_line(text[:cut] + noise + text[cut:])
        assert parse_aer_line(SOURCE[: len(SOURCE) // 2]) is None


class TestGroupReports:
    def test_one_report_from_source_and_details(self):
        """A port's line and the device's details fold into one report with the evidence."""
        [report] = group_reports(parse_all(SOURCE, ERROR, STATUS, BIT))
        assert report.device_bus_id == "0000:18:00.0"
        assert report.reporter_bus_id == "0000:15:01.0"
        assert (report.severity, report.error_type, report.agent) == (
            "correctable",
            "physical",
            "receiver",
        )
        assert (report.vendor_id, report.device_id, report.status, report.mask) == (
            0x10DE,
            0x2330,
            1,
            0xE000,
        )
        assert (report.errors, report.first_error) == (("RxErr",), "RxErr")
        assert report.lines == (SOURCE, ERROR, STATUS, BIT.strip())

    def test_multiple_source_lends_to_every_device(self):
        """After a "Multiple" source each device's details make their own report via that port."""
        lines = parse_all(
            "pcieport 0000:b8:01.0: AER: Multiple Uncorrected (Non-Fatal) error received: "
            "0000:ba:00.0",
            "nvidia 0000:ba:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
            "type=Transaction Layer, (Requester ID)",
            "nvidia 0000:ba:00.0:    [14] CmpltTO                (First)",
            "nvidia 0000:ba:00.0: AER:   Error of this Agent is reported first",
            "pcieport 0000:b9:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
            "type=Data Link Layer, (Receiver ID)",
            "pcieport 0000:b9:00.0:    [ 4] DLP                    (First)",
        )
        first, second = group_reports(lines)
        assert (first.device_bus_id, first.reporter_bus_id, first.multiple) == (
            "0000:ba:00.0",
            "0000:b8:01.0",
            True,
        )
        assert (second.device_bus_id, second.reporter_bus_id, second.multiple) == (
            "0000:b9:00.0",
            "0000:b8:01.0",
            True,
        )
        assert (first.errors, second.errors) == (("CmpltTO",), ("DLP",))
        assert len(first.lines) == 4

    def test_single_source_is_not_lent_to_another_device(self):
        """A plain source names one device; details of another device do not inherit its port."""
        other = ERROR.replace("0000:18:00.0", "0000:2a:00.0")
        first, second = group_reports(parse_all(SOURCE, ERROR, other))
        assert first.reporter_bus_id == "0000:15:01.0"
        assert (second.device_bus_id, second.reporter_bus_id) == ("0000:2a:00.0", None)

    def test_source_without_details_is_a_report(self):
        """A source whose details were rate limited away still reports the device."""
        sources = parse_all(
            SOURCE,
            "aer_ratelimit: 12 callbacks suppressed",
            NO_DETAILS_SOURCE,
        )
        first, second = group_reports(sources)
        assert (first.device_bus_id, first.severity, first.errors) == (
            "0000:18:00.0",
            "correctable",
            (),
        )
        assert (second.device_bus_id, second.reporter_bus_id) == ("0000:2a:00.0", "0000:28:01.0")
        assert second.lines == (NO_DETAILS_SOURCE,)

    def test_non_aer_line_ends_the_report(self):
        """A line that is not AER closes the report, so a later device is not given the port."""
        lines = [*parse_all(SOURCE), None, *parse_all(ERROR, STATUS)]
        first, second = group_reports(lines)
        assert (first.device_bus_id, first.error_type) == ("0000:18:00.0", None)
        assert (second.device_bus_id, second.reporter_bus_id, second.error_type) == (
            "0000:18:00.0",
            None,
            "physical",
        )

    @pytest.mark.parametrize(
        ("severity_mask", "expected"), [(0x00462030, "nonfatal"), (0x00100000, "fatal")]
    )
    def test_firmware_first_severity_comes_from_the_severity_register(
        self, severity_mask, expected
    ):
        """Without a severity word, a status bit marked fatal in the severity register is fatal."""
        [report] = group_reports(
            parse_all(
                "nvidia 0000:9a:00.0: AER: aer_status: 0x00100000, aer_mask: 0x00000000",
                "nvidia 0000:9a:00.0: AER:    [20] UnsupReq               (First)",
                "nvidia 0000:9a:00.0: AER: aer_layer=Transaction Layer, aer_agent=Requester ID",
                f"nvidia 0000:9a:00.0: AER: aer_uncor_severity: 0x{severity_mask:08x}",
                "nvidia 0000:9a:00.0: AER:   TLP Header: 40000001 0000000f 9cf00000 00000000",
            ),
        )
        assert (report.device_bus_id, report.reporter_bus_id) == ("0000:9a:00.0", None)
        assert (report.severity, report.error_type, report.errors) == (
            expected,
            "transaction",
            ("UnsupReq",),
        )
        assert report.tlp_header == "40000001 0000000f 9cf00000 00000000"
        assert len(report.lines) == 5

    def test_a_second_error_line_of_one_device_starts_a_new_report(self):
        """Two errors of the same device are two reports, not one merged report."""
        [first, second] = group_reports(parse_all(SOURCE, ERROR, STATUS, BIT, ERROR, STATUS))
        assert (first.errors, second.errors) == (("RxErr",), ())
        assert first.reporter_bus_id == second.reporter_bus_id == "0000:15:01.0"

    def test_nothing_in_nothing_out(self):
        """No lines, or only lines without an error of their own, give no report."""
        assert group_reports([]) == []
        assert group_reports(parse_all("aer_ratelimit: 3 callbacks suppressed")) == []
        assert group_reports([None, None]) == []


class TestPublicNames:
    def test_all_lists_the_public_names(self):
        """``__all__`` names exactly the module's public classes and functions."""
        public = {
            name
            for name, value in vars(aer_module).items()
            if not name.startswith("_")
            and getattr(value, "__module__", None) == aer_module.__name__
        }
        assert set(aer_module.__all__) == public
