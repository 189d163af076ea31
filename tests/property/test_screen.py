"""Report screening and the repeat marker: whatever samples or details an agent sends, the
collector refuses bad samples one by one with a known reason, what it takes holds a value the
table allows, and a detail never claims more occurrences than the bound."""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

from fleetwatch import PROTOCOL_VERSION
from fleetwatch.wire.plausible import EXACT, rule_for, value_problem
from fleetwatch.wire.repeats import MAX_TIMES, mark_repeats, occurrences, parse_repeats
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import (
    MAX_DETAIL,
    SampleScreen,
    ScreenedReport,
    screen_report,
    validate_hello,
)
from tests.property.hostile import NUMBERS, WEIRD_TEXT, tried

TARGET = "wire"
REASONS = frozenset(
    {
        "bad_signal",
        "bad_target",
        "no_value",
        "not_finite",
        "text_too_long",
        "wrong_type",
        "negative",
        "out_of_range",
    }
)
UUID = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"
INVENTORY = validate_hello(
    pb.Hello(
        node="gpu-001",
        boot_id="b-1",
        protocol_version=PROTOCOL_VERSION,
        gpus=[pb.Gpu(index=0, uuid=UUID, pci_bus_id="0000:18:00.0", nvlink_count=2)],
    )
)
SIGNALS = st.one_of(
    st.sampled_from(sorted(EXACT)),
    st.sampled_from(["ecc_dbe_aggregate_total", "ib_port_rcv_bytes_per_second", "x_saturated"]),
    WEIRD_TEXT,
)


@st.composite
def hostile_samples(draw: st.DrawFn) -> pb.Sample:
    sample = pb.Sample(signal=draw(SIGNALS))
    sample.target.CopyFrom(pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=UUID))
    value = draw(st.one_of(NUMBERS, WEIRD_TEXT, st.none()))
    if isinstance(value, bool):
        sample.int_value = int(value)
    elif isinstance(value, str):
        sample.text_value = value
    elif isinstance(value, int) and -(2**63) <= value < 2**63:
        sample.int_value = value
    elif isinstance(value, (int, float)):
        sample.real_value = float(value) if abs(value) < 1e308 else math.inf
    return sample


@given(st.lists(hostile_samples(), max_size=30))
def test_bad_samples_are_refused_one_by_one_with_a_known_reason(samples):
    """Every sample is taken or refused with a reason from the fixed set; what is taken is
    finite and allowed by the table; the counts add up."""
    tried(TARGET)
    report = pb.Report(samples=samples)
    screened = screen_report(report, INVENTORY)
    assert set(screened.rejected) <= REASONS
    assert len(screened.accepted) + sum(screened.rejected.values()) == len(samples)
    for _key, signal, value in screened.accepted:
        assert not isinstance(value, float) or math.isfinite(value)
        assert value_problem(signal, value) is None
    # A stream's screen remembers the targets it checked: its verdicts stay the same.
    screen = SampleScreen(INVENTORY)
    for _ in range(2):
        again = screen.screen(report)
        assert again.accepted == screened.accepted
        assert again.rejected == screened.rejected


@given(WEIRD_TEXT, st.integers(-(10**15), 10**15), st.floats(allow_nan=True))
@example("[repeated 999999999 times over 1.0 s] [repeated 5 times over 1.0 s] x", 10**13, 1.0)
@example("x", 1, -0.0)
def test_a_marked_detail_is_bounded_and_reads_back(detail, times, span):
    """Whatever detail, count and span: one marker, within MAX_DETAIL, count in 1..MAX_TIMES."""
    tried(TARGET)
    marked = mark_repeats(detail, times, span)
    assert len(marked) <= MAX_DETAIL
    found = parse_repeats(marked)
    assert found is not None
    assert 1 <= found.times <= MAX_TIMES
    assert occurrences(marked) == found.times


@given(
    st.sampled_from(sorted({*EXACT, "x_per_second", "x_total", "agent_x", "ib_x", "free_form"})),
    st.one_of(
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False),
        st.sampled_from([0, 1, 0.5, -0.0, 2, 150.0, 150.5, -40, -41]),
        st.text(max_size=5),
    ),
)
def test_the_quick_check_agrees_with_the_worded_one(signal, value):
    """``fits`` (every sample's check) says yes exactly when ``problem`` finds nothing."""
    rule = rule_for(signal)
    assert rule.fits(value) == (rule.problem(value) is None)


TARGETS = [
    pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=UUID),
    pb.Target(kind=pb.TARGET_KIND_NVLINK, gpu_uuid=UUID, index=1),
    pb.Target(kind=pb.TARGET_KIND_NVLINK, gpu_uuid=UUID, index=7),  # beyond its 2 links
    pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid="GPU-ffffffff-0000"),  # never declared
    pb.Target(kind=pb.TARGET_KIND_NODE),
]
BAD_TARGETS = frozenset({2, 3})


@given(
    st.lists(
        st.tuples(st.integers(0, len(TARGETS) - 1), hostile_samples()).filter(
            lambda pair: pair[1].WhichOneof("value") is not None
        ),
        max_size=30,
    )
)
def test_grouped_samples_are_screened_as_the_same_samples_one_by_one(pairs):
    """The same samples, one Sample each or grouped by target (Report.targets), are taken
    and refused alike: the same (target, signal, value) taken, the same counts by reason,
    except that a group whose target is bad is refused whole as bad_target (one by one, a bad
    signal name is named first)."""
    tried(TARGET)
    flat, good = pb.Report(), pb.Report()
    groups: dict[int, pb.TargetSamples] = {}
    for t, sample in pairs:
        sample.target.CopyFrom(TARGETS[t])
        flat.samples.append(sample)
        if t not in BAD_TARGETS:
            good.samples.append(sample)
        group = groups.setdefault(t, pb.TargetSamples(target=TARGETS[t]))
        which = sample.WhichOneof("value")
        if which == "int_value":
            group.int_signals.append(sample.signal)
            group.int_values.append(sample.int_value)
        elif which == "real_value":
            group.real_signals.append(sample.signal)
            group.real_values.append(sample.real_value)
        else:
            group.text_signals.append(sample.signal)
            group.text_values.append(sample.text_value)
    grouped = pb.Report(targets=list(groups.values()))
    by_target = SampleScreen(INVENTORY).screen(grouped)

    def taken(screened: ScreenedReport) -> list[str]:
        # NaN is refused by both, so every value taken compares equal to itself
        return sorted(map(repr, screened.accepted))

    assert taken(by_target) == taken(screen_report(flat, INVENTORY))
    expected = screen_report(good, INVENTORY).rejected
    expected["bad_target"] += len(flat.samples) - len(good.samples)
    assert by_target.rejected == +expected
    assert by_target.count == len(pairs)
