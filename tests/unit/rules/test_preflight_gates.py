import textwrap

import pytest

from fleetwatch.preflight.vocabulary import Check, Measurement, Verdict
from rules.gates import GPU_MODELS, NICS, GateKind, OutlierRule, model_of, odd_ones_out, outliers
from rules.gates_file import GatesFileError, load_gates, parse_gates

BOOK = load_gates()


def m(
    check: Check,
    value: float | None,
    unit: str = "",
    component: str = "gpu:0",
    *,
    text: str = "",
    error: str = "",
) -> Measurement:
    return Measurement(check, component, value, unit, text=text, error=error)


def test_every_model_and_nic_has_a_gate_for_every_check():
    for model in GPU_MODELS:
        for nic in NICS:
            missing = [c for c in Check if BOOK.gate(c, model, nic) is None]
            assert missing == [], (model, nic)


def test_the_peers_published_bars_are_the_fail_bars():
    def bar(check: Check, model: str = "H100", nic: str = "NDR") -> tuple[float | None, str]:
        gate = BOOK.gate(check, model, nic)
        assert gate is not None
        return gate.fail, gate.source

    assert bar(Check.P2P_BW)[0] == 335
    assert "aznhc" in bar(Check.P2P_BW)[1]
    assert bar(Check.H2D_BW)[0] == bar(Check.D2H_BW)[0] == 48
    assert bar(Check.ALLREDUCE_NODE)[0] == 460
    assert bar(Check.ALLREDUCE_NODE, "H200")[0] == 431
    assert bar(Check.ALLREDUCE_NODE, "A100")[0] == 228
    assert bar(Check.IB_WRITE_BW)[0] == 380  # Azure's, stricter than 80% of 400
    assert bar(Check.IB_WRITE_BW, nic="XDR")[0] == 640  # the seed's 80% of 800
    assert bar(Check.LADDER_EFFICIENCY)[0] == 0.8
    assert bar(Check.GPU_UTILISATION)[0] == 70
    assert bar(Check.P2P_BIDIR_BW, "B200")[0] == 800  # the seed target holds on NVLink 5


def test_h100_bidirectional_bar_explains_why_the_seed_target_cannot_hold():
    gate = BOOK.gate(Check.P2P_BIDIR_BW, "H100", "NDR")
    assert gate is not None
    assert gate.fail is not None
    assert gate.fail < 750
    assert "800" in gate.note
    assert "750" in gate.note
    healthy = BOOK.judge(m(Check.P2P_BIDIR_BW, 745.0, "GB/s", "gpu:0-gpu:1"), "H100", "NDR")
    assert healthy.verdict is Verdict.PASS


@pytest.mark.parametrize(
    ("value", "verdict"),
    [(300.0, Verdict.FAIL), (340.0, Verdict.WARN), (375.0, Verdict.PASS)],
)
def test_a_bandwidth_is_judged_against_fail_and_warn_bars(value, verdict):
    got = BOOK.judge(m(Check.P2P_BW, value, "GB/s", "gpu:0-gpu:1"), "NVIDIA H100 80GB HBM3", "NDR")
    assert got.verdict is verdict
    assert got.gate is not None
    assert got.gate.scope == "H100"
    assert got.gate.bar == ">= 335 GB/s"
    assert "p2p_bw gpu:0-gpu:1" in got.reason
    assert "\n" not in got.reason


def test_the_nic_decides_ib_write_bw():
    measured = m(Check.IB_WRITE_BW, 350.0, "Gb/s", "rail:mlx5_0/1:a-b")
    assert BOOK.judge(measured, "H100", "NDR").verdict is Verdict.FAIL
    assert BOOK.judge(measured, "H100", "HDR").verdict is Verdict.PASS
    assert BOOK.nic_for_rate(400) == "NDR"
    assert BOOK.nic_for_rate(123) is None


def test_what_did_not_run_is_never_a_pass():
    crashed = m(Check.P2P_BW, None, "GB/s", error="nvbandwidth exited 134")
    got = BOOK.judge(crashed, "H100", "NDR")
    assert got.verdict is Verdict.COULD_NOT_RUN
    assert "nvbandwidth exited 134" in got.reason
    empty = m(Check.P2P_BW, None, "GB/s")
    assert BOOK.judge(empty, "H100", "NDR").verdict is Verdict.COULD_NOT_RUN
    nan = m(Check.P2P_BW, float("nan"), "GB/s")
    assert BOOK.judge(nan, "H100", "NDR").verdict is Verdict.COULD_NOT_RUN


def test_a_measurement_in_the_wrong_unit_is_not_judged():
    got = BOOK.judge(m(Check.IB_WRITE_BW, 390.0, "GB/s"), "H100", "NDR")
    assert got.verdict is Verdict.COULD_NOT_RUN
    assert "'GB/s'" in got.reason
    assert "'Gb/s'" in got.reason


def test_a_model_without_gates_could_not_be_judged():
    got = BOOK.judge(m(Check.P2P_BW, 900.0, "GB/s"), "Tesla V100-SXM2-32GB", "NDR")
    assert got.verdict is Verdict.COULD_NOT_RUN
    assert "no gate" in got.reason
    assert "V100" in got.reason


def test_model_names_from_nvml():
    assert model_of("NVIDIA H100 80GB HBM3") == "H100"
    assert model_of("NVIDIA A100-SXM4-80GB") == "A100"
    assert model_of("NVIDIA H200") == "H200"
    assert model_of("NVIDIA B200") == "B200"
    assert model_of("b300") == "B300"
    assert model_of("NVIDIA GH100 2") is None
    assert model_of("Tesla V100") is None


@pytest.mark.parametrize(
    ("measurement", "verdict"),
    [
        (m(Check.ECC_MODE, 1.0, "flag"), Verdict.PASS),
        (m(Check.ECC_MODE, 0.0, "flag"), Verdict.FAIL),
        (m(Check.PERSISTENCE_MODE, 0.0, "flag"), Verdict.FAIL),
        (m(Check.ROW_REMAP, 0.0, "count"), Verdict.PASS),
        (m(Check.ROW_REMAP, 1.0, "count"), Verdict.FAIL),
        (m(Check.COMPUTE_PROCESSES, 2.0, "count"), Verdict.FAIL),
        (m(Check.GPU_COUNT, 7.0, "count", "node"), Verdict.FAIL),
        (m(Check.NVLINK_UP, 17.0, "links"), Verdict.FAIL),
        (m(Check.NVLINK_UP, 18.0, "links"), Verdict.PASS),
        (m(Check.IB_PORT, 200.0, "Gb/s", "ib:mlx5_0/1"), Verdict.FAIL),
        (m(Check.IB_PORT, 400.0, "Gb/s", "ib:mlx5_0/1"), Verdict.PASS),
        (m(Check.GPU_PCIE_LINK, None, text="gen5 x16 (max gen5 x16)"), Verdict.PASS),
        (m(Check.GPU_PCIE_LINK, None, text="gen5 x8 (max gen5 x16)"), Verdict.FAIL),
        (m(Check.NIC_PCIE_LINK, None, text="gen4 x16 (max gen5 x16)"), Verdict.FAIL),
        (m(Check.GPU_PCIE_LINK, None, text="fast"), Verdict.COULD_NOT_RUN),
        (m(Check.GPU_MODEL, None, text="NVIDIA H100 80GB HBM3"), Verdict.PASS),
        (m(Check.GPU_MODEL, None, text="NVIDIA H200"), Verdict.FAIL),
        (m(Check.DRIVER_VERSION, None, "", "node", text="570.86.15"), Verdict.PASS),
        (m(Check.LADDER_THROUGHPUT, 1234.0, "samples/s", "nodes:2"), Verdict.PASS),
    ],
)
def test_quick_checks_against_their_expected_values(measurement, verdict):
    assert BOOK.judge(measurement, "H100", "NDR").verdict is verdict


def test_the_odd_version_out_is_named():
    assert odd_ones_out({"a": "570", "b": "570", "c": "575", "d": "570"}) == {
        "c": "'575' where 3 of 4 nodes have '570'"
    }
    assert odd_ones_out({"a": "570", "b": "570"}) == {}
    tie = odd_ones_out({"a": "570", "b": "575"})
    assert set(tie) == {"a", "b"}
    assert "no majority" in tie["a"]


def test_a_low_value_stands_out_from_the_fleet():
    values = [371.0, 374.0, 369.0, 372.0, 373.0, 300.0, None, 370.0]
    found = outliers(values)
    assert [o.index for o in found] == [5]
    assert found[0].verdict is Verdict.WARN
    assert "below the fleet median" in found[0].reason


def test_no_outliers_in_a_tight_or_small_fleet_or_on_the_good_side():
    assert outliers([370.0] * 7 + [369.0]) == []  # the spread floor: 0.3% is noise
    assert outliers([370.0, 200.0, 371.0]) == []  # fewer than min_values
    assert outliers([370.0, 371.0, 369.0, 372.0, 500.0]) == []  # high is fine for bandwidth
    both = outliers([370.0, 371.0, 369.0, 372.0, 500.0], OutlierRule(direction="both"))
    assert [o.index for o in both] == [4]


def test_an_outlier_fails_when_the_file_says_so():
    rule = OutlierRule(fail_z=6.0)
    found = outliers([370.0, 371.0, 369.0, 372.0, 370.0, 185.0], rule)
    assert [(o.index, o.verdict) for o in found] == [(5, Verdict.FAIL)]


def test_quick_checks_and_recorded_ones_are_not_compared_with_the_fleet():
    assert BOOK.outlier_rule(Check.ECC_MODE) is None
    assert BOOK.outlier_rule(Check.LADDER_EFFICIENCY) is None
    assert BOOK.outlier_rule(Check.P2P_BW, "H100", "NDR") is not None
    assert [o.index for o in BOOK.outliers(Check.H2D_BW, [55.0, 55.2, 54.9, 55.1, 30.0])] == [4]


def test_the_cpu_profile_scales_the_collective_and_ladder():
    cpu = load_gates(profile="cpu")
    gloo = m(Check.ALLREDUCE_MULTI, 0.4, "GB/s", "nodes:2")
    assert BOOK.judge(gloo, "H100", "NDR").verdict is Verdict.FAIL
    got = cpu.judge(gloo, "H100", "NDR")
    assert got.verdict is Verdict.PASS
    assert got.gate is not None
    assert got.gate.scope == "profile cpu"
    efficiency = m(Check.LADDER_EFFICIENCY, 0.6, "ratio", "nodes:2")
    assert cpu.judge(efficiency, "H100", "NDR").verdict is Verdict.PASS
    assert BOOK.judge(efficiency, "H100", "NDR").verdict is Verdict.FAIL
    # what the profile does not cover falls through to the hardware gates
    assert cpu.judge(m(Check.ECC_MODE, 0.0, "flag"), "H100", "NDR").verdict is Verdict.FAIL


def test_an_unknown_profile_is_an_error():
    with pytest.raises(GatesFileError, match=r"no gate profile .gpu.*profiles: cpu"):
        load_gates(profile="gpu")


GOOD = """\
version: 1
gates:
  ecc_mode: {expect: 1, unit: flag, source: DCGM}
models:
  H100:
    p2p_bw:
      fail_below: 335
      unit: GB/s
      source: aznhc
nics:
  NDR:
    line_rate_gbps: 400
    ib_write_bw: {fail_below: 380, unit: Gb/s, source: aznhc}
"""


def test_a_small_file_loads():
    book = parse_gates(GOOD, "g.yaml")
    gate = book.gate(Check.P2P_BW, "H100", "NDR")
    assert gate is not None
    assert gate.kind is GateKind.AT_LEAST
    assert gate.line == 6


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "fail_below: 335",
            "fial_below: 335",
            "g.yaml:7: models.H100.p2p_bw.fial_below: unknown key",
        ),
        ("  H100:", "  H10O:", "g.yaml:5: models.H10O: unknown GPU model 'H10O'"),
        ("    p2p_bw:", "    p2p_bandwidth:", "g.yaml:6: models.H100.p2p_bandwidth: unknown check"),
        (
            "fail_below: 335",
            "fail_below: fast",
            "g.yaml:7: models.H100.p2p_bw.fail_below: must be a number, not 'fast'",
        ),
        (
            "fail_below: 335",
            "fail_below: -3",
            "g.yaml:7: models.H100.p2p_bw.fail_below: must be a number from 0",
        ),
        ("fail_below: 335", "fail_below: true", "must be a number, not True"),
        (
            "unit: GB/s",
            "unit: Gb/s",
            "g.yaml:8: models.H100.p2p_bw.unit: p2p_bw is measured in GB/s",
        ),
        ("source: aznhc\nnics", "note: x\nnics", "models.H100.p2p_bw.source: must be a non-empty"),
        ("  NDR:", "  EDR:", "g.yaml:11: nics.EDR: unknown NIC 'EDR'"),
        ("line_rate_gbps: 400", "line_rate_gbps: 4e", "nics.NDR.line_rate_gbps: must be a number"),
        ("gates:", "gate:", "g.yaml:2: gate: unknown top-level key 'gate'"),
        ("expect: 1,", "expect: 1, fail_above: 0,", "exactly one of fail_below, fail_above"),
        ("expect: 1,", "kind: same_on_all_nodes,", "ecc_mode is a number; kind same_on_all_nodes"),
        ("expect: 1,", "kind: bogus,", "gates.ecc_mode.kind: must be one of"),
        ("version: 1", "version: 2", "g.yaml:1: version: expected a mapping with 'version: 1'"),
        ("    p2p_bw:\n", "    p2p_bw: [\n", "g.yaml:8: not valid YAML"),
    ],
)
def test_file_problems_name_the_file_line_and_key(old, new, expected):
    assert old in GOOD
    with pytest.raises(GatesFileError) as caught:
        parse_gates(GOOD.replace(old, new, 1), "g.yaml")
    assert expected in str(caught.value)


def test_a_warn_bar_on_the_failing_side_is_an_error():
    text = GOOD.replace("fail_below: 335", "fail_below: 335\n      warn_below: 300")
    with pytest.raises(GatesFileError, match="warn_below: the warn bar 300 must not be on the"):
        parse_gates(text, "g.yaml")


def test_every_problem_is_reported_at_once():
    text = GOOD.replace("H100", "H10O").replace("ecc_mode", "ecc_mod")
    with pytest.raises(GatesFileError) as caught:
        parse_gates(text, "g.yaml")
    assert len(caught.value.problems) == 2


def test_an_outlier_section_with_a_typo_is_an_error():
    text = GOOD + textwrap.dedent("""\
        outlier:
          warn_zz: 3
          direction: sideways
        """)
    with pytest.raises(GatesFileError) as caught:
        parse_gates(text, "g.yaml")
    message = str(caught.value)
    assert "g.yaml:15: outlier.warn_zz: unknown key" in message
    assert "g.yaml:16: outlier.direction: must be low, high or both, not 'sideways'" in message


def test_an_unreadable_file_is_named(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(GatesFileError, match=r"nope\.yaml:0: cannot read"):
        load_gates(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"version: 1\n\xff\n")
    with pytest.raises(GatesFileError, match=r"bad\.yaml:2: not UTF-8"):
        load_gates(bad)


def test_the_one_node_throughput_has_a_fail_bar_of_its_own():
    """A node's one-node ladder throughput fails 10% and 6 robust z below the fleet's median;
    the simulator's healthy noise (0.6%) never comes near it, a 1.4x slower GPU does."""
    rule = BOOK.outlier_rule(Check.LADDER_THROUGHPUT, "H100", "NDR")
    assert rule is not None
    assert (rule.fail_z, rule.min_deviation) == (6.0, 0.1)
    gate = BOOK.gate(Check.LADDER_THROUGHPUT, "H100", "NDR")
    assert gate is not None
    assert "(derived)" in gate.note
    healthy = [2560.0 * (1 + 0.006 * d) for d in (-2, -1, 0, 1, 2, -1.5, 0.5, 1.5, -0.5, 0, 2.5)]
    assert BOOK.outliers(Check.LADDER_THROUGHPUT, healthy, "H100", "NDR") == []
    found = BOOK.outliers(Check.LADDER_THROUGHPUT, [*healthy, 2560.0 / 1.4], "H100", "NDR")
    assert [(o.index, o.verdict) for o in found] == [(len(healthy), Verdict.FAIL)]
    assert "fail at 6" in found[0].reason
    # the CPU profile does not compare it (processes share a few cores)
    assert load_gates(profile="cpu").outlier_rule(Check.LADDER_THROUGHPUT) is None


def test_a_gate_may_carry_its_own_outlier_rule_checked_like_the_files():
    text = GOOD.replace(
        "      source: aznhc\n",
        "      source: aznhc\n      outlier: {fail_z: 5, min_deviation: 0.2}\n",
        1,
    )
    rule = parse_gates(text, "g.yaml").outlier_rule(Check.P2P_BW, "H100", "NDR")
    assert rule is not None
    assert (rule.fail_z, rule.min_deviation, rule.warn_z) == (5.0, 0.2, 3.5)
    bad = text.replace("{fail_z: 5, min_deviation: 0.2}", "{fail_zz: 5, warn_z: 4, fail_z: 2}")
    with pytest.raises(GatesFileError) as caught:
        parse_gates(bad, "g.yaml")
    message = str(caught.value)
    assert "models.H100.p2p_bw.outlier.fail_zz: unknown key" in message
    assert "models.H100.p2p_bw.outlier.fail_z: must not be below warn_z 4, not 2" in message
    with pytest.raises(GatesFileError, match="must be true, false or an outlier rule"):
        parse_gates(text.replace("{fail_z: 5, min_deviation: 0.2}", "often"), "g.yaml")
