import math

import pytest

from agent.poll.gpu_signals import CLOCK_REASON_SIGNALS, GPU_SIGNALS, NVLINK_SIGNALS
from fleetwatch import PROTOCOL_VERSION
from fleetwatch.signals import IB_LINK_SIGNALS, NODE_LINK_SIGNALS
from fleetwatch.wire.plausible import (
    ANY,
    COUNTER,
    EARLIEST_MS,
    FUTURE_SLACK_MS,
    is_counter,
    rule_for,
    time_problem,
    value_problem,
)
from fleetwatch.wire.repeats import (
    MAX_TIMES,
    Repeats,
    mark_repeats,
    occurrences,
    parse_repeats,
    seqs_covered,
    strip_marker,
)
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import (
    MAX_DETAIL,
    MAX_SAMPLES,
    WireError,
    screen_report,
    validate_hello,
    validate_report,
)

UUID = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"
NOW_MS = 1_767_225_600_000
INVENTORY = validate_hello(
    pb.Hello(
        node="gpu-001",
        boot_id="b-1",
        protocol_version=PROTOCOL_VERSION,
        gpus=[pb.Gpu(index=0, uuid=UUID, pci_bus_id="0000:18:00.0", nvlink_count=2)],
        ib_ports=[pb.IbPort(device="mlx5_0", port=1)],
    )
)
GPU = pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=UUID)


def sample(signal: str, target: pb.Target = GPU, **value: object) -> pb.Sample:
    msg = pb.Sample(signal=signal, **value)  # type: ignore[arg-type]
    msg.target.CopyFrom(target)
    return msg


class TestTable:
    @pytest.mark.parametrize(
        ("signal", "value", "reason"),
        [
            ("temperature_celsius", 1e12, "out_of_range"),
            ("temperature_celsius", 71, None),
            ("power_watts", -5.0, "negative"),
            ("power_watts", 700.5, None),
            ("utilization_gpu_percent", 101, "out_of_range"),
            ("nvlink_up", 7, "out_of_range"),
            ("nvlink_up", -1, "negative"),
            ("gpu_present", 1, None),
            ("ecc_dbe_aggregate_total", -3, "negative"),
            ("nvlink_crc_errors", 12, None),
            ("pcie_replay_count", "lots", "wrong_type"),
            ("ib_state", 4, "wrong_type"),
            ("ib_state", "ACTIVE", None),
            ("ib_port_xmit_bytes_per_second", 5e13, "out_of_range"),
            ("ib_port_xmit_bytes", float(2**64 * 4 - 4), None),
            ("ib_symbol_error_saturated", 2, "out_of_range"),
            ("agent_outbox_pending", -1, "negative"),
            ("some_future_signal", -1e300, None),
        ],
    )
    def test_impossible_values_are_named_by_reason(self, signal, value, reason):
        """One table says what each signal may hold; an impossible value gets a reason."""
        problem = value_problem(signal, value)
        assert (problem[0] if problem else None) == reason

    def test_every_signal_the_agent_reads_from_nvml_has_a_rule(self):
        """No per-GPU or per-link signal of the agent falls through to 'anything goes'."""
        for signal in (*GPU_SIGNALS, *NVLINK_SIGNALS, "gpu_present", "pcie_link_width_max"):
            assert rule_for(signal) is not ANY, signal

    def test_link_and_heat_signals_are_not_taken_for_counters(self):
        """A rate or a flag that drops is no counter reset (the "ib_" prefix means counters)."""
        for signal in (*CLOCK_REASON_SIGNALS, *IB_LINK_SIGNALS, *NODE_LINK_SIGNALS):
            assert rule_for(signal) is not ANY, signal
            assert not is_counter(signal), signal
        assert value_problem("ib_rate_low", 2) is not None
        assert value_problem("ib_rate_gbps", 400.0) is None

    def test_counters_are_known_as_counters(self):
        """Counters (whose decrease is a reset) are told from gauges and flags."""
        assert rule_for("ecc_sbe_volatile_total") is COUNTER
        assert is_counter("pcie_replay_count")
        assert is_counter("ib_hw_out_of_buffer")
        assert not is_counter("temperature_celsius")
        assert not is_counter("ib_port_rcv_bytes_per_second")

    @pytest.mark.parametrize(
        ("time_ms", "problem"),
        [
            (NOW_MS, None),
            (NOW_MS + FUTURE_SLACK_MS, None),
            (NOW_MS + 10 * 365 * 86_400_000, "future"),
            (EARLIEST_MS - 1, "past"),
            (1, "past"),
        ],
    )
    def test_times_before_2000_or_far_ahead_are_wrong(self, time_ms, problem):
        """A clock never set (before 2000) or running ahead by more than the slack is wrong."""
        assert time_problem(time_ms, NOW_MS) == problem


class TestScreenReport:
    def test_bad_samples_are_refused_one_by_one_and_the_rest_taken(self):
        """NaN, impossible values, unknown targets and bad names cost only their own sample."""
        report = pb.Report(
            samples=[
                sample("temperature_celsius", int_value=60),
                sample("temperature_celsius", real_value=1e12),
                sample("power_watts", real_value=-5.0),
                sample("power_watts", real_value=math.nan),
                sample("Bad-Name", int_value=1),
                sample("x", target=pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid="GPU-ffffffff-0")),
                sample("ecc_sbe_volatile_total", int_value=4),
                sample("nvlink_up", target=pb.Target(kind=pb.TARGET_KIND_NVLINK, gpu_uuid=UUID)),
                sample("ib_state", text_value="y" * 300),
            ]
        )
        screened = screen_report(report, INVENTORY)
        assert [signal for _key, signal, _value in screened.accepted] == [
            "temperature_celsius",
            "ecc_sbe_volatile_total",
        ]
        assert dict(screened.rejected) == {
            "out_of_range": 1,
            "negative": 1,
            "not_finite": 1,
            "bad_signal": 1,
            "bad_target": 1,
            "no_value": 1,
            "text_too_long": 1,
        }
        assert "1e+12 is outside -40..150" in screened.examples["out_of_range"]
        assert "unknown GPU" in screened.examples["bad_target"]

    def test_a_report_too_large_to_be_one_is_still_refused_whole(self):
        """Past MAX_SAMPLES the message itself is wrong: WireError, as before."""
        report = pb.Report(samples=[sample("power_watts", int_value=1)] * (MAX_SAMPLES + 1))
        with pytest.raises(WireError, match="samples in one report") as info:
            screen_report(report, INVENTORY)
        assert info.value.reason == "invalid_report"

    def test_the_strict_check_keeps_refusing_the_first_broken_sample(self):
        """validate_report (the contract only) still raises on the first bad sample, and
        takes an implausible but well-formed one."""
        validate_report(pb.Report(samples=[sample("power_watts", real_value=-5.0)]), INVENTORY)
        with pytest.raises(WireError, match="not finite"):
            validate_report(pb.Report(samples=[sample("p", real_value=math.inf)]), INVENTORY)


class TestRepeats:
    def test_a_marker_round_trips(self):
        """What mark_repeats writes, parse_repeats reads back, seqs included."""
        detail = mark_repeats("NVRM: Xid (PCI:0000:18:00): 13, pid=1", 4990, 0.93, (11, 5000))
        assert detail == (
            "[repeated 4990 times over 0.9 s, seq 11-5000] NVRM: Xid (PCI:0000:18:00): 13, pid=1"
        )
        assert parse_repeats(detail) == Repeats(4990, 11, 5000)
        assert occurrences(detail) == 4990
        assert strip_marker(detail) == "NVRM: Xid (PCI:0000:18:00): 13, pid=1"

    def test_plain_details_stand_for_one(self):
        """An ordinary event, or a marker not at the start, counts once."""
        assert occurrences("NVRM: Xid 13") == 1
        assert occurrences("text [repeated 5 times over 1.0 s] more") == 1
        assert parse_repeats("[repeated lots of times]") is None

    def test_marking_again_replaces_the_marker_and_stays_within_the_limit(self):
        """A run of events that carry markers gets one marker; a long detail is cut."""
        inner = mark_repeats("x" * MAX_DETAIL, 3, 1.0)
        outer = mark_repeats(inner, 9, 2.0, (1, 4))
        assert outer.startswith("[repeated 9 times over 2.0 s, seq 1-4] xxx")
        assert outer.count("[repeated") == 1
        assert len(outer) == MAX_DETAIL
        assert occurrences(mark_repeats("y", 10**12, 1.0)) == MAX_TIMES

    def test_a_row_covers_the_numbers_its_marker_names(self):
        """A coalesced row stands for its seq range; any other row for its own number."""
        assert list(seqs_covered(5000, mark_repeats("x", 4990, 1.0, (11, 5000)))) == list(
            range(11, 5001)
        )
        assert list(seqs_covered(7, "plain")) == [7]
        assert list(seqs_covered(7, mark_repeats("agent storm", 40, 1.0))) == [7]
        assert list(seqs_covered(7, mark_repeats("forged", 4, 1.0, (1, 99)))) == [7]
