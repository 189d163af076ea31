"""GET /api/v1/nodes/<node>/evidence as the HTTP thread answers it (issue 43)."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import pytest

from collector.api import fleet as fleet_api
from collector.api.fleet import FleetReads
from collector.api.incidents import ApiError
from collector.api.query import EVIDENCE, BadRequestError, Params
from collector.model import evidence
from collector.model.evidence import DEFAULT_SINCE_S
from collector.model.fleet import FleetModel
from collector.model.node_states import NodeFlags
from collector.store.sqlite import JournalReader, SqliteStore
from fleetwatch.testing import made_up_hello

if TYPE_CHECKING:
    from pathlib import Path

NOW = 1_764_648_000.0  # 2025-12-02T04:00:00Z


@pytest.fixture
def reads(tmp_path: Path) -> FleetReads:
    path = tmp_path / "journal.db"
    SqliteStore(path, "c1").close()
    fleet = FleetModel()
    fleet.on_hello(made_up_hello("node-7", gpus=1, ib_ports=1), 0.0, NOW)
    return FleetReads(fleet=fleet, journal=JournalReader(path), node_flags=NodeFlags, jobs=None)


def manifest(data: bytes) -> dict[str, Any]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        (info,) = [i for i in tar.getmembers() if i.name.endswith("/manifest.json")]
        member = tar.extractfile(info)
        assert member is not None
        found: dict[str, Any] = json.loads(member.read())
        return found


class TestEvidenceRoute:
    def test_since_defaults_to_seven_days_back(self, reads):
        bundle = reads.evidence("/api/v1/nodes/node-7/evidence", Params.read(EVIDENCE, "", NOW))
        got = manifest(bundle.data)
        assert (got["node"], got["since_ms"]) == ("node-7", int((NOW - DEFAULT_SINCE_S) * 1000))
        assert bundle.name == "fleetwatch-evidence-node-7-20251202T040000Z.tar.gz"

    def test_since_takes_the_forms_the_other_reads_take(self, reads):
        """A duration back from now, an ISO-8601 time, Unix seconds."""
        for query, since_ms in (
            ("since=2h", int((NOW - 7200) * 1000)),
            ("since=2025-12-01T00:00:00Z", 1_764_547_200_000),
            ("since=1764547200", 1_764_547_200_000),
        ):
            params = Params.read(EVIDENCE, query, NOW)
            bundle = reads.evidence("/api/v1/nodes/node-7/evidence", params)
            assert manifest(bundle.data)["since_ms"] == since_ms, query

    def test_a_bad_since_names_the_parameter(self, reads):
        with pytest.raises(BadRequestError, match="query parameter since='yesterday' is not a"):
            reads.evidence(
                "/api/v1/nodes/node-7/evidence", Params.read(EVIDENCE, "since=yesterday")
            )
        with pytest.raises(BadRequestError, match=r"unknown query parameter\(s\) until"):
            Params.read(EVIDENCE, "until=1h")

    def test_an_unknown_node_is_a_404_naming_it(self, reads):
        with pytest.raises(ApiError) as err:
            reads.evidence("/api/v1/nodes/node-9/evidence", Params.read(EVIDENCE, "", NOW))
        assert err.value.status == HTTPStatus.NOT_FOUND
        assert str(err.value) == "no node named 'node-9' in the fleet or the journal"

    def test_at_most_two_bundles_are_built_at_once(self, reads, monkeypatch):
        """A third request while two are being built is a 503, and the next one is served."""
        started, release = threading.Barrier(3), threading.Event()
        real = evidence.build_bundle

        def slow(*args, **kwargs):
            started.wait(5)
            release.wait(5)
            return real(*args, **kwargs)

        monkeypatch.setattr(fleet_api, "build_bundle", slow)
        params = Params.read(EVIDENCE, "", NOW)
        path = "/api/v1/nodes/node-7/evidence"
        threads = [threading.Thread(target=reads.evidence, args=(path, params)) for _ in range(2)]
        for t in threads:
            t.start()
        started.wait(5)
        with pytest.raises(ApiError) as err:
            reads.evidence(path, params)
        assert err.value.status == HTTPStatus.SERVICE_UNAVAILABLE
        assert "2 evidence bundles are being built" in str(err.value)
        release.set()
        for t in threads:
            t.join(5)
        monkeypatch.setattr(fleet_api, "build_bundle", real)
        assert reads.evidence(path, params).data
