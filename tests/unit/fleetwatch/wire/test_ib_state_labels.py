"""IB port states are label values: the kernel's names are kept, nothing a node makes up."""

from __future__ import annotations

import pytest

from collector.model.fleet import FleetModel
from fleetwatch import PROTOCOL_VERSION
from fleetwatch.model import IB_PHYS_STATES, IB_PORT_STATES, Target
from fleetwatch.wire.grouped import report_of
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import screen_report, validate_hello

HELLO = pb.Hello(
    node="gpu-001",
    boot_id="b-1",
    protocol_version=PROTOCOL_VERSION,
    ib_ports=[pb.IbPort(device="mlx5_0", port=1, rate="400 Gb/sec (4X NDR)")],
)
PORT = Target.ib_port("mlx5_0", 1)


def states_after(state: str, phys: str) -> tuple[str, str]:
    fleet = FleetModel()
    fleet.on_hello(HELLO, 0.0, 0.0)
    report = report_of(
        1, [((PORT, "ib_state"), state), ((PORT, "ib_phys_state"), phys)], grouped=True
    )
    screen_report(report, validate_hello(HELLO))  # what ingest lets through
    fleet.apply_report("gpu-001", report)
    port = fleet.snapshot()["gpu-001"].ports[("mlx5_0", 1)]
    assert port.signals["ib_state"] == port.state  # the rules see what the metrics show
    return port.state, port.phys_state


@pytest.mark.parametrize(
    ("state", "phys"), [(s, p) for s in sorted(IB_PORT_STATES) for p in ("LinkUp", "Phy Test")]
)
def test_the_kernels_names_are_kept(state: str, phys: str):
    assert states_after(state, phys) == (state, phys)


@pytest.mark.parametrize(
    "made_up",
    ["ACT\x00IVE", "ACTIVE\u2028", "active", "DOWN ", "x" * 60, '"} evil{a="', "4: ACTIVE"],
)
def test_anything_else_is_unknown(made_up: str):
    assert made_up not in IB_PORT_STATES | IB_PHYS_STATES
    assert states_after(made_up, made_up) == ("unknown", "unknown")


def test_not_read_stays_not_read():
    assert states_after("", "") == ("", "")
