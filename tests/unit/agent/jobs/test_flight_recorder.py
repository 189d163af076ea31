"""A rank's Flight Recorder, served by fleetwatch.jobclient and read by the agent (issue 40).

torch's real dump format is read from a real one-rank gloo job; the channel is a real job socket,
with the jobclient's serving thread in this process on the other side."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.jobs.flight_recorder import (
    ASK,
    HELLO,
    NOT_SERVED,
    RecorderChannels,
    RecorderError,
    groups_of,
    read_answer,
)
from agent.jobs.peer_identity import start_ticks
from agent.jobs.report import JobReportError
from fleetwatch import jobclient
from fleetwatch.testing import free_port, wait_until
from tests.job_node import open_job_socket

ROOT = Path(__file__).resolve().parents[4]


def trace(*entries: tuple[int, str], enqueued: int, completed: int) -> dict[str, object]:
    """A Flight Recorder dump in torch's format (version 2.10) for the default group."""
    return {
        "version": "2.10",
        "pg_config": {"": {"desc": "", "name": "", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {
                "last_completed_collective": str(completed),
                "last_enqueued_collective": str(enqueued),
                "last_started_collective": "-1",
            }
        },
        "entries": [
            {
                "collective_seq_id": seq,
                "p2p_seq_id": 0,
                "is_p2p": False,
                "pg_id": 0,
                "process_group": ["0", "default_pg"],
                "profiling_name": f"gloo:{op}",
                "state": "scheduled",
                "retired": seq <= completed,
                "frames": [{"name": "secret_locals", "filename": "x.py", "line": 1}],
            }
            for seq, op in entries
        ],
    }


def me() -> tuple[int, int]:
    return os.getpid(), start_ticks(Path("/proc/self/stat").read_text(encoding="utf-8"))


# ---- torch's format -------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_a_real_gloo_jobs_recorder_is_read():
    """One gloo rank all-reduces 3 times and broadcasts once with TORCH_FR_BUFFER_SIZE set: the
    jobclient's dump of it (torch's own JSON, trimmed) reads as default_pg at #4, a broadcast."""
    script = textwrap.dedent(
        f"""
        import json, torch, torch.distributed as dist
        from fleetwatch.jobclient import _torch_trace, _trimmed
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1)
        t = torch.ones(4)
        for _ in range(3):
            dist.all_reduce(t)
        dist.broadcast(t, 0)
        print(json.dumps(_trimmed(_torch_trace(), 8)))
        dist.destroy_process_group()
        """
    )
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "16", "GLOO_SOCKET_IFNAME": "lo"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=True,
        timeout=60,
    )
    dumped = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert all("frames" not in e for e in dumped["entries"])  # no stacks of the rank travel
    (group,) = groups_of(dumped)
    assert (group.id, group.name) == ("0", "default_pg")
    assert group.last_enqueued == 4
    assert [(c.seq, c.op) for c in group.recent] == [
        (1, "all_reduce"),
        (2, "all_reduce"),
        (3, "all_reduce"),
        (4, "broadcast"),
    ]


def test_only_sequence_numbers_names_and_states_are_kept():
    (group,) = groups_of(trace((5, "all_reduce"), (6, "broadcast"), enqueued=6, completed=5))
    assert (group.last_enqueued, group.last_completed, group.last_started) == (6, 5, -1)
    assert [(c.seq, c.op, c.state) for c in group.recent] == [
        (5, "all_reduce", "scheduled"),
        (6, "broadcast", "scheduled"),
    ]


def test_only_the_last_collectives_of_a_group_are_kept():
    many = [(n, "all_reduce") for n in range(1, 41)]
    (group,) = groups_of(trace(*many, enqueued=40, completed=39))
    assert [c.seq for c in group.recent] == list(range(33, 41))


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ([], "not a JSON object"),
        ({"entries": []}, "no pg_status"),
        ({"pg_status": {"0": "x"}, "entries": []}, "not an object"),
        ({"pg_status": {"0": {"last_enqueued_collective": "six"}}}, "'six', not a number"),
        ({"pg_status": {"0": {"last_enqueued_collective": True}}}, "not a number"),
        ({"pg_status": {"0": {"last_enqueued_collective": 2**60}}}, "out of range"),
        (
            {"pg_status": {}, "entries": [{"pg_id": 0, "collective_seq_id": None}]},
            "collective_seq_id",
        ),
    ],
)
def test_a_broken_dump_is_refused_naming_what(bad, said):
    with pytest.raises(RecorderError, match=said):
        groups_of(bad)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"\xff\xfe", "its Flight Recorder answer is not JSON"),
        (b"[1]", "its Flight Recorder answer is not a JSON object"),
        (b'{"v":1,"error":"RuntimeError: no recorder"}', "its Flight Recorder: RuntimeError"),
        (b'{"v":1,"trace":7}', "its Flight Recorder answer: the answer is not a JSON object"),
    ],
)
def test_an_unusable_answer_says_why(data, said):
    groups, error = read_answer(data)
    assert groups == []
    assert error.startswith(said)


# ---- the channel ------------------------------------------------------------------------------


@pytest.fixture
async def job_socket():
    async with open_job_socket() as opened:
        try:
            yield opened
        finally:
            jobclient._recorders.pop(os.getpid(), None)


async def test_a_rank_serves_its_recorder_on_a_channel_filed_under_its_process(job_socket):
    """The jobclient's thread says hello; the agent files the channel under the process the
    kernel names, asks, and reads the answer as groups."""
    path, queue = job_socket
    dumped = trace((5, "all_reduce"), (6, "all_reduce"), enqueued=6, completed=5)
    assert jobclient.serve_flight_recorder(str(path), dump=lambda: dumped)
    assert not jobclient.serve_flight_recorder(str(path), dump=lambda: dumped)  # one per process
    await wait_until(lambda: len(queue.recorders) == 1, 10, "the channel")
    groups, error = await queue.recorders.ask(me())
    assert error == ""
    assert [(g.name, g.last_enqueued) for g in groups] == [("default_pg", 6)]
    other = (me()[0], me()[1] + 1)  # the same pid, another start: another process
    assert await queue.recorders.ask(other) == ([], NOT_SERVED)


async def test_a_huge_recorder_is_cut_to_fit(job_socket):
    path, queue = job_socket
    fat = trace(
        *[(n, "all_reduce" + "x" * 10_000) for n in range(1, 200)], enqueued=199, completed=198
    )
    jobclient.serve_flight_recorder(str(path), dump=lambda: fat)
    await wait_until(lambda: len(queue.recorders) == 1, 10, "the channel")
    groups, error = await queue.recorders.ask(me())
    assert error == ""
    assert groups[0].last_enqueued == 199
    assert 0 < len(groups[0].recent) < 8
    assert groups[0].recent[-1].seq == 199


async def test_a_failing_dump_is_an_answer_that_says_so(job_socket):
    path, queue = job_socket

    def broken() -> dict[str, object]:
        raise RuntimeError("no process group")

    jobclient.serve_flight_recorder(str(path), dump=broken)
    await wait_until(lambda: len(queue.recorders) == 1, 10, "the channel")
    assert await queue.recorders.ask(me()) == (
        [],
        "its Flight Recorder: RuntimeError: no process group",
    )


async def test_a_rank_that_does_not_answer_times_out_and_a_closed_one_is_forgotten():
    """A channel that never answers (a stopped rank) is cut off after the timeout; a late answer
    is dropped; a closed channel serves no more."""
    agent_side, rank_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    channels = RecorderChannels(timeout_s=0.2)
    process = (123, 456)
    channels.opened(process, agent_side)
    groups, error = await channels.ask(process)
    assert (groups, error) == ([], "its Flight Recorder did not answer within 0.2 s")
    assert rank_side.recv(256) == ASK
    channels.answered((999, 1), b"{}")  # unasked, from another process: dropped
    assert channels.bad_answers == 1
    channels.closed(process, agent_side)
    assert await channels.ask(process) == ([], NOT_SERVED)
    agent_side.close()
    rank_side.close()


async def test_hello_from_a_refused_sender_files_no_channel(job_socket, monkeypatch):
    """A connection the agent refuses (no credentials it accepts) never becomes a channel."""
    path, queue = job_socket

    def refuse(creds):
        raise JobReportError("not_a_rank", "refused")

    monkeypatch.setattr(queue.senders, "sender", refuse)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(str(path))
    sock.send(HELLO)
    await wait_until(lambda: queue.refused["not_a_rank"] == 1, 10, "the hello refused")
    assert len(queue.recorders) == 0
    sock.close()


def test_the_recorder_is_served_only_when_the_job_enabled_it(monkeypatch):
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("FLEETWATCH_FLIGHT_RECORDER", raising=False)
    monkeypatch.setitem(sys.modules, "torch.distributed", sys.modules.get("json"))
    assert not jobclient._recorder_wanted()
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    assert jobclient._recorder_wanted()
    monkeypatch.setenv("FLEETWATCH_FLIGHT_RECORDER", "0")
    assert not jobclient._recorder_wanted()
    monkeypatch.delenv("FLEETWATCH_FLIGHT_RECORDER")
    monkeypatch.delitem(sys.modules, "torch.distributed")
    assert not jobclient._recorder_wanted()  # a process without torch.distributed has none


async def test_ask_is_never_sent_to_a_channel_gone_bad():
    agent_side, rank_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    rank_side.close()
    channels = RecorderChannels(timeout_s=0.2)
    channels.opened((1, 2), agent_side)
    groups, error = await channels.ask((1, 2))
    assert groups == []
    assert error.startswith("its Flight Recorder could not be asked")
    agent_side.close()
    await asyncio.sleep(0)
