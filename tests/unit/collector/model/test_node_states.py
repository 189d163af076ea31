from collector.actions.tally import ActionTally
from collector.model.node_states import NodeFlags, node_state
from collector.model.state import GpuState, NodeState, PortState
from fleetwatch.testing import FakeClock


def node(**kw) -> NodeState:
    n = NodeState(name="n1", boot_id="b", **kw)
    n.gpus["u0"] = GpuState(index=0, uuid="u0", pci_bus_id="0:1", model="H100", nvlink_count=18)
    n.ports["mlx5_0", 1] = PortState(
        device="mlx5_0", port=1, rate="400 Gb/sec", link_layer="InfiniBand", state="ACTIVE"
    )
    return n


def test_the_first_state_that_holds_wins():
    n = node()
    assert node_state(n, NodeFlags()) == "healthy"
    assert node_state(n, NodeFlags(firing=frozenset({"n1"}))) == "degraded"
    assert node_state(n, NodeFlags(draining=frozenset({"n1"}), firing=frozenset({"n1"}))) == (
        "draining"
    )
    assert node_state(n, NodeFlags(drained=frozenset({"n1"}), draining=frozenset({"n1"}))) == (
        "drained"
    )
    n.reachable = False
    assert node_state(n, NodeFlags(drained=frozenset({"n1"}))) == "unreachable"


def test_hardware_down_degrades_without_an_incident():
    lost = node()
    lost.gpus["u0"].present = False
    assert node_state(lost, NodeFlags()) == "degraded"
    link = node()
    link.gpus["u0"].nvlink_up[3] = False
    assert node_state(link, NodeFlags()) == "degraded"
    port = node()
    port.ports["mlx5_0", 1].state = "DOWN"
    assert node_state(port, NodeFlags()) == "degraded"
    assert node_state(node(), NodeFlags(firing=frozenset({"other"}))) == "healthy"
    unknown = node()
    unknown.ports["mlx5_0", 1].state = ""  # not reported yet: not down
    assert node_state(unknown, NodeFlags()) == "healthy"


def test_the_tally_counts_outcomes_not_unfinished_states():
    clock = FakeClock(start_unix=1_800_000_000.0)
    tally = ActionTally(clock)
    for state in ("planned", "running", "deferred"):
        tally.record("drain_node", state, "n1")
    assert tally.snapshot() == []
    tally.record("drain_node", "succeeded", "n1")
    clock.advance(5)
    tally.record("notify", "succeeded", "job/pretrain")
    tally.record("notify", "succeeded", "fleet")
    assert tally.snapshot() == [
        (("drain_node", "succeeded", "n1"), 1, 1_800_000_000.0),
        (("notify", "succeeded", ""), 2, 1_800_000_005.0),
    ]
