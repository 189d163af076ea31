"""Pre-flight results from agents: hostile values refused on their own and counted."""

from __future__ import annotations

import math

import pytest

from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import WireError
from fleetwatch.wire.validate_preflight import (
    MAX_EVIDENCE,
    MAX_MEASUREMENTS,
    screen_result,
    validate_task,
)


def result(*ms: pb.PreflightMeasurement, task: str = "pf-1.a.quick") -> pb.PreflightResult:
    return pb.PreflightResult(run_id="pf-1", task_id=task, measurements=list(ms))


def test_a_good_measurement_is_taken():
    got = screen_result(
        result(
            pb.PreflightMeasurement(check="p2p_bw", component="gpu:0-gpu:1", value=380, unit="GB/s")
        )
    )
    assert [(m.check.value, m.value) for m in got.measurements] == [("p2p_bw", 380.0)]
    assert not got.rejected


@pytest.mark.parametrize(
    ("measurement", "reason"),
    [
        (pb.PreflightMeasurement(check="rm_rf", component="node"), "unknown_check"),
        (pb.PreflightMeasurement(check="p2p_bw", component="gpu;0 DROP"), "bad_component"),
        (pb.PreflightMeasurement(check="p2p_bw", component="node", value=math.nan), "bad_value"),
        (pb.PreflightMeasurement(check="p2p_bw", component="node", value=math.inf), "bad_value"),
        (pb.PreflightMeasurement(check="p2p_bw", component="node", value=1e300), "bad_value"),
        (
            pb.PreflightMeasurement(
                check="p2p_bw", component="node", evidence="x" * (MAX_EVIDENCE + 1)
            ),
            "bad_text",
        ),
        (pb.PreflightMeasurement(check="p2p_bw", component="node", unit="<script>"), "bad_text"),
    ],
)
def test_a_hostile_measurement_is_refused_alone_and_counted(
    measurement: pb.PreflightMeasurement, reason: str
):
    good = pb.PreflightMeasurement(check="h2d_bw", component="gpu:0", value=55, unit="GB/s")
    got = screen_result(result(measurement, good))
    assert got.rejected == {reason: 1}
    assert [m.check.value for m in got.measurements] == ["h2d_bw"]


def test_a_result_with_a_bad_id_or_too_many_measurements_is_refused_whole():
    with pytest.raises(WireError, match="task id"):
        screen_result(result(task="../../etc"))
    many = [pb.PreflightMeasurement(check="h2d_bw", component="gpu:0")] * (MAX_MEASUREMENTS + 1)
    with pytest.raises(WireError, match="measurements"):
        screen_result(result(*many))


def test_a_task_the_agent_must_not_run_is_refused():
    task = pb.PreflightTask(
        run_id="pf-1", task_id="pf-1.a", level="quick", checks=["ecc_mode"], timeout_s=10
    )
    validate_task(task)
    task.checks.append("format_disk")
    with pytest.raises(WireError, match="not a pre-flight check"):
        validate_task(task)
    task.ClearField("checks")
    task.checks.append("ib_write_bw")
    task.ib_tests.append(
        pb.PreflightIbTest(device="mlx5_0", port=1, peer="b", server_addr="$(reboot)", tcp_port=1)
    )
    with pytest.raises(WireError, match="server_addr"):
        validate_task(task)
