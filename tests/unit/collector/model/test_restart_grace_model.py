"""The restart grace in the fleet model: a node the journal remembers is not judged silent
until the grace is over, even after it has said Hello again."""

from collector.model.fleet import FleetModel
from fleetwatch.testing import made_up_hello

SILENCE_S = 15.0
GRACE_S = 60.0


def restored(*names: str) -> FleetModel:
    fleet = FleetModel()
    for name in names:
        hello = made_up_hello(name, gpus=1, nvlinks=1, ib_ports=0)
        fleet.restore(hello, reachable=True, mono=0.0, unix=0.0, grace_s=GRACE_S)
    return fleet


def test_a_node_back_in_a_restart_storm_is_not_judged_silent_before_the_grace_ends():
    """Back at 2 s, then unread for 20 s because the restarted collector is saturated with the
    fleet's first Reports: that silence is the collector's, not the node's."""
    fleet = restored("back", "away")
    fleet.on_hello(made_up_hello("back", gpus=1, nvlinks=1, ib_ports=0), 2.0, 2.0)
    assert fleet.overdue(25.0, SILENCE_S) == []
    assert sorted(fleet.overdue(GRACE_S + 1.0, SILENCE_S)) == ["away", "back"]
    fleet.touch("back", GRACE_S + 1.0, GRACE_S + 1.0)
    assert fleet.overdue(GRACE_S + 2.0, SILENCE_S) == ["away"]


def test_a_node_new_to_the_collector_gets_no_grace():
    fleet = FleetModel()
    fleet.on_hello(made_up_hello("new", gpus=1, nvlinks=1, ib_ports=0), 2.0, 2.0)
    assert fleet.overdue(2.0 + SILENCE_S + 1.0, SILENCE_S) == ["new"]


def test_only_nodes_with_a_stream_open_count_as_connected():
    """Nodes remembered from the journal are not connected until their Hello; a stream that
    ends takes its node out of the count (the garbage collector's freezer reads it)."""
    fleet = restored("a", "b", "c")
    assert fleet.connected() == 0
    fleet.on_hello(made_up_hello("a", gpus=1, nvlinks=1, ib_ports=0), 2.0, 2.0)
    fleet.on_hello(made_up_hello("d", gpus=1, nvlinks=1, ib_ports=0), 2.0, 2.0)
    assert fleet.connected() == 2
    fleet.on_disconnect("a")
    assert fleet.connected() == 1
