import copy
import dataclasses
from collections import Counter

from collector.model.fleet import FleetModel
from collector.model.state import GpuState, NodeState, PortState
from fleetwatch.model import EventKind, SampleValue, Target, sample_to_pb
from fleetwatch.testing import made_up_hello, made_up_uuid

NODE = "node-1"


def populated() -> FleetModel:
    """A node whose every field (and every GPU's and port's) holds something."""
    fleet = FleetModel()
    hello = made_up_hello(NODE, gpus=2, nvlinks=2, ib_ports=1)
    hello.agent_version, hello.driver_version = "1.2.3", "570.1"
    fleet.on_hello(hello, 10.0, 1_700_000_000.0)
    uuid = made_up_uuid(NODE, 0)
    samples: list[tuple[Target, str, SampleValue]] = [
        (Target.gpu(uuid), "temperature_celsius", 61),
        (Target.gpu(uuid), "pcie_replay_count", 3),
        (Target.gpu(uuid), "gpu_present", 0),
        (Target.nvlink(uuid, 1), "nvlink_up", 0),
        (Target.nvlink(uuid, 1), "nvlink_crc_errors", 7),
        (Target.ib_port("mlx5_0", 1), "ib_state", "DOWN"),
        (Target.ib_port("mlx5_0", 1), "ib_phys_state", "Polling"),
        (Target.ib_port("mlx5_0", 1), "ib_link_downed", 2),
        (Target.node(), "agent_rss_bytes", 50_000_000),
        (Target.pci("0000:18:00.0"), "aer_correctable_total", 4),
    ]
    fleet.apply_samples(NODE, [sample_to_pb(t, s, v) for t, s, v in samples])
    fleet.apply_event(NODE, EventKind.XID, Target.gpu(uuid), 79, 2)
    fleet.apply_event(NODE, EventKind.IB_PORT_DOWN, Target.ib_port("mlx5_0", 1), 0)
    fleet.mark_unreachable(NODE)  # still connected: both flags away from their defaults
    fleet._nodes[NODE].grace_until_mono = 70.0  # what restore() sets; on_hello() clears it
    return fleet


def non_default(obj: object) -> list[str]:
    """The fields of a state object still at their default (the test must fill them all)."""
    left = []
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING and value == f.default:
            left.append(f.name)
        if f.default_factory is not dataclasses.MISSING and value == f.default_factory():
            left.append(f.name)
    return left


def containers(obj: object) -> list[object]:
    """Every dict (and Counter) inside a state object, nested ones too."""
    out: list[object] = []
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if isinstance(value, dict):
            out.append(value)
            for inner in value.values():
                if isinstance(inner, dict):
                    out.append(inner)
                elif dataclasses.is_dataclass(inner):
                    out.extend(containers(inner))
    return out


class TestSnapshot:
    def test_the_test_node_fills_every_field(self):
        """A field the copies forget would go unnoticed unless the node below holds it."""
        node = populated().view()[NODE]
        gpu = node.gpus[made_up_uuid(NODE, 0)]
        port = node.ports["mlx5_0", 1]
        assert non_default(node) == []
        assert non_default(gpu) == []
        assert non_default(port) == []

    def test_a_snapshot_equals_a_deep_copy(self):
        """The snapshot is what copy.deepcopy of the live nodes gives."""
        fleet = populated()
        assert copy.deepcopy(fleet.view()) == fleet.snapshot()

    def test_a_snapshot_shares_no_container_with_the_model(self):
        """Writes to the model after a snapshot do not show in it, and the other way round."""
        fleet = populated()
        snap = fleet.snapshot()
        live = {id(c) for c in containers(fleet.view()[NODE])}
        assert not live & {id(c) for c in containers(snap[NODE])}
        uuid = made_up_uuid(NODE, 0)
        fleet.apply_samples(NODE, [sample_to_pb(Target.gpu(uuid), "temperature_celsius", 99)])
        assert snap[NODE].gpus[uuid].signals["temperature_celsius"] == 61
        snap[NODE].gpus[uuid].xid_counts[13] += 1
        assert fleet.view()[NODE].gpus[uuid].xid_counts == Counter({79: 2})

    def test_each_state_copies_to_its_own_type(self):
        """Copies are the same classes (the exporter and the API read their properties)."""
        node = populated().snapshot()[NODE]
        assert type(node) is NodeState
        assert all(type(g) is GpuState for g in node.gpus.values())
        assert all(type(p) is PortState for p in node.ports.values())
        assert type(node.events) is Counter
