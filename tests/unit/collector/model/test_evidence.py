"""The evidence bundle (issue 43): what a node's archive holds, on a real SQLite journal."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from typing import TYPE_CHECKING, Any

import pytest

from collector.model import evidence_pack
from collector.model.evidence import KERNEL_KINDS, UnknownNodeError, build_bundle, inventory
from collector.model.evidence_pack import BundleLimits, bundle_name, iso
from collector.model.fleet import FleetModel
from collector.store.events import EventRow, NodeRow
from collector.store.incidents import ActionRow, IncidentRow
from collector.store.preflight import ResultRow, RunRow
from collector.store.sqlite import JournalReader, SqliteStore
from fleetwatch.testing import made_up_hello, made_up_uuid
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

NODE = "node-7"
NOW_MS = 1_764_648_000_000  # 2025-12-02T04:00:00Z
HOUR_MS = 3_600_000
XID_LINE = "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off"
MEMBERS = [
    "README.txt",
    "manifest.json",
    "inventory.json",
    "events.jsonl",
    "kernel.log",
    "incidents.jsonl",
    "actions.jsonl",
    "preflight.jsonl",
]


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[tuple[SqliteStore, JournalReader]]:
    path = tmp_path / "journal.db"
    store = SqliteStore(path, "c1")
    hello = made_up_hello(NODE, gpus=2, ib_ports=2)
    hello.driver_version, hello.nvml_version, hello.agent_version = "570.1", "12.570", "0.1.0"
    store.save_node(NodeRow(NODE, "made-up", hello.SerializeToString(), NOW_MS, True, "c1"))
    try:
        yield store, JournalReader(path)
    finally:
        store.close()


def event(seq: int, time_ms: int, kind: str = "ib_port_down", detail: str = "") -> EventRow:
    return EventRow(
        NODE, "made-up", seq, time_ms, time_ms, kind, "gpu", made_up_uuid(NODE, 1), detail=detail
    )


def incident(
    iid: str, started: int, resolved: int | None = None, evidence: str = ""
) -> IncidentRow:
    phase = "resolved" if resolved else "firing"
    return IncidentRow(
        iid,
        "gpu_lost",
        NODE,
        f"{NODE}/gpu/1",
        "critical",
        phase,
        started,
        started,
        fired_ms=started,
        resolved_ms=resolved,
        evidence=evidence,
    )


def vbios(run_id: str, node: str, version: str) -> ResultRow:
    return ResultRow(
        run_id, node, "vbios_version", "gpu:0", None, "", version, "", "", "pass", "", ""
    )


def opened(data: bytes) -> dict[str, bytes]:
    """The archive's members by name (in the folder), in archive order."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        infos = tar.getmembers()
        folder = infos[0].name
        assert infos[0].isdir()
        out = {}
        for info in infos[1:]:
            assert info.name.startswith(f"{folder}/"), info.name
            member = tar.extractfile(info)
            assert member is not None
            out[info.name.removeprefix(f"{folder}/")] = member.read()
    return out


def lines(data: bytes) -> list[Any]:
    return [json.loads(line) for line in data.splitlines()]


def bundle(reader: JournalReader, fleet: FleetModel | None = None, **kw: Any) -> Any:
    kw.setdefault("since_ms", NOW_MS - 24 * HOUR_MS)
    return build_bundle(reader, fleet, NODE, now_ms=NOW_MS, **kw)


class TestArchive:
    def test_members_come_in_one_order_in_a_folder_named_as_the_file(self, journal):
        """README first, then the manifest, inventory and the line files; the archive's name
        and folder carry the node and the UTC time it was made."""
        _, reader = journal
        made = bundle(reader)
        assert made.name == "fleetwatch-evidence-node-7-20251202T040000Z.tar.gz"
        assert made.name == bundle_name(NODE, NOW_MS)
        with tarfile.open(fileobj=io.BytesIO(made.data), mode="r:gz") as tar:
            names = tar.getnames()
            assert all(i.mode in (0o644, 0o755) and i.uid == 0 for i in tar.getmembers())
        folder = made.name.removesuffix(".tar.gz")
        assert names == [folder, *(f"{folder}/{m}" for m in MEMBERS)]

    def test_the_manifest_gives_each_members_hash_and_size(self, journal):
        """A receiver can check every member against the manifest; the manifest names the node,
        the collector's version, when it was made and from when."""
        store, reader = journal
        store.insert_events([event(1, NOW_MS - HOUR_MS, "xid", XID_LINE)])
        made = bundle(reader)
        members = opened(made.data)
        manifest = json.loads(members["manifest.json"])
        assert manifest == made.manifest
        assert [f["name"] for f in manifest["files"]] == [
            m for m in MEMBERS if m != "manifest.json"
        ]
        for f in manifest["files"]:
            data = members[f["name"]]
            assert (f["bytes"], f["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
        assert manifest["node"] == NODE
        assert manifest["format"] == "fleetwatch-evidence/1"
        assert manifest["generated_at"] == "2025-12-02T04:00:00.000Z"
        assert manifest["since"] == "2025-12-01T04:00:00.000Z"
        rows = {f["name"]: (f.get("rows"), f.get("truncated")) for f in manifest["files"]}
        assert rows["events.jsonl"] == (1, False)
        assert rows["kernel.log"] == (1, False)
        assert rows["inventory.json"] == (None, None)

    def test_the_same_evidence_gives_the_same_bytes(self, journal):
        """Member order, times, owners and the gzip header are fixed: two builds are equal."""
        store, reader = journal
        store.insert_events([event(1, NOW_MS - HOUR_MS, "xid", XID_LINE)])
        assert bundle(reader).data == bundle(reader).data

    def test_a_node_nobody_knows_is_an_error_naming_it(self, journal):
        _, reader = journal
        with pytest.raises(UnknownNodeError, match="no node named 'node-9'"):
            build_bundle(reader, FleetModel(), "node-9", since_ms=0, now_ms=NOW_MS)


class TestWhatItHolds:
    def test_events_incidents_actions_and_runs_since_since(self, journal):
        """Each line file holds the rows of the window only: events from since, incidents
        active in it, actions created in it, runs started in it; oldest first."""
        store, reader = journal
        since = NOW_MS - 24 * HOUR_MS
        store.insert_events(
            [
                event(1, since - 1, "xid", "NVRM: Xid (PCI:0000:1b:00): 13, old"),
                event(2, since + 1, "xid", XID_LINE),
                event(3, since + 2, "nvlink_down", "NVML link 7 state down"),
            ]
        )
        for iid, started, resolved in (("old", since - 10, since - 5), ("new", since + 5, None)):
            store.incidents.upsert_incident(incident(iid, started, resolved, evidence="GPU 1"))
            store.incidents.add_action(
                ActionRow(f"k-{iid}", iid, "drain_node", NODE, NODE, "succeeded", started, {})
            )
        for run_id, started in (("run-old", since - 100), ("run-new", since + 100)):
            run = RunRow(run_id, "quick", (NODE, "node-8"), started, collector="c1")
            store.preflight.start_run(run)
            results = [vbios(run_id, n, "96.00.AA.00.01") for n in (NODE, "node-8")]
            verdicts = {NODE: "pass", "node-8": "pass"}
            done = RunRow(
                run_id, "quick", run.nodes, started, started + 10, "pass", node_verdicts=verdicts
            )
            store.preflight.finish_run(done, results)
        members = opened(bundle(reader, since_ms=since).data)
        assert [e["seq"] for e in lines(members["events.jsonl"])] == [2, 3]
        assert lines(members["events.jsonl"])[0]["time"] == iso(since + 1)
        assert members["kernel.log"].decode() == f"{iso(since + 1)} {NODE} kernel: {XID_LINE}\n"
        assert [i["id"] for i in lines(members["incidents.jsonl"])] == ["new"]
        assert [a["idempotency_key"] for a in lines(members["actions.jsonl"])] == ["k-new"]
        (run,) = lines(members["preflight.jsonl"])
        assert (run["run"]["id"], run["node_verdict"]) == ("run-new", "pass")
        assert {r["node"] for r in run["results"]} == {NODE}
        gpus = json.loads(members["inventory.json"])["gpus"]
        assert [g["vbios_version"] for g in gpus] == ["96.00.AA.00.01", None]
        readme = members["README.txt"].decode()
        assert "open incidents: 1\n" in readme
        assert "firing  critical  gpu_lost  node-7/gpu/1  GPU 1" in readme
        assert "drain_node  node-7  succeeded" in readme
        assert "run run-new  quick  node-7: pass  (the run: pass)" in readme

    def test_inventory_from_the_model_and_the_last_hello(self, journal):
        """GPUs with UUID, bus id, model, whether present; IB ports and rates; BMC readings apart;
        versions from the Hello; no serial (no agent reads one)."""
        _, reader = journal
        fleet = FleetModel()
        hello = made_up_hello(NODE, gpus=2, ib_ports=2)
        hello.driver_version = "570.1"
        fleet.on_hello(hello, 0.0, NOW_MS / 1000)
        uuid = made_up_uuid(NODE, 1)
        fleet.apply_samples(
            NODE,
            [
                pb.Sample(
                    target=pb.Target(kind=pb.TARGET_KIND_GPU, gpu_uuid=uuid),
                    signal="gpu_present",
                    int_value=0,
                ),
                pb.Sample(
                    target=pb.Target(kind=pb.TARGET_KIND_NODE),
                    signal="bmc_fans_failed",
                    int_value=1,
                ),
            ],
        )
        members = opened(bundle(reader, fleet).data)
        inv = json.loads(members["inventory.json"])
        assert (inv["driver_version"], inv["nvml_version"], inv["in_fleet_model"]) == (
            "570.1",
            "12.570",
            True,
        )
        gpu = inv["gpus"][1]
        assert (gpu["uuid"], gpu["pci_bus_id"], gpu["present"], gpu["serial"]) == (
            uuid,
            "0000:19:00.0",
            False,
            None,
        )
        assert inv["ib_ports"][0]["rate"] == "400 Gb/sec (4X NDR)"
        assert inv["bmc"] == {"bmc_fans_failed": 1}
        assert f"lost: GPU 1 {uuid} at 0000:19:00.0" in members["README.txt"].decode()

    def test_a_node_only_the_journal_knows_is_described_by_its_last_hello(self, journal):
        """Another collector's node, or one gone since a restart: its Hello says what it has."""
        _, reader = journal
        inv = json.loads(opened(bundle(reader, FleetModel()).data)["inventory.json"])
        assert inv["in_fleet_model"] is False
        assert [g["index"] for g in inv["gpus"]] == [0, 1]
        assert inv["agent_version"] == "0.1.0"
        assert inv["ib_ports"][1]["device"] == "mlx5_1"

    def test_a_hello_that_does_not_parse_leaves_an_empty_inventory(self):
        row = NodeRow(NODE, "b", b"\xff\xff not a hello", NOW_MS, True)
        inv = inventory(NODE, row, None)
        assert (inv["gpus"], inv["ib_ports"], inv["last_seen_ms"]) == ([], [], NOW_MS)

    def test_a_kernel_line_with_control_characters_stays_one_line(self, journal):
        store, reader = journal
        store.insert_events([event(1, NOW_MS - HOUR_MS, "machine_check", "mce: a\nb\x1b[2J")])
        log = opened(bundle(reader).data)["kernel.log"].decode()
        assert log.endswith(" kernel: mce: a\\x0ab\\x1b[2J\n")
        assert log.count("\n") == 1


class TestLimits:
    def test_events_keep_the_newest_and_the_manifest_says_they_were_cut(self, journal):
        """A flapping node: of 30 port flaps the newest 10 are kept; the Xid before them still
        reaches kernel.log, read kind by kind."""
        store, reader = journal
        start = NOW_MS - HOUR_MS
        store.insert_events([event(1, start, "xid", XID_LINE)])
        store.insert_events([event(i, start + i, "ib_port_down") for i in range(2, 32)])
        made = bundle(reader, limits=BundleLimits(events=10, kernel_lines=5))
        members = opened(made.data)
        assert [e["seq"] for e in lines(members["events.jsonl"])] == list(range(22, 32))
        assert XID_LINE in members["kernel.log"].decode()
        files = {f["name"]: f for f in made.manifest["files"]}
        assert (files["events.jsonl"]["rows"], files["events.jsonl"]["truncated"]) == (10, True)
        assert files["kernel.log"]["truncated"] is False
        assert made.manifest["limits"]["events"] == 10
        assert "events.jsonl" in members["README.txt"].decode().split("cut: the newest kept")[0]

    def test_kernel_lines_rows_and_bytes_are_capped(self, journal):
        """Of 20 Xid lines 5 are kept by count; with 4,096-character lines and a 10 KB budget,
        the newest two fit."""
        store, reader = journal
        long = "NVRM: Xid (PCI:0000:1b:00): 13, " + "x" * 4064
        store.insert_events([event(i, NOW_MS - HOUR_MS + i, "xid", long) for i in range(1, 21)])
        by_rows = bundle(reader, limits=BundleLimits(kernel_lines=5))
        assert len(opened(by_rows.data)["kernel.log"].splitlines()) == 5
        by_bytes = bundle(reader, limits=BundleLimits(member_bytes=10_000))
        members = opened(by_bytes.data)
        assert len(members["kernel.log"].splitlines()) == 2
        assert len(members["events.jsonl"].splitlines()) == 2
        files = {f["name"]: f for f in by_bytes.manifest["files"]}
        assert files["kernel.log"]["truncated"] is True
        assert all(f["bytes"] <= 10_000 for f in files.values() if "rows" in f)

    def test_incidents_and_actions_keep_the_newest(self, journal):
        store, reader = journal
        for i in range(5):
            started = NOW_MS - HOUR_MS + i
            store.incidents.upsert_incident(incident(f"i{i}", started))
            store.incidents.add_action(
                ActionRow(f"k{i}", f"i{i}", "notify", NODE, NODE, "succeeded", started, {})
            )
        members = opened(bundle(reader, limits=BundleLimits(incidents=2, actions=3)).data)
        assert [i["id"] for i in lines(members["incidents.jsonl"])] == ["i3", "i4"]
        assert [a["idempotency_key"] for a in lines(members["actions.jsonl"])] == [
            "k2",
            "k3",
            "k4",
        ]


def test_kernel_kinds_are_event_kinds():
    """Every kind kernel.log takes is one the journal can hold."""
    from fleetwatch.model import EventKind  # noqa: PLC0415

    assert set(KERNEL_KINDS) <= {k.value for k in EventKind}
    assert evidence_pack.MEDIA_TYPE == "application/gzip"
