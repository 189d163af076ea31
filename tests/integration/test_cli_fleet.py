"""`fleetwatch nodes` and `fleetwatch events` against a real collector's API."""

import asyncio
import json

import pytest

from cli.main import main
from fleetwatch.testing import wait_until

pytestmark = pytest.mark.integration


async def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_nodes_lists_the_fleet_and_one_node(running, capsys):
    """Every node is listed healthy; after an Xid 79 on node-2 GPU 3, node-2 shows 1 of 8 GPUs
    lost, and `fleetwatch nodes node-2` says which GPU."""
    service, cluster = running
    api = f"--api=http://127.0.0.1:{service.http_port}"
    code, out, _ = await cli(capsys, "nodes", api)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["NODE", "STATE"]
    names = [line.split()[0] for line in lines[1:-1]]
    assert names == sorted(cluster.nodes)
    assert all(line.split()[1] == "healthy" for line in lines[1:-1])
    assert lines[-1] == f"{len(names)} nodes, {len(names)} healthy"

    cluster.nodes["node-2"].xid(3, 79)
    await wait_until(
        lambda: any(not g.present for g in service.fleet.snapshot()["node-2"].gpus.values()),
        what="GPU 3 lost",
    )
    await wait_until(lambda: _firing(service, "gpu_lost", "node-2"), what="gpu_lost firing")
    code, out, _ = await cli(capsys, "nodes", api)
    lines = out.splitlines()
    assert lines[0].split() == [
        "NODE", "STATE", "LIFECYCLE", "GPUS", "LOST", "NVLINKS", "DOWN", "IB", "PORTS", "IB",
        "DOWN", "SEEN", "REASON",
    ]  # fmt: skip
    (row,) = [line for line in lines if line.startswith("node-2 ")]
    assert row.split()[1] in ("degraded", "drained", "draining")
    assert row.split()[2] in ("suspect", "drained")  # its lifecycle: the fault fired
    assert row.split()[3:5] == ["8", "1"]  # 8 GPUs, 1 lost: never "1/8" read as a ratio
    reason = row[lines[0].index("REASON") :]
    assert "1 GPU lost" in reason, reason  # after "drained (gpu_lost); " once the drain ran
    assert "firing: " in reason
    assert "gpu_lost" in reason
    (healthy,) = [line for line in lines if line.startswith("node-1 ")]
    assert healthy[lines[0].index("REASON") :].strip() == "-"

    code, out, _ = await cli(capsys, "nodes", api, "node-2")
    assert code == 0
    text = out.splitlines()
    assert text[0].startswith("node-2: ")
    assert any(line.startswith("  what is wrong: ") and "1 GPU lost" in line for line in text), out
    at = text.index(next(line for line in text if line.startswith("open incidents: ")))
    assert text[at + 1].split()[:2] == ["SINCE", "PHASE"]
    lost = [line for line in text[at:] if " gpu_lost " in line and "node-2/gpu/3" in line]
    assert lost, out
    assert "GPU-" not in lost[0]  # the evidence names GPU 3 by index
    assert any(line.startswith("last events: ") for line in text)
    assert any(line.startswith("last actions: ") for line in text)
    (gpu3,) = [line.split() for line in text if line.startswith("3 ")]
    assert "LOST" in gpu3
    code, out, _ = await cli(capsys, "nodes", api, "node-2", "--json")
    described = json.loads(out)
    assert described["gpus_lost"] == 1
    assert {i["rule"] for i in described["incidents"]} >= {"gpu_lost"}
    assert all(i["node"] == "node-2" for i in described["incidents"])
    assert [e["kind"] for e in described["recent_events"]][:1] == ["gpu_lost"]
    code, wide, _ = await cli(capsys, "nodes", api, "node-2", "-o", "wide")
    uuid = next(g["uuid"] for g in described["gpus"] if g["index"] == 3)
    assert f"GPU 3 ({uuid})" in wide or uuid in wide


def _firing(service, rule: str, node: str) -> bool:
    return any(
        i.rule == rule and i.node == node and i.phase.value == "firing"
        for i in service.evaluator.engine.open_incidents()
    )


async def test_events_lists_the_newest_first_and_filters(running, capsys):
    """The gpu_lost event is listed with its node, Xid and target; --kind and --node narrow
    the list; an unknown kind is the API's clear error, exit status 2."""
    service, cluster = running
    api = f"--api=http://127.0.0.1:{service.http_port}"
    code, out, _ = await cli(capsys, "events", api)
    assert (code, out.strip()) == (0, "no events")
    cluster.nodes["node-2"].xid(3, 79)
    cluster.nodes["node-1"].ib_port_down(0)

    async def kinds() -> set[str]:
        _, text, _ = await cli(capsys, "events", api, "--json")
        return {e["kind"] for e in json.loads(text)["events"]}

    for _ in range(100):
        if {"gpu_lost", "ib_port_down"} <= await kinds():
            break
        await asyncio.sleep(0.1)
    code, out, _ = await cli(capsys, "events", api)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["WHEN", "NODE", "KIND", "TARGET", "XID", "DETAIL"]
    (lost,) = [line for line in lines if " gpu_lost " in line]
    assert lost.split()[2:4] == ["node-2", "gpu_lost"]
    assert " 79 " in lost
    assert lost.split()[4:6] == ["GPU", "3"], lost  # by index; its UUID in -o wide
    _, wide, _ = await cli(capsys, "events", api, "-o", "wide", "--kind", "gpu_lost")
    assert "GPU 3 (GPU-" in wide, wide
    code, out, _ = await cli(capsys, "events", api, "--kind", "gpu_lost")
    assert [line.split()[3] for line in out.splitlines()[1:]] == ["gpu_lost"]
    code, out, _ = await cli(capsys, "events", api, "--node", "node-1", "--limit", "5")
    assert {line.split()[2] for line in out.splitlines()[1:]} == {"node-1"}
    code, _, err = await cli(capsys, "events", api, "--kind", "gpu_lsot")
    assert code == 2
    assert "gpu_lsot" in err
    assert "is not one of" in err
