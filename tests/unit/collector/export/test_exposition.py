"""The nodes' exposition: the same series as prometheus_client, kept between scrapes, sharded."""

from __future__ import annotations

import gzip
import shutil
import subprocess

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from collector.api.server import exposition_format, scrape_targets, wants_gzip
from collector.config import CollectorConfig
from collector.exceptions import ConfigError
from collector.export.catalog import SERIES_PER_NODE_BUDGET
from collector.export.exposition import OPENMETRICS, TEXT, NodeExposition, ShardPlan
from collector.export.fleet import FleetCollector
from collector.export.node_text import number
from collector.model.fleet import FleetModel
from collector.model.node_states import NodeFlags
from collector.stats import CollectorStats
from fleetwatch.model import EventKind, Target, sample_to_pb
from fleetwatch.testing import made_up_uuid
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

Sample = tuple[str, tuple[tuple[str, str], ...], float]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def add_node(fleet: FleetModel, name: str, *, driver: str = "550.54") -> None:
    """A node of 2 GPUs (2 NVLinks each) and 2 IB ports, with a value for most families."""
    uuids = [made_up_uuid(name, i) for i in range(2)]
    hello = pb.Hello(
        node=name,
        boot_id="b-" + name,
        agent_version="0.9",
        driver_version=driver,
        gpus=[
            pb.Gpu(
                index=i, uuid=u, pci_bus_id=f"0000:{i + 1:02x}:00.0", model="H100", nvlink_count=2
            )
            for i, u in enumerate(uuids)
        ],
        ib_ports=[
            pb.IbPort(device=f"mlx5_{p}", port=1, rate="400", link_layer="InfiniBand")
            for p in range(2)
        ],
    )
    fleet.on_hello(hello, 1.0, 1_764_000_000.5)
    samples = [
        sample_to_pb(Target.node(), "agent_outbox_pending", 3),
        sample_to_pb(Target.node(), "agent_source_errors_kmsg", 2),
        sample_to_pb(Target.node(), "agent_rss_bytes", 48_000_000),
    ]
    for i, uuid in enumerate(uuids):
        gpu = Target.gpu(uuid)
        samples += [
            sample_to_pb(gpu, "temperature_celsius", 60.5 + i),
            sample_to_pb(gpu, "utilization_gpu_percent", 97),
            sample_to_pb(gpu, "sm_clock_mhz", 1980),
            sample_to_pb(gpu, "clock_event_reasons", 0x20),
            sample_to_pb(gpu, "ecc_sbe_aggregate_total", 4),
            sample_to_pb(gpu, "remapped_rows_correctable", 1),
            sample_to_pb(gpu, "pcie_replay_count", 7),
        ]
        for link in range(2):
            samples += [
                sample_to_pb(Target.nvlink(uuid, link), "nvlink_up", int(link == 0)),
                sample_to_pb(Target.nvlink(uuid, link), "nvlink_replay_errors", 5 + link),
            ]
    for p in range(2):
        port = Target.ib_port(f"mlx5_{p}", 1)
        samples += [
            sample_to_pb(port, "ib_state", "ACTIVE"),
            sample_to_pb(port, "ib_phys_state", "LinkUp"),
            sample_to_pb(port, "ib_port_xmit_bytes", 10**12 + p),
            sample_to_pb(port, "ib_symbol_error", 1),
        ]
    fleet.apply_samples(name, samples)
    fleet.apply_event(name, EventKind.XID, Target.gpu(uuids[1]), 79)


def samples(text: bytes) -> list[Sample]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    )


def reference(fleet: FleetModel, flags: NodeFlags | None = None) -> bytes:
    """What prometheus_client renders of the nodes (FleetCollector, without its own series)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(fleet, CollectorStats(), flags=lambda: flags or NodeFlags()))
    text = generate_latest(registry)
    return b"\n".join(
        line
        for line in text.split(b"\n")
        if b"fleetwatch_collector_" not in line and b"fleetwatch_api_requests" not in line
    )


@pytest.fixture
def fleet() -> FleetModel:
    fleet = FleetModel()
    add_node(fleet, "n1", driver='550 "beta"\\x')
    add_node(fleet, "n2")
    return fleet


def test_the_series_are_those_prometheus_client_renders(fleet: FleetModel):
    flags = NodeFlags(drained=frozenset({"n2"}))
    mine = NodeExposition(fleet, monotonic=Clock(), flags=lambda: flags).everything(TEXT)
    theirs = reference(fleet, flags)
    assert samples(mine) == samples(theirs)
    assert len(samples(mine)) > 80
    assert (
        "fleetwatch_node_state",
        (("node", "n2"), ("state", "drained")),
        1.0,
    ) in samples(mine)
    assert b'driver_version="550 \\"beta\\"\\\\x"' in mine


def test_each_family_has_one_help_and_type_line(fleet: FleetModel):
    text = NodeExposition(fleet, monotonic=Clock()).everything(TEXT).decode()
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))
    # Each family's samples follow its TYPE line, the nodes' together.
    seen: list[str] = []
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            seen.append(line.split()[2])
        elif not line.startswith("#"):
            assert line.split("{")[0] == seen[-1]


def test_promtool_finds_nothing_wrong(fleet: FleetModel):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/ensure-test-deps.sh installs it"
    exposition = NodeExposition(fleet, monotonic=Clock(), nodes_per_shard=1)
    for text in (exposition.everything(TEXT), exposition.shard(0, TEXT, gzipped=False)):
        done = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip() == b"", done.stdout  # no lint either


def test_openmetrics_parses_strictly(fleet: FleetModel):
    exposition = NodeExposition(fleet, monotonic=Clock(), nodes_per_shard=1)
    body = exposition.shard(1, OPENMETRICS, gzipped=False)
    assert body is not None
    assert body.endswith(b"# EOF\n")
    parsed = sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in om_families(body.decode())  # type: ignore[no-untyped-call]
        for s in family.samples
    )
    text = exposition.shard(1, TEXT, gzipped=False)
    assert text is not None
    assert parsed == samples(text)
    assert b"# TYPE fleetwatch_gpu_ecc_errors counter" in body


def test_a_node_is_rendered_once_until_it_changes(fleet: FleetModel):
    clock = Clock()
    exposition = NodeExposition(fleet, monotonic=clock, render_interval_s=5.0)
    first = exposition.everything(TEXT)
    assert exposition.renders == 2
    assert exposition.everything(TEXT) == first
    assert exposition.renders == 2  # nothing changed: nothing rendered
    uuid = made_up_uuid("n1", 0)
    fleet.apply_samples("n1", [sample_to_pb(Target.gpu(uuid), "temperature_celsius", 70.0)])
    clock.now += 1.0
    assert exposition.everything(TEXT) == first  # a sample: shown within the render interval
    assert exposition.renders == 2
    clock.now += 4.0
    assert b'fleetwatch_gpu_temperature_celsius{node="n1",gpu="0"} 70.0\n' in (
        exposition.everything(TEXT)
    )
    assert exposition.renders == 3  # n1 only
    fleet.apply_event("n2", EventKind.GPU_LOST, Target.gpu(made_up_uuid("n2", 0)), 79)
    assert b'fleetwatch_gpu_present{node="n2",gpu="0"} 0.0\n' in exposition.everything(TEXT)
    assert exposition.renders == 4  # an event shows at once


def test_kept_lines_follow_every_kind_of_change(fleet: FleetModel):
    """The kept text (each GPU's derived lines, each port's and the node's, each signal dict's
    sample lines) matches prometheus_client's rendering after each kind of change."""
    clock = Clock()
    flags = NodeFlags()
    exposition = NodeExposition(fleet, monotonic=clock, flags=lambda: flags)
    assert samples(exposition.everything(TEXT)) == samples(reference(fleet))
    uuid = made_up_uuid("n1", 1)
    changes = [
        [sample_to_pb(Target.gpu(uuid), "temperature_celsius", 71.0)],
        [sample_to_pb(Target.nvlink(uuid, 1), "nvlink_replay_errors", 40)],
        [sample_to_pb(Target.nvlink(uuid, 0), "nvlink_up", 0)],
        [sample_to_pb(Target.nvlink(uuid, 1), "nvlink_crc_errors", 3)],
        [sample_to_pb(Target.gpu(uuid), "clock_event_reasons", 0x4)],
        [sample_to_pb(Target.gpu(uuid), "pcie_replay_count", 9)],
        [sample_to_pb(Target.ib_port("mlx5_1", 1), "ib_state", "DOWN")],
        [sample_to_pb(Target.ib_port("mlx5_0", 1), "ib_symbol_error", 2)],
        [sample_to_pb(Target.node(), "agent_source_errors_kmsg", 5)],
        [sample_to_pb(Target.node(), "agent_outbox_pending", 0)],
    ]
    for change in changes:
        fleet.apply_samples("n1", change)
        clock.now += 10.0  # past the render interval
        assert samples(exposition.everything(TEXT)) == samples(reference(fleet, flags)), change
    fleet.apply_event("n1", EventKind.XID, Target.gpu(uuid), 48)
    assert samples(exposition.everything(TEXT)) == samples(reference(fleet, flags))
    flags = NodeFlags(drained=frozenset({"n1"}))
    assert samples(exposition.everything(TEXT)) == samples(reference(fleet, flags))
    add_node(fleet, "n1", driver="560.1")  # a new Hello: new GPU objects, another driver
    clock.now += 10.0
    assert samples(exposition.everything(TEXT)) == samples(reference(fleet, flags))


def test_a_state_change_shows_at_once(fleet: FleetModel):
    flags = NodeFlags()
    exposition = NodeExposition(fleet, monotonic=Clock(), flags=lambda: flags)
    assert b'fleetwatch_node_state{node="n1",state="healthy"} 0.0' in exposition.everything(TEXT)
    flags = NodeFlags(draining=frozenset({"n1"}))
    text = exposition.everything(TEXT)
    assert b'fleetwatch_node_state{node="n1",state="draining"} 1.0' in text


def test_shards_are_bounded_stable_and_lose_nodes_that_leave():
    plan = ShardPlan(2)
    plan.sync(["c", "a", "b", "d", "e"])
    assert [plan.nodes(s) for s in plan.shards()] == [["a", "b"], ["c", "d"], ["e"]]
    plan.sync(["a", "b", "d", "e", "f", "g"])  # c left; f and g came
    assert plan.nodes(1) == ["d", "f"]
    assert plan.nodes(2) == ["e", "g"]
    assert plan.shard_of("a") == 0
    assert plan.shard_of("c") is None
    plan.sync([])
    assert plan.shards() == []
    with pytest.raises(ValueError, match="at least one node"):
        ShardPlan(0)


def test_a_shard_and_its_gzip_are_kept_while_nothing_changed(fleet: FleetModel):
    clock = Clock()
    exposition = NodeExposition(fleet, monotonic=clock, nodes_per_shard=1)
    assert exposition.shards() == [0, 1]
    zipped = exposition.shard(0, TEXT, gzipped=True)
    assert zipped is not None
    text = gzip.decompress(zipped)
    assert {s[1][0][1] for s in samples(text) if s[1][0][0] == "node"} == {"n1"}
    assert exposition.shard(0, TEXT, gzipped=True) is zipped  # the same bytes, not redone
    fleet.apply_event("n1", EventKind.XID, Target.gpu(made_up_uuid("n1", 0)), 13)
    again = exposition.shard(0, TEXT, gzipped=True)
    assert again is not zipped
    assert b'xid="13"' in gzip.decompress(again or b"")
    assert exposition.shard(7, TEXT, gzipped=False) is None


def test_a_node_that_left_leaves_its_shard(fleet: FleetModel):
    exposition = NodeExposition(fleet, monotonic=Clock(), nodes_per_shard=1)
    assert exposition.shards() == [0, 1]
    assert exposition.shard(0, TEXT, gzipped=True) is not None
    assert exposition.shard(1, TEXT, gzipped=True) is not None
    fleet.forget("n1")
    assert exposition.shards() == [1]
    assert exposition.shard(1, TEXT, gzipped=False) is not None
    assert exposition.renders == 2  # n2's text is kept through the change of shards
    assert exposition.shard(0, TEXT, gzipped=False) is None
    assert b'node="n1"' not in exposition.everything(TEXT)


def test_a_node_a_peer_holds_is_listed_there_only(fleet: FleetModel):
    held = frozenset({"n1", "n2"})
    exposition = NodeExposition(fleet, monotonic=Clock(), held_elsewhere=lambda: held)
    fleet.on_disconnect("n1")  # n1's stream ended here; a peer took it
    text = exposition.everything(TEXT)
    assert b'node="n1"' not in text
    assert b'node="n2"' in text  # its stream is still open here: ours whatever the journal says


def test_values_are_spelled_as_prometheus_reads_them():
    assert number(float("inf")) == "+Inf"
    assert number(float("-inf")) == "-Inf"
    assert number(float("nan")) == "NaN"
    assert number(1e21) == "1e+21"
    assert number(0.25) == "0.25"


def test_content_negotiation():
    prometheus = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
        "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    assert exposition_format(prometheus) == OPENMETRICS
    assert exposition_format("text/plain") == TEXT
    assert exposition_format(None) == TEXT
    assert wants_gzip("gzip")
    assert wants_gzip("deflate, gzip;q=0.5")
    assert not wants_gzip("gzip;q=0")
    assert not wants_gzip("identity")
    assert not wants_gzip(None)


def test_scrape_targets_name_the_shards():
    targets = scrape_targets("c1:9470", [0, 2])
    assert targets[0] == {"targets": ["c1:9470"], "labels": {"__metrics_path__": "/metrics/fleet"}}
    assert targets[2] == {
        "targets": ["c1:9470"],
        "labels": {"__metrics_path__": "/metrics/shards/2", "shard": "2"},
    }


def test_the_shard_size_and_render_interval_are_checked():
    with pytest.raises(ConfigError, match="metrics_shard_samples"):
        CollectorConfig(metrics_shard_samples=100)  # not even one node's budget
    with pytest.raises(ConfigError, match="metrics_render_interval"):
        CollectorConfig(metrics_render_interval=-1.0)
    assert CollectorConfig(metrics_shard_samples=SERIES_PER_NODE_BUDGET).metrics_shard_samples == (
        SERIES_PER_NODE_BUDGET
    )
