"""Grouped Reports (``Report.targets``): built by the agent, screened and applied by the
collector exactly as the same samples one ``Sample`` each."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from collector.model.fleet import FleetModel
from fleetwatch import PROTOCOL_VERSION
from fleetwatch.model import SampleKey, SampleValue, Target, target_key_of
from fleetwatch.wire.grouped import group_samples, keyed_samples, report_of, sample_count
from fleetwatch.wire.plausible import EXACT, rule_for
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import (
    MAX_SAMPLES,
    SampleScreen,
    WireError,
    _int_bounds,
    screen_report,
    validate_hello,
    validate_report,
)

UUID = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"
HELLO = pb.Hello(
    node="gpu-001",
    boot_id="b-1",
    protocol_version=PROTOCOL_VERSION,
    gpus=[pb.Gpu(index=0, uuid=UUID, pci_bus_id="0000:18:00.0", nvlink_count=2)],
    ib_ports=[pb.IbPort(device="mlx5_0", port=1, rate="400 Gb/sec (4X NDR)")],
)
INVENTORY = validate_hello(HELLO)
GPU = Target.gpu(UUID)
LINK = Target.nvlink(UUID, 1)
PORT = Target.ib_port("mlx5_0", 1)
NODE = Target.node()
SAMPLES: list[tuple[SampleKey, SampleValue]] = [
    ((GPU, "temperature_celsius"), 61),
    ((LINK, "nvlink_up"), 1),
    ((GPU, "power_watts"), 412.5),
    ((PORT, "ib_state"), "ACTIVE"),
    ((LINK, "nvlink_crc_errors"), 3),
    ((NODE, "agent_rss_bytes"), 123_456),
    ((GPU, "ecc_dbe_aggregate_total"), 2**64 + 5),  # beyond int64: travels as a real
]


def test_both_forms_carry_the_same_samples():
    flat = report_of(7, SAMPLES, grouped=False)
    grouped = report_of(7, SAMPLES, grouped=True)
    assert not grouped.samples
    assert len(grouped.targets) == 4  # one group a target, in first-seen order
    assert [target_key_of(g.target) for g in grouped.targets] == [
        target_key_of(t.to_pb()) for t in (GPU, LINK, PORT, NODE)
    ]
    assert sample_count(flat) == sample_count(grouped) == len(SAMPLES)
    assert Counter(keyed_samples(flat)) == Counter(keyed_samples(grouped))
    big = next(v for k, s, v in keyed_samples(grouped) if s == "ecc_dbe_aggregate_total")
    assert isinstance(big, float)
    assert big == float(2**64 + 5)
    # a GPU's UUID is written once, not once per sample
    assert grouped.SerializeToString().count(UUID.encode()) == 2  # the GPU and its NVLink
    assert flat.SerializeToString().count(UUID.encode()) == 5


def test_the_screen_takes_the_same_from_both_forms():
    flat = screen_report(report_of(7, SAMPLES, grouped=False), INVENTORY)
    grouped = screen_report(report_of(7, SAMPLES, grouped=True), INVENTORY)
    assert Counter(flat.accepted) == Counter(grouped.accepted)
    assert len(grouped.accepted) == len(SAMPLES)
    assert grouped.count == flat.count == len(SAMPLES)
    assert not grouped.rejected


def test_a_bad_group_is_refused_whole_and_the_rest_is_taken():
    """Columns of unequal length, or a target the node never declared: the group's samples
    are refused and counted by reason; the other groups and the flat samples are taken."""
    good = group_samples([((GPU, "temperature_celsius"), 70), ((GPU, "power_watts"), 300.0)])[0]
    uneven = pb.TargetSamples(
        target=GPU.to_pb(), int_signals=["sm_clock_mhz", "gpu_present"], int_values=[1410]
    )
    unknown = group_samples([((Target.gpu("GPU-ffffffff-0000"), "power_watts"), 1.0)])[0]
    beyond = group_samples([((Target.nvlink(UUID, 9), "nvlink_up"), 1)])[0]
    flat = pb.Sample(target=NODE.to_pb(), signal="agent_rss_bytes", int_value=5)
    report = pb.Report(samples=[flat], targets=[uneven, good, unknown, beyond])
    screen = SampleScreen(INVENTORY)
    for _ in range(2):  # the second time the GPU target is already known: still uneven
        out = screen.screen(report)
        assert out.rejected == Counter({"uneven_columns": 2, "bad_target": 2})
        assert "2 int signal names for 1 values" in out.examples["uneven_columns"]
        assert "GPU-ffffffff-0000" in out.examples["bad_target"]
        assert {(s, v) for _, s, v in out.accepted} == {
            ("agent_rss_bytes", 5),
            ("temperature_celsius", 70),
            ("power_watts", 300.0),
        }
        assert out.count == 7  # the flat one, 2 uneven (by their names), 2 good, 1 and 1
    with pytest.raises(WireError, match="2 int signal names for 1 values"):
        validate_report(pb.Report(targets=[uneven]), INVENTORY)
    with pytest.raises(WireError, match="unknown GPU"):
        validate_report(pb.Report(targets=[unknown]), INVENTORY)


def test_bad_values_in_a_group_are_refused_one_by_one():
    group = pb.TargetSamples(
        target=GPU.to_pb(),
        int_signals=["temperature_celsius", "Bad-Name", "gpu_present", "utilization_gpu_percent"],
        int_values=[65, 1, 7, -3],
        real_signals=["power_watts", "power_watts"],
        real_values=[math.nan, 250.0],
        text_signals=["temperature_celsius", "ib_state"],
        text_values=["hot", "x" * 300],
    )
    out = screen_report(pb.Report(targets=[group]), INVENTORY)
    assert out.rejected == Counter(
        {
            "bad_signal": 1,
            "out_of_range": 1,  # a flag of 7
            "negative": 1,
            "not_finite": 1,
            "wrong_type": 1,  # text where a number belongs
            "text_too_long": 1,
        }
    )
    assert [(s, v) for _, s, v in out.accepted] == [
        ("temperature_celsius", 65),
        ("power_watts", 250.0),
    ]
    with pytest.raises(WireError, match="is not snake_case"):  # the first it meets
        validate_report(pb.Report(targets=[group]), INVENTORY)


def test_too_many_grouped_samples_refuse_the_report():
    names = ["nvlink_up"] * (MAX_SAMPLES // 2 + 1)
    group = pb.TargetSamples(target=LINK.to_pb(), int_signals=names, int_values=[1] * len(names))
    report = pb.Report(targets=[group, group])
    with pytest.raises(WireError, match=f"{2 * len(names)} samples in one report"):
        SampleScreen(INVENTORY).screen(report)
    with pytest.raises(WireError, match="samples in one report"):
        validate_report(report, INVENTORY)
    empty = pb.Report(targets=[pb.TargetSamples(target=NODE.to_pb())] * (MAX_SAMPLES + 1))
    with pytest.raises(WireError, match="target groups in one report"):
        SampleScreen(INVENTORY).screen(empty)


@pytest.mark.parametrize("signal", [*sorted(EXACT), "x_total", "ib_foo_saturated", "whatever"])
def test_the_int_range_says_what_the_table_says(signal):
    """The grouped screen's quick check of an int is the table's own verdict."""
    for value in (-(2**63), -5, -1, 0, 1, 2, 7, 100, 101, 1000, 10**6, 2**40, 2**63 - 1):
        bounds = _int_bounds(signal)
        quick = bounds is not None and bounds[0] <= value <= bounds[1]
        assert quick == rule_for(signal).fits(value), (signal, value)


def test_the_model_holds_the_same_after_either_form():
    models = []
    for grouped in (False, True):
        fleet = FleetModel()
        fleet.on_hello(HELLO, 0.0, 0.0)
        fleet.apply_report("gpu-001", report_of(1, SAMPLES, grouped=grouped))
        node = fleet.snapshot()["gpu-001"]
        gpu = node.gpus[UUID]
        models.append(
            (
                dict(gpu.signals),
                {k: dict(v) for k, v in gpu.link_signals.items()},
                dict(gpu.nvlink_up),
                node.ports[("mlx5_0", 1)].state,
                dict(node.signals),
            )
        )
    assert models[0] == models[1]
    assert models[1][2] == {1: True}
    assert models[1][3] == "ACTIVE"
