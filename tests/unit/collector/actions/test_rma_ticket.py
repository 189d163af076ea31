"""rma_ticket: the request names the incident, node and GPU and carries the node's evidence
bundle (base64, its sha256 and name) up to ``max_bundle_bytes``, its manifest only beyond; the
bundle is built off the event loop; the node goes to RMA once the webhook took the ticket."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import io
import json
import tarfile
import threading
from typing import TYPE_CHECKING, Any, cast

import pytest

from collector.actions.actuators import LiveTicketer
from collector.actions.adapters import WebhookTicketer
from collector.actions.config import DEFAULT_MAX_BUNDLE_BYTES, parse_actions
from collector.actions.dispatcher import Dispatcher
from collector.actions.rma import BundleReads, attachment, gpu_identity
from collector.actions.safety import SafetyConfig
from collector.actions.webhook import DeliveryResult, WebhookSender
from collector.exceptions import ConfigError
from collector.model.evidence import UnknownNodeError, build_bundle
from collector.model.evidence_pack import Bundle
from collector.model.fleet import FleetModel
from collector.model.lifecycle import Lifecycle, State
from collector.store.incidents import IncidentRow
from collector.store.journal import Journal
from collector.store.sqlite import JournalReader, SqliteStore
from fleetwatch.testing import FakeClock, made_up_hello, made_up_uuid
from rules.model import ActionSpec, Rule, Scope

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from collector.store.lifecycle import TransitionRow

NODE = "node-7"
RULE = Rule(name="gpu_lost", scope=Scope.GPU, when="true", description="GPU fell off the bus")
RMA = (ActionSpec("rma_ticket"),)


class FakeSender:
    """A webhook sender that keeps what it was given and answers ``delivered``."""

    def __init__(self, *, delivered: bool = True) -> None:
        self.sent: list[tuple[dict[str, Any], str, str]] = []
        self.delivered = delivered

    async def send(self, payload: Any, idempotency_key: str, *, kind: str) -> DeliveryResult:
        json.dumps(payload)  # what the real sender encodes: it must be JSON
        self.sent.append((dict(payload), idempotency_key, kind))
        if self.delivered:
            return DeliveryResult(True, 200, 1, None, 0.0)
        return DeliveryResult(False, 503, 2, "HTTP 503 Service Unavailable", 1.0)


def incident(node: str = NODE, gpu: int = 1) -> IncidentRow:
    target = f"{node}/gpu/{gpu}"
    return IncidentRow(
        id=f"gpu_lost:{target}:5400123",
        rule="gpu_lost",
        node=node,
        target=target,
        severity="critical",
        phase="firing",
        started_ms=1_767_225_600_000,
        updated_ms=1_767_225_600_000,
        fired_ms=1_767_225_600_000,
        evidence="GPU 1 lost",
    )


def members(data: bytes) -> dict[str, bytes]:
    """The archive's files by name (under its folder)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        out = {}
        for info in tar.getmembers():
            if info.isfile():
                member = tar.extractfile(info)
                assert member is not None
                out[info.name.split("/", 1)[1]] = member.read()
    return out


def made_bundle(data: bytes = b"x" * 100) -> Bundle:
    return Bundle("fleetwatch-evidence-node-7-20260101T000000Z.tar.gz", data, {"node": NODE})


class Bed:
    """A dispatcher over a real journal whose bundles its own reader builds."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = FakeClock()
        self.path = tmp_path / "journal.db"
        self.journal = Journal(SqliteStore(self.path))
        self.reader = JournalReader(self.path)
        self.fleet = FleetModel()
        self.fleet.on_hello(made_up_hello(NODE, gpus=2, ib_ports=1), 0.0, self.clock.now())
        self.sender = FakeSender()
        self.moves: list[TransitionRow] = []

    def dispatcher(self, max_bundle_bytes: int = DEFAULT_MAX_BUNDLE_BYTES, **kw: Any) -> Dispatcher:
        ticketer = WebhookTicketer(cast("WebhookSender", self.sender), max_bundle_bytes)
        made = Dispatcher(
            journal=self.journal,
            fleet=self.fleet,
            clock=self.clock,
            safety=SafetyConfig(),
            ticketer=kw.get("ticketer", ticketer),
            evidence=kw.get("evidence", functools.partial(build_bundle, self.reader, self.fleet)),
        )
        made.lifecycle = Lifecycle(self._write, self.clock)
        return made

    async def _write(self, row: TransitionRow) -> None:
        self.moves.append(row)

    async def fire(self, dispatcher: Dispatcher, row: IncidentRow) -> None:
        await self.journal.do(lambda s: s.incidents.upsert_incident(row))
        await dispatcher.fire(row, RULE, RMA)

    async def ticket(self) -> tuple[str, str]:
        (row,) = await self.journal.do(lambda s: s.incidents.actions())
        return row.state, row.detail


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Bed]:
    made = Bed(tmp_path)
    yield made
    await made.journal.close()


class TestAttachment:
    def test_a_bundle_that_fits_is_attached(self):
        """Base64 of the very bytes, with the name, size, sha256 and manifest."""
        bundle = made_bundle()
        shown = attachment(bundle, 100)
        assert base64.b64decode(shown["data_base64"]) == bundle.data
        assert shown == {
            "attached": True,
            "name": bundle.name,
            "media_type": "application/gzip",
            "bytes": 100,
            "sha256": hashlib.sha256(bundle.data).hexdigest(),
            "manifest": {"node": NODE},
            "data_base64": shown["data_base64"],
        }

    def test_a_bigger_one_sends_its_manifest_and_says_so(self):
        """One byte over the limit: no data, the manifest and its digest, and where the whole
        bundle is."""
        shown = attachment(made_bundle(), 99)
        assert "data_base64" not in shown
        assert (shown["attached"], shown["bytes"], shown["manifest"]) == (
            False,
            100,
            {"node": NODE},
        )
        assert shown["why"] == (
            "the bundle is 100 bytes, over max_bundle_bytes (99): only its manifest is sent; "
            "GET /api/v1/nodes/node-7/evidence gives the whole bundle"
        )

    def test_no_bundle_says_why(self):
        """A bundle that could not be built is named as missing, with the reason."""
        assert attachment(None, 100, "no node named 'x'") == {
            "attached": False,
            "why": "no node named 'x'",
        }


class TestGpuIdentity:
    def test_the_gpu_the_target_names(self):
        """UUID, bus id and model from the fleet model; the serial is not known."""
        fleet = FleetModel()
        fleet.on_hello(made_up_hello(NODE, gpus=2), 0.0, 0.0)
        got = gpu_identity(NODE, f"{NODE}/gpu/1/nvlink/3", fleet.view()[NODE])
        assert got == {
            "index": 1,
            "uuid": made_up_uuid(NODE, 1),
            "serial": None,
            "pci_bus_id": "0000:19:00.0",
            "model": "NVIDIA H100 80GB HBM3",
        }

    def test_a_node_or_port_target_names_no_gpu(self):
        """A node or IB port incident's ticket carries no GPU."""
        assert gpu_identity(NODE, NODE, None) is None
        assert gpu_identity(NODE, f"{NODE}/ib/mlx5_0/1", None) is None

    def test_a_gpu_the_model_no_longer_holds(self):
        """Its index is known, nothing else."""
        assert gpu_identity(NODE, f"{NODE}/gpu/5", None) == {
            "index": 5,
            "uuid": None,
            "serial": None,
            "pci_bus_id": None,
            "model": None,
        }


class TestTicket:
    async def test_the_ticket_carries_the_incident_gpu_and_bundle(self, bed):
        """One rma_request under the action's key: the incident, the GPU, and the bundle,
        which opens as a tar holding the incident, its sha256 matching; the node is in RMA."""
        dispatcher = bed.dispatcher()
        row = incident()
        await bed.fire(dispatcher, row)
        ((payload, key, kind),) = bed.sender.sent
        assert (kind, key) == ("rma_request", f"rma_ticket:{row.id}")
        assert {k: payload[k] for k in ("incident", "rule", "node", "target", "description")} == {
            "incident": row.id,
            "rule": "gpu_lost",
            "node": NODE,
            "target": row.target,
            "description": "GPU fell off the bus",
        }
        assert payload["gpu"]["uuid"] == made_up_uuid(NODE, 1)
        bundle = payload["bundle"]
        data = base64.b64decode(bundle["data_base64"])
        assert hashlib.sha256(data).hexdigest() == bundle["sha256"]
        assert bundle["bytes"] == len(data)
        files = members(data)
        incidents = [json.loads(line) for line in files["incidents.jsonl"].splitlines()]
        assert [i["id"] for i in incidents] == [row.id]
        actions = [json.loads(line) for line in files["actions.jsonl"].splitlines()]
        assert [a["action"] for a in actions] == ["rma_ticket"]  # journaled before it ran
        assert bundle["manifest"]["node"] == NODE
        state, detail = await bed.ticket()
        assert state == "succeeded"
        assert detail == (
            f"rma webhook: delivered (HTTP 200); bundle {bundle['name']} attached "
            f"({bundle['bytes']} bytes, sha256 {bundle['sha256']})"
        )
        assert dispatcher.lifecycle is not None
        moved = dispatcher.lifecycle.row(NODE)
        assert moved is not None
        assert (moved.state, moved.actor, moved.incident) == ("rma", "action:rma_ticket", row.id)

    async def test_a_bundle_over_the_limit_sends_the_manifest(self, bed):
        """``max_bundle_bytes`` smaller than the bundle: the manifest goes, the journal says so."""
        await bed.fire(bed.dispatcher(max_bundle_bytes=10), incident())
        ((payload, _, _),) = bed.sender.sent
        assert payload["bundle"]["attached"] is False
        assert "data_base64" not in payload["bundle"]
        assert payload["bundle"]["manifest"]["format"] == "fleetwatch-evidence/1"
        state, detail = await bed.ticket()
        assert state == "succeeded"
        assert "no bundle attached: the bundle is " in detail
        assert "over max_bundle_bytes (10)" in detail

    async def test_a_node_unknown_to_the_journal_still_gets_its_ticket(self, bed):
        """No bundle can be built: the ticket goes without one, saying why."""
        await bed.fire(bed.dispatcher(), incident("node-9"))
        ((payload, _, _),) = bed.sender.sent
        assert payload["bundle"] == {
            "attached": False,
            "why": "no node named 'node-9' in the fleet or the journal",
        }
        assert payload["gpu"] == {
            "index": 1,
            "uuid": None,
            "serial": None,
            "pci_bus_id": None,
            "model": None,
        }

    async def test_a_ticket_not_taken_moves_nothing(self, bed):
        """The webhook never took it: failed, and the node stays where it was."""
        bed.sender.delivered = False
        dispatcher = bed.dispatcher()
        await bed.fire(dispatcher, incident())
        state, detail = await bed.ticket()
        assert state == "failed"
        assert detail.startswith("rma webhook: not delivered after 2 attempts")
        assert dispatcher.lifecycle is not None
        assert dispatcher.lifecycle.state(NODE) == State.IN_SERVICE

    async def test_without_an_rma_webhook_no_bundle_is_built(self, bed):
        """Nothing to send it to: failed, naming the table, and the journal is not read."""
        built: list[str] = []

        def build(node: str, *, since_ms: int, now_ms: int) -> Bundle:
            built.append(node)
            return made_bundle()

        dispatcher = bed.dispatcher(ticketer=LiveTicketer(None), evidence=build)
        await bed.fire(dispatcher, incident())
        assert await bed.ticket() == (
            "failed",
            "rma_ticket: no [collector.actions.rma_webhook] is configured",
        )
        assert built == []


class TestOffTheLoop:
    async def test_the_bundle_is_built_in_a_worker_thread(self):
        """The build runs off the event loop, which keeps running meanwhile: the build waits
        for a task on the loop to tell it to go on."""
        go_on = threading.Event()
        threads: list[threading.Thread] = []

        def build(node: str, *, since_ms: int, now_ms: int) -> Bundle:
            threads.append(threading.current_thread())
            assert go_on.wait(5), "the loop did not run while the bundle was built"
            assert (node, now_ms - since_ms) == (NODE, 7 * 86_400_000)
            return made_bundle()

        async def loop_side() -> None:
            await asyncio.sleep(0)
            go_on.set()

        reads = BundleReads(build)
        (bundle, why), _ = await asyncio.gather(reads.read(NODE, 1_000_000_000_000), loop_side())
        assert (bundle, why) == (made_bundle(), "")
        assert threads[0] is not threading.main_thread()

    async def test_one_bundle_at_a_time(self):
        """Two tickets at once: the second bundle is built after the first."""
        running, most = 0, 0

        def build(node: str, *, since_ms: int, now_ms: int) -> Bundle:
            nonlocal running, most
            running += 1
            most = max(most, running)
            threading.Event().wait(0.05)
            running -= 1
            return made_bundle()

        reads = BundleReads(build)
        await asyncio.gather(*(reads.read(NODE, 1) for _ in range(3)))
        assert most == 1

    async def test_a_build_that_fails_is_a_reason_not_an_error(self):
        """Whatever the build raises, the ticket goes on without a bundle."""

        def unknown(node: str, *, since_ms: int, now_ms: int) -> Bundle:
            msg = f"no node named {node!r} in the fleet or the journal"
            raise UnknownNodeError(msg)

        def broken(node: str, *, since_ms: int, now_ms: int) -> Bundle:
            raise OSError(28, "No space left on device")

        assert await BundleReads(unknown).read("x", 1) == (
            None,
            "no node named 'x' in the fleet or the journal",
        )
        bundle, why = await BundleReads(broken).read("x", 1)
        assert bundle is None
        assert why.startswith("the evidence bundle could not be built: OSError:")


class TestConfig:
    def test_the_two_webhooks_and_the_bundle_limit(self):
        """``reboot_webhook`` and ``rma_webhook`` are webhook tables; ``max_bundle_bytes``
        belongs to the RMA one (default 512 KiB)."""
        hook = {"url": "https://x.example/h", "secret_env": "S"}
        cfg = parse_actions(
            {"reboot_webhook": hook, "rma_webhook": {**hook, "max_bundle_bytes": 0}}
        )
        assert cfg.reboot_webhook is not None
        assert cfg.rma_webhook is not None
        assert cfg.rma_webhook.url == "https://x.example/h"
        assert cfg.rma_max_bundle_bytes == 0
        assert parse_actions({"rma_webhook": hook}).rma_max_bundle_bytes == 512 * 1024
        assert parse_actions({}).rma_webhook is None

    @pytest.mark.parametrize("value", [-1, 1.5, "1", True])
    def test_a_bad_bundle_limit_names_the_key(self, value):
        """A whole number of bytes, 0 or more."""
        with pytest.raises(ConfigError, match=r"actions\.rma_webhook\.max_bundle_bytes"):
            parse_actions({"rma_webhook": {"url": "https://x.example/", "max_bundle_bytes": value}})

    def test_an_unknown_key_lists_what_the_rma_webhook_takes(self):
        """The message names max_bundle_bytes among the keys."""
        with pytest.raises(ConfigError, match="max_attempts, max_bundle_bytes"):
            parse_actions({"rma_webhook": {"url": "https://x.example/", "bundle": 1}})

    def test_the_reboot_limits(self):
        """``max_rebooting_nodes`` is a whole number; the reboot times are seconds."""
        cfg = parse_actions({"max_rebooting_nodes": 0, "reboot_cooldown": 60, "reboot_timeout": 90})
        assert (
            cfg.safety.max_rebooting_nodes,
            cfg.safety.reboot_cooldown_s,
            cfg.safety.reboot_timeout_s,
        ) == (0, 60, 90)
        with pytest.raises(ConfigError, match="max_rebooting_nodes"):
            parse_actions({"max_rebooting_nodes": 1.5})
