"""`fleetwatch evidence NODE` and GET /api/v1/nodes/<node>/evidence against a real collector
and simulated nodes (issue 43): an Xid 79 reaches the archive as its event, its kernel line,
the incident and the actions it led to."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import re
import tarfile
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest

from cli.main import main
from fleetwatch.testing import wait_until
from tests.integration.raw_http import request

if TYPE_CHECKING:
    from pathlib import Path

    from agent.sim.cluster import SimCluster
    from collector.main import CollectorService

pytestmark = pytest.mark.integration


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def members(data: bytes) -> dict[str, bytes]:
    """Each file of the archive by its name in the bundle's folder."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        found = {}
        for info in tar.getmembers():
            member = tar.extractfile(info) if info.isfile() else None
            if member is not None:
                found[info.name.split("/", 1)[1]] = member.read()
    return found


def jsonl(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines()]


async def acted(service: CollectorService, node: str) -> bool:
    """Whether the drain and the notification of the node's incident are journaled as done."""
    rows = await service.journal.do(lambda s: s.incidents.actions(node=node))
    done = {(r.action, r.state) for r in rows}
    return {("drain_node", "succeeded"), ("notify", "succeeded")} <= done


@pytest.fixture
async def faulted(
    running: tuple[CollectorService, SimCluster],
) -> tuple[CollectorService, SimCluster]:
    """The fleet after GPU 3 of node-2 fell off the bus and the collector drained node-2."""
    service, cluster = running
    cluster.nodes["node-2"].xid(3, 79)
    await wait_until(partial(acted, service, "node-2"), what="drain and notification journaled")
    return service, cluster


async def test_the_cli_writes_the_xid_its_kernel_line_incident_and_actions(
    faulted, capsys, tmp_path: Path, monkeypatch
):
    """The archive holds the gpu_lost event with Xid 79, the kernel's NVRM line, the firing
    incident and the drain; the manifest's hashes match; `fleetwatch scan` reads kernel.log
    again; an existing file is kept unless --force."""
    service, _ = faulted
    api = f"--api=http://127.0.0.1:{service.http_port}"
    monkeypatch.chdir(tmp_path)
    code, out, err = await cli(capsys, "evidence", "node-2", api, "--since", "1h")
    assert (code, err) == (0, "")
    (written,) = tmp_path.glob("fleetwatch-evidence-node-2-*.tar.gz")
    assert out.startswith(f"wrote {written.name}: 8 files, ")
    shown = r" KiB: \d+ events?, [1-9]\d* kernel lines?, [1-9]\d* incidents?, \d+ actions, 0 pre"
    assert re.search(shown, out), out
    files = members(written.read_bytes())

    manifest = json.loads(files["manifest.json"])
    assert manifest["node"] == "node-2"
    for f in manifest["files"]:
        assert hashlib.sha256(files[f["name"]]).hexdigest() == f["sha256"], f["name"]
    (lost,) = [e for e in jsonl(files["events.jsonl"]) if e["kind"] == "gpu_lost"]
    assert lost["xid"] == 79
    log = files["kernel.log"].decode()
    assert f"node-2 kernel: {lost['detail']}\n" in log
    assert "NVRM: Xid (PCI:" in log
    assert ": 79, " in log
    (incident,) = [i for i in jsonl(files["incidents.jsonl"]) if i["rule"] == "gpu_lost"]
    assert (incident["target"], incident["phase"]) == ("node-2/gpu/3", "firing")
    actions = {(a["action"], a["state"]) for a in jsonl(files["actions.jsonl"])}
    assert {("drain_node", "succeeded"), ("notify", "succeeded")} <= actions
    gpu3 = json.loads(files["inventory.json"])["gpus"][3]
    assert (gpu3["index"], gpu3["present"]) == (3, False)
    readme = files["README.txt"].decode()
    assert "open incidents: " in readme
    assert "gpu_lost  node-2/gpu/3" in readme
    assert "drain_node  node-2" in readme

    log_file = tmp_path / "kernel.log"
    log_file.write_bytes(files["kernel.log"])
    code, out, _ = await cli(capsys, "scan", str(log_file))
    assert code == 1  # faults found
    assert "79" in out

    target = tmp_path / "rma.tar.gz"
    target.write_bytes(b"keep")
    code, out, err = await cli(capsys, "evidence", "node-2", api, "-o", str(target))
    assert (code, out, target.read_bytes()) == (2, "", b"keep")
    assert err == (
        f"fleetwatch evidence: {target} is there already: --force writes over it, "
        "-o FILE names another\n"
    )
    code, out, _ = await cli(capsys, "evidence", "node-2", api, "-o", str(target), "--force")
    assert code == 0
    assert out.startswith(f"wrote {target}: ")
    assert members(target.read_bytes())["kernel.log"] == files["kernel.log"]


async def test_unknown_node_and_bad_since_are_one_line_each(faulted, capsys, tmp_path: Path):
    """Exit status 2 with the API's words, and no file written."""
    service, _ = faulted
    api = f"--api=http://127.0.0.1:{service.http_port}"
    out_file = str(tmp_path / "x.tar.gz")
    code, out, err = await cli(capsys, "evidence", "node-9", api, "-o", out_file)
    assert (code, out) == (2, "")
    assert err.startswith("fleetwatch evidence: GET http://127.0.0.1:")
    assert err.endswith(": 404 no node named 'node-9' in the fleet or the journal\n")
    code, _, err = await cli(capsys, "evidence", "node-2", api, "--since", "yesterday")
    assert code == 2
    assert ": 400 query parameter since='yesterday' is not a time: give " in err
    assert err.count("\n") == 1
    assert not list(tmp_path.glob("*.tar.gz"))


async def test_the_http_endpoint(faulted):
    """A gzip'd tar with its name; 404 and 400 are JSON errors that say what is wrong."""
    service, _ = faulted
    port = service.http_port
    answer = await asyncio.to_thread(request, port, "GET", "/api/v1/nodes/node-2/evidence?since=2h")
    assert answer.status == 200
    assert answer.headers["content-type"] == "application/gzip"
    disposition = answer.headers["content-disposition"]
    assert disposition.startswith('attachment; filename="fleetwatch-evidence-node-2-')
    assert disposition.endswith('Z.tar.gz"')
    assert int(answer.headers["content-length"]) == len(answer.body)
    files = members(answer.body)
    assert any(e["xid"] == 79 for e in jsonl(files["events.jsonl"]))
    assert json.loads(files["manifest.json"])["since_ms"] > 0

    missing = await asyncio.to_thread(request, port, "GET", "/api/v1/nodes/node-9/evidence")
    assert (missing.status, missing.json()) == (
        404,
        {"error": "no node named 'node-9' in the fleet or the journal"},
    )
    bad = await asyncio.to_thread(request, port, "GET", "/api/v1/nodes/node-2/evidence?since=soon")
    assert bad.status == 400
    assert bad.json()["error"].startswith("query parameter since='soon' is not a time")
    other = await asyncio.to_thread(request, port, "GET", "/api/v1/nodes/node-2/evidence?limit=5")
    assert other.status == 400
    assert other.json()["error"] == (
        "unknown query parameter(s) limit for /api/v1/nodes/<name>/evidence; it takes since"
    )
