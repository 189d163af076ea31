"""Samples into the fleet model by remembered targets: the same model as the general path."""

from __future__ import annotations

from typing import TYPE_CHECKING

from collector.model.fleet import MAX_SIGNALS_PER_TARGET, FleetModel
from collector.model.slots import SLOT_KEY
from fleetwatch.model import SampleValue, Target, sample_to_pb
from fleetwatch.testing import made_up_hello

if TYPE_CHECKING:
    from collector.model.slots import TargetSlot

NODE = "n1"


class Listener:
    """An observer that wants what its set names and keeps what it hears."""

    def __init__(self, wanted: set[str]) -> None:
        self.wanted = wanted
        self.asked: list[str] = []
        self.heard: list[tuple[str, str, str, SampleValue]] = []
        self.inventories: list[str] = []

    def wants(self, signal: str) -> bool:
        self.asked.append(signal)
        return signal in self.wanted

    def note_samples(self, node: str, noted: list[tuple[TargetSlot, str, SampleValue]]) -> None:
        self.heard += [(node, slot[SLOT_KEY], signal, value) for slot, signal, value in noted]

    def note_event(self, *_: object) -> None:
        pass

    def note_node(self, node: str) -> None:
        pass

    def note_inventory(self, node: str) -> None:
        self.inventories.append(node)


def fleet_of() -> tuple[FleetModel, str]:
    fleet = FleetModel()
    fleet.on_hello(made_up_hello(NODE, gpus=2, nvlinks=2, ib_ports=1), 0.0, 0.0)
    uuid = next(iter(fleet.view()[NODE].gpus))
    return fleet, uuid


def apply(fleet: FleetModel, *samples: tuple[Target, str, SampleValue]) -> int:
    return fleet.apply_samples(NODE, [sample_to_pb(t, s, v) for t, s, v in samples])


def test_values_land_on_their_targets_and_counter_drops_are_counted():
    fleet, uuid = fleet_of()
    port = Target.ib_port("mlx5_0", 1)
    assert (
        apply(fleet, (Target.gpu(uuid), "ecc_sbe_volatile_total", 9), (port, "ib_state", "ACTIVE"))
        == 0
    )
    # a counter going down is a reset; a gauge going down is not; text is never compared
    resets = apply(
        fleet,
        (Target.gpu(uuid), "ecc_sbe_volatile_total", 2),
        (Target.gpu(uuid), "temperature_celsius", 50.0),
        (Target.gpu(uuid), "temperature_celsius", 40.0),
        (port, "ib_state", "DOWN"),
        (Target.nvlink(uuid, 1), "nvlink_crc_errors", 5),
        (Target.node(), "agent_rss_bytes", 7),
    )
    assert resets == 1
    node = fleet.view()[NODE]
    gpu = node.gpus[uuid]
    assert gpu.signals == {"ecc_sbe_volatile_total": 2, "temperature_celsius": 40.0}
    assert gpu.link_signals == {1: {"nvlink_crc_errors": 5}}
    assert node.ports["mlx5_0", 1].state == "DOWN"  # a model field, set from its signal
    assert node.signals == {"agent_rss_bytes": 7}


def test_model_fields_follow_their_signals():
    fleet, uuid = fleet_of()
    apply(fleet, (Target.gpu(uuid), "gpu_present", 0), (Target.nvlink(uuid, 0), "nvlink_up", 0))
    gpu = fleet.view()[NODE].gpus[uuid]
    assert gpu.present is False
    assert gpu.nvlinks_down == 1


def test_a_target_holds_a_bounded_number_of_signals():
    fleet, uuid = fleet_of()
    many = [(Target.gpu(uuid), f"made_up_{i}", i) for i in range(MAX_SIGNALS_PER_TARGET + 50)]
    apply(fleet, *many)
    apply(fleet, (Target.gpu(uuid), "made_up_0", 99))  # one it holds still changes
    signals = fleet.view()[NODE].gpus[uuid].signals
    assert len(signals) == MAX_SIGNALS_PER_TARGET
    assert signals["made_up_0"] == 99


def test_a_new_hello_starts_the_node_afresh():
    """Values after a new Hello go to the new state, not to the one it replaced."""
    fleet, uuid = fleet_of()
    apply(fleet, (Target.gpu(uuid), "temperature_celsius", 50.0))
    old = fleet.view()[NODE]
    fleet.on_hello(made_up_hello(NODE, gpus=2, nvlinks=2, ib_ports=1), 1.0, 1.0)
    apply(fleet, (Target.gpu(uuid), "temperature_celsius", 60.0))
    assert old.gpus[uuid].signals["temperature_celsius"] == 50.0
    assert fleet.view()[NODE].gpus[uuid].signals["temperature_celsius"] == 60.0


def test_the_observer_hears_only_what_it_wants_and_is_asked_once_per_signal():
    fleet, uuid = fleet_of()
    listener = Listener({"nvlink_crc_errors"})
    fleet.observer = listener
    for value in (1, 2, 3):
        apply(
            fleet,
            (Target.gpu(uuid), "power_watts", 300.0 + value),
            (Target.nvlink(uuid, 1), "nvlink_crc_errors", value),
        )
    assert sorted(listener.asked) == ["nvlink_crc_errors", "power_watts"]
    link = f"{NODE}/gpu/0/nvlink/1"
    assert listener.heard == [(NODE, link, "nvlink_crc_errors", v) for v in (1, 2, 3)]
    # a new observer (rules reloaded) is asked afresh
    other = Listener({"power_watts"})
    fleet.observer = other
    apply(fleet, (Target.gpu(uuid), "power_watts", 1.0))
    assert other.heard == [(NODE, f"{NODE}/gpu/0", "power_watts", 1.0)]


def test_a_hello_is_told_to_the_observer():
    fleet, _ = fleet_of()
    listener = Listener(set())
    fleet.observer = listener
    fleet.on_hello(made_up_hello(NODE, gpus=1, ib_ports=0), 1.0, 1.0)
    assert listener.inventories == [NODE]
