"""The fleetwatch command as a user runs it."""

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fleetwatch.testing import free_port

pytestmark = pytest.mark.e2e

FLEETWATCH = [sys.executable, "-m", "cli.main"]
PLAIN = [sys.executable, "-P", "-m", "cli.main"]


def test_demo_runs_and_summarises(tmp_path: Path):
    """`fleetwatch demo` injects its faults, journals what it saw, fires incidents whose actions
    really run (a drain through the signed webhook, a GPU reset through the agent), shows them
    live and prints a summary with tables of incidents and actions. It is run from a directory
    holding modules named like ours, which its processes must not import."""
    here = tmp_path / "cwd"
    here.mkdir()
    for name in ("rules.py", "agent.py", "cli.py", "collector.py", "fleetwatch.py"):
        (here / name).write_text(f"raise SystemExit('imported the stray {name}')\n")
    done = subprocess.run(
        # -P: as the installed fleetwatch script, whose path is its own directory, not the cwd
        [*PLAIN, "demo", "--nodes", "4", "--duration", "12", "--workdir", str(tmp_path / "w")],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "=== summary ===" in out
    assert re.search(r"event #\d+\s+node-01\s+gpu_lost\s+GPU 3 Xid 79 \(bus\)", out)
    assert re.search(r"node-02\s+nvlink_down\s+GPU 5 NVLink 7", out)
    assert "events still unacknowledged in agent outboxes: 0" in out
    assert re.search(r"node-04\s+UNREACHABLE", out)
    # the lost GPU's drain held: its state, its lifecycle, its GPUs
    assert re.search(r"node-01\s+drained\s+drained\s+7/8", out)
    journaled = re.search(r"events journaled: (\d+) \((.*)\)", out)
    assert journaled is not None
    assert "gpu_lost 1" in journaled[2]
    assert "ib_port_down 2" in journaled[2]
    assert "node_unreachable 1" in journaled[2]
    # live, as they happen
    assert re.search(
        r"\] FIRING +critical gpu_lost node-01/gpu/3 → drain_node succeeded \(webhook 200\)", out
    )
    # the NVLink's GPU is reset: at once, or once the job's rank has left the GPU (the job
    # failed with the lost GPU's rank, and NCCL's watchdog ends it: which comes first depends
    # on timing); a reset that waits names the job that holds the GPU
    assert re.search(r"reset_gpu succeeded \(node-02 agent: GPU 5 reset\)", out)
    for waited in re.findall(r"reset_gpu deferred \(waiting: [^)]*\)[^)]*\)", out):
        assert "held by job demo-pretrain rank " in waited, waited
    # the job failed with the lost GPU's rank, named, and its node was the culprit
    assert re.search(r"job_rank_lost +job/demo-pretrain +job demo-pretrain at step \d+", out)
    assert re.search(
        r"gpu_hang_culprit +node-01/gpu/3 +culprit of job demo-pretrain: rank 3 on node-01 GPU 3",
        out,
    )
    # the summary's tables, read from the collector's journal
    assert re.search(r"firing +critical +gpu_lost +node-01/gpu/3", out)
    assert re.search(r"drain_node +node-01/gpu/3 +succeeded +drain webhook: delivered", out)
    assert re.search(r"webhooks received \(signature checked\): \d+ \(drain_request 1", out)
    assert "fleetwatch incidents --api http://127.0.0.1:" in out


def test_bad_arguments_are_one_clear_line(tmp_path: Path):
    """A broken config file ends the command with one line naming the problem, status 2."""
    bad = tmp_path / "agent.toml"
    bad.write_text("[agent]\npoll_interval = -3\n")
    done = subprocess.run(
        [*FLEETWATCH, "agent", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "poll_interval must be a number > 0" in done.stderr


def test_collector_and_simulated_agent_processes(tmp_path: Path):
    """A collector process and an agent process (simulated hardware) talk over gRPC;
    the JSON API shows the node, and SIGTERM stops both cleanly."""
    grpc_port, http_port = free_port(), free_port()
    collector = subprocess.Popen(
        [
            *FLEETWATCH,
            "collector",
            "--listen",
            f"127.0.0.1:{grpc_port}",
            "--http",
            f"127.0.0.1:{http_port}",
            "--journal",
            str(tmp_path / "journal.db"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    agent = subprocess.Popen(
        [
            *FLEETWATCH,
            "agent",
            "--simulate",
            "--node",
            "gpu-node-7",
            "--collector",
            f"127.0.0.1:{grpc_port}",
            "--poll-interval",
            "0.2",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        nodes: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            try:
                url = f"http://127.0.0.1:{http_port}/api/v1/nodes"
                with urllib.request.urlopen(url, timeout=2) as resp:
                    nodes = json.loads(resp.read())["nodes"]
                if nodes and nodes[0]["connected"]:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert [(n["name"], n["gpus"], n["ib_ports"]) for n in nodes] == [("gpu-node-7", 8, 8)]
    finally:
        for proc in (agent, collector):
            proc.send_signal(signal.SIGTERM)
        agent_err = agent.communicate(timeout=30)[1]
        collector_err = collector.communicate(timeout=30)[1]
    assert agent.returncode == 0, agent_err
    assert collector.returncode == 0, collector_err
    logs = [json.loads(line) for line in collector_err.splitlines() if line.startswith("{")]
    assert any(e["event"] == "stream_open" and e.get("node") == "gpu-node-7" for e in logs)
