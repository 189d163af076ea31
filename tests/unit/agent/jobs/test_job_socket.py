import asyncio
import json
import math
import os
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.jobs.listener import JobQueue, bind_job_socket, serve_job_socket
from agent.jobs.report import JobReportError, parse_report
from agent.poll.sampler import NodeInventory
from fleetwatch import jobclient
from fleetwatch.jobclient import report_step
from fleetwatch.testing import wait_until
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import Inventory, WireError
from fleetwatch.wire.validate_jobs import MAX_STEPS_PER_REPORT, validate_job_report
from tests.job_node import INVENTORY, UUIDS
from tests.seqpacket_listener import SeqpacketListener

NOW = 1_767_225_600.0
GOOD = {
    "v": 1,
    "job": "llama-72b-run7",
    "rank": 3,
    "step": 1200,
    "time": NOW + 0.25,
    "step_time": 1.5,
    "tokens": 4096,
    "compute_time": 1.2,
    "gpu": 2,
    "world_size": 16,
    "params": 72e9,
    "flops_per_token": 4.5e11,
    "checkpoint": [NOW - 30.0, NOW - 12.5],
}


def encode(report: dict[str, object]) -> bytes:
    return json.dumps(report).encode()


def with_(**changes: object) -> bytes:
    report = dict(GOOD, **changes)
    return encode({k: v for k, v in report.items() if v is not ...})


def reason_of(data: bytes) -> str:
    with pytest.raises(JobReportError) as caught:
        parse_report(data, INVENTORY)
    return caught.value.reason


@pytest.fixture(autouse=True)
def _clean_client(monkeypatch):
    """Each test starts with nothing unsent, no rank environment and no connection."""
    jobclient._unsent[0] = 0
    for name in (
        "LOCAL_RANK",
        "CUDA_VISIBLE_DEVICES",
        "FLEETWATCH_JOB_SOCKET",
        "SLURM_JOB_ID",
        "TORCHELASTIC_RUN_ID",
    ):
        monkeypatch.delenv(name, raising=False)
    yield
    jobclient.close()  # the connections this test opened


@pytest.fixture
def listener(tmp_path):
    """A job socket of our own to read what report_step sends."""
    path = tmp_path / "jobs.sock"
    sock = SeqpacketListener(path)
    yield path, sock
    sock.close()


def received(sock: SeqpacketListener) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(sock.recv())
    return report


def nothing_waiting(sock: SeqpacketListener) -> bool:
    return sock.poll() is None


def accepted(listening: socket.socket) -> socket.socket:
    """The next connection to ``listening``, waiting up to 2 s."""
    listening.settimeout(2)
    conn, _ = listening.accept()
    return conn


def send_raw(path: Path, *messages: bytes) -> None:
    """Send ``messages`` as they are, on one connection to the job socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sender:
        sender.connect(str(path))
        for message in messages:
            sender.send(message)


# ---- parse_report -----------------------------------------------------------------------------


def test_good_report_maps_every_field():
    """A full report becomes a JobStep with each field in its wire form."""
    step = parse_report(encode(GOOD), INVENTORY)
    assert step.job_id == "llama-72b-run7"
    assert (step.rank, step.step, step.world_size) == (3, 1200, 16)
    assert step.time_unix_ms == 1_767_225_600_250
    assert step.step_time_s == 1.5
    assert step.tokens == 4096.0
    assert step.HasField("compute_time_s")
    assert step.compute_time_s == 1.2
    assert step.gpu_uuid == UUIDS[2]
    assert step.params == 72e9
    assert step.flops_per_token == 4.5e11
    assert step.checkpoint_start_unix_ms == 1_767_225_570_000
    assert step.checkpoint_end_unix_ms == 1_767_225_587_500


def test_minimal_report_leaves_optional_fields_unset():
    """Without compute_time, gpu or checkpoint the step says so (no presence, empty, zero)."""
    data = with_(
        compute_time=...,
        gpu=...,
        checkpoint=...,
        tokens=...,
        world_size=...,
        params=...,
        flops_per_token=...,
    )
    step = parse_report(data, INVENTORY)
    assert not step.HasField("compute_time_s")
    assert step.gpu_uuid == ""
    assert step.checkpoint_start_unix_ms == step.checkpoint_end_unix_ms == 0
    assert (step.tokens, step.world_size, step.params) == (0.0, 0, 0.0)


def test_gpu_named_by_uuid_maps_to_the_inventory_spelling():
    """A GPU UUID in other case is matched and stored as the inventory spells it."""
    step = parse_report(with_(gpu=UUIDS[5].lower().replace("gpu-", "GPU-")), INVENTORY)
    assert step.gpu_uuid == UUIDS[5]
    step = parse_report(with_(gpu=UUIDS[5].upper()), INVENTORY)
    assert step.gpu_uuid == UUIDS[5]


def test_integer_times_are_taken_as_numbers():
    """Whole numbers where floats are expected (time, step_time) are accepted."""
    step = parse_report(with_(time=1_767_225_600, step_time=2), INVENTORY)
    assert step.time_unix_ms == 1_767_225_600_000
    assert step.step_time_s == 2.0


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe not utf-8", "not_json"),
        (b"{not json", "not_json"),
        (b"[1, 2, 3]", "not_json"),
        (b'"a string"', "not_json"),
        (with_(v=2), "version"),
        (with_(v="1"), "version"),
        (with_(job=...), "missing_field"),
        (with_(rank=...), "missing_field"),
        (with_(step=None), "missing_field"),
        (with_(time=...), "missing_field"),
        (with_(step_time=...), "missing_field"),
        (with_(rank="3"), "bad_type"),
        (with_(rank=True), "bad_type"),
        (with_(step=1.5), "bad_type"),
        (with_(job=7), "bad_type"),
        (with_(tokens="many"), "bad_type"),
        (with_(gpu=[2]), "bad_type"),
        (with_(gpu=True), "bad_type"),
        (with_(checkpoint="yesterday"), "bad_type"),
        (with_(step=-1), "bad_value"),
        (with_(rank=-3), "bad_value"),
        (with_(world_size=-1), "bad_value"),
        (with_(step_time=0), "bad_value"),
        (with_(step_time=-1.0), "bad_value"),
        (with_(job="has space"), "bad_value"),
        (with_(checkpoint=[NOW]), "bad_value"),
        (with_(checkpoint=[NOW, "later"]), "bad_value"),
        (with_(checkpoint=[NOW, NOW - 1]), "bad_value"),
        (with_(rank=16, world_size=16), "bad_value"),
        (with_(gpu=9), "unknown_gpu"),
        (with_(gpu=8), "unknown_gpu"),
        (with_(gpu="GPU-ffffffff-0000-0000-0000-000000000000"), "unknown_gpu"),
    ],
)
def test_bad_report_is_refused_with_its_reason(data, reason):
    """Every kind of unusable datagram raises JobReportError labelled with why."""
    assert reason_of(data) == reason


@pytest.mark.parametrize("key", ["step_time", "compute_time", "tokens", "params"])
def test_literal_nan_and_infinity_are_refused(key):
    """json.loads accepts NaN and Infinity literals; the report is refused as bad_value."""
    for literal in ("NaN", "Infinity", "-Infinity"):
        text = json.dumps(GOOD).replace(f'"{key}": {json.dumps(GOOD[key])}', f'"{key}": {literal}')
        assert literal in text
        assert reason_of(text.encode()) == "bad_value"


def test_error_message_names_the_field():
    """The message of a bad_type error names the offending key."""
    with pytest.raises(JobReportError, match="'rank'"):
        parse_report(with_(rank="x"), INVENTORY)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"rank": 2**40}, id="rank-above-uint32"),
        pytest.param({"world_size": 2**40}, id="world-size-above-uint32"),
        pytest.param({"time": 1e17}, id="time-ms-above-int64"),
        pytest.param({"time": 1e308}, id="time-ms-infinite"),
        pytest.param({"time": 10**400}, id="time-too-big-for-float"),
        pytest.param({"checkpoint": [1e308, 1e308]}, id="checkpoint-infinite"),
    ],
)
def test_out_of_range_numbers_are_refused_as_bad_values(changes):
    """Numbers the wire types cannot hold are refused as bad values, not left to escape."""
    try:
        reason = reason_of(with_(**changes))
    except (ValueError, OverflowError) as exc:
        if isinstance(exc, JobReportError):
            raise
        pytest.fail(f"parse_report raised {type(exc).__name__}: {exc}")
    assert reason in {"bad_value", "bad_type"}


def test_a_nan_checkpoint_is_refused():
    """A literal NaN in the checkpoint pair is refused."""
    text = json.dumps(dict(GOOD, checkpoint=[0, 0])).replace("[0, 0]", "[NaN, 1767225600.0]")
    try:
        reason = reason_of(text.encode())
    except ValueError as exc:
        if isinstance(exc, JobReportError):
            raise
        pytest.fail(f"parse_report raised {type(exc).__name__}: {exc}")
    assert reason == "bad_value"


# ---- JobQueue ---------------------------------------------------------------------------------


def _step(n: int) -> pb.JobStep:
    return pb.JobStep(job_id="j", rank=0, step=n, time_unix_ms=1, step_time_s=1.0)


def test_queue_gives_steps_oldest_first_in_batches():
    """take() returns up to the limit, oldest first, and removes what it returns."""
    queue = JobQueue()
    for n in range(5):
        queue.add(_step(n))
    assert [s.step for s in queue.take(3)] == [0, 1, 2]
    assert len(queue) == 2
    assert [s.step for s in queue.take()] == [3, 4]
    assert queue.take() == []
    assert queue.received == 5


def test_full_queue_drops_the_oldest_and_counts_them():
    """Past its limit the queue drops its oldest reports and counts each drop."""
    queue = JobQueue(limit=3)
    for n in range(7):
        queue.add(_step(n))
    assert queue.dropped == 4
    assert [s.step for s in queue.take()] == [4, 5, 6]
    assert queue.received == 7


def test_reject_counts_by_reason_and_lost_sums_everything():
    """Rejected reports count by reason; lost adds unsent, dropped and invalid together."""
    queue = JobQueue(limit=1)
    queue.add(_step(1))
    queue.add(_step(2))
    for reason in ("not_json", "not_json", "unknown_gpu"):
        queue.reject(JobReportError(reason, "x"))
    queue.unsent = 5
    assert queue.refused == {"not_json": 2, "unknown_gpu": 1}
    assert queue.lost == 5 + 1 + 3


def test_on_add_is_called_for_each_report():
    """The queue wakes its sender for every report added."""
    queue = JobQueue()
    calls = []
    queue.on_add = lambda: calls.append(len(queue))
    queue.add(_step(1))
    queue.add(_step(2))
    assert calls == [1, 2]


# ---- bind_job_socket --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o600, 0o660, 0o666])
def test_bind_sets_the_mode(tmp_path, mode):
    """The socket file gets the mode asked for, whatever the umask."""
    path = tmp_path / "jobs.sock"
    sock = bind_job_socket(path, mode)
    try:
        info = path.stat()
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == mode
        assert not sock.getblocking()
    finally:
        sock.close()


def test_bind_creates_the_parent_directory(tmp_path):
    """A missing run directory is created."""
    path = tmp_path / "run" / "fleetwatch" / "jobs.sock"
    sock = bind_job_socket(path, 0o660)
    try:
        assert stat.S_ISSOCK(path.stat().st_mode)
    finally:
        sock.close()


def test_bind_replaces_a_stale_socket_file(tmp_path):
    """A socket file left by a dead agent is removed and the new socket receives."""
    path = tmp_path / "jobs.sock"
    old = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    old.bind(str(path))
    old.close()
    assert path.exists()
    sock = bind_job_socket(path, 0o660)
    try:
        send_raw(path, b"hello")
        with accepted(sock) as conn:
            assert conn.recv(100) == b"hello"
    finally:
        sock.close()


def test_bind_refuses_to_take_over_a_live_socket(tmp_path):
    """Another agent listening at the path keeps it; bind raises OSError naming the path."""
    path = tmp_path / "jobs.sock"
    live = bind_job_socket(path, 0o660)
    try:
        with pytest.raises(OSError, match="another process listens"):
            bind_job_socket(path, 0o660)
        send_raw(path, b"still mine")
        with accepted(live) as probe:  # the second bind's probe: it connected and closed
            assert probe.recv(100) == b""
        with accepted(live) as conn:
            assert conn.recv(100) == b"still mine"
    finally:
        live.close()


def test_bind_refuses_to_take_over_an_older_agents_live_datagram_socket(tmp_path):
    """An older agent's datagram socket, still open, keeps its path too (the probe's connection
    is of the wrong type, which only a live socket answers so)."""
    path = tmp_path / "jobs.sock"
    live = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    live.bind(str(path))
    try:
        with pytest.raises(OSError, match="another process listens"):
            bind_job_socket(path, 0o660)
        assert path.exists()
    finally:
        live.close()


def test_bind_does_not_remove_a_regular_file(tmp_path):
    """A plain file at the path is left alone and the bind fails."""
    path = tmp_path / "jobs.sock"
    path.write_text("not a socket")
    with pytest.raises(OSError, match="in use"):
        bind_job_socket(path, 0o660)
    assert path.read_text() == "not a socket"


# ---- serve_job_socket end to end --------------------------------------------------------------


async def test_reports_arrive_parsed_and_garbage_is_counted(tmp_path):
    """report_step datagrams land in the queue as JobSteps; garbage counts as invalid."""
    path = tmp_path / "run" / "jobs.sock"
    queue = JobQueue()
    woken = []
    queue.on_add = lambda: woken.append(1)
    transport = await serve_job_socket(path, 0o660, queue, lambda: INVENTORY)
    try:
        assert report_step("job-a", 0, 10, 1.5, 2048, gpu=1, world_size=2, socket_path=str(path))
        assert report_step(
            "job-a", 1, 10, 1.5, 2048, compute_time=1.1, gpu=UUIDS[3], socket_path=str(path)
        )
        send_raw(path, b"\x00garbage", encode(dict(GOOD, gpu=9)))
        await wait_until(lambda: queue.received == 2 and sum(queue.refused.values()) == 2, 5)
        first, second = queue.take()
        assert (first.job_id, first.rank, first.step, first.world_size) == ("job-a", 0, 10, 2)
        assert first.gpu_uuid == UUIDS[1]
        assert not first.HasField("compute_time_s")
        assert second.gpu_uuid == UUIDS[3]
        assert second.compute_time_s == 1.1
        assert second.tokens == 2048.0
        assert queue.refused == {"not_json": 1, "unknown_gpu": 1}
        assert len(woken) == 2
    finally:
        transport.close()


async def test_unsent_count_from_ranks_reaches_the_queue(tmp_path):
    """The 'unsent' a rank carries after failed sends is added to the queue's lost count."""
    path = tmp_path / "jobs.sock"
    queue = JobQueue()
    assert not report_step("job-b", 0, 1, 1.0, socket_path=str(path))  # nobody listens yet
    assert not report_step("job-b", 0, 2, 1.0, socket_path=str(path))
    transport = await serve_job_socket(path, 0o660, queue, lambda: INVENTORY)
    try:
        assert report_step("job-b", 0, 3, 1.0, socket_path=str(path))
        await wait_until(lambda: queue.received == 1, 5)
        assert queue.unsent == 2
        assert queue.lost == 2
    finally:
        transport.close()


async def test_the_inventory_is_asked_per_datagram(tmp_path):
    """A GPU the node gained after start-up is accepted once the inventory callable knows it."""
    path = tmp_path / "jobs.sock"
    queue = JobQueue()
    inventories = [NodeInventory("d", "n", INVENTORY.gpus[:1], ())]
    transport = await serve_job_socket(path, 0o660, queue, lambda: inventories[-1])
    try:
        assert report_step("job-c", 0, 1, 1.0, gpu=4, socket_path=str(path))
        await wait_until(lambda: queue.refused["unknown_gpu"] == 1, 5)
        inventories.append(INVENTORY)
        assert report_step("job-c", 0, 2, 1.0, gpu=4, socket_path=str(path))
        await wait_until(lambda: queue.received == 1, 5)
        assert queue.take()[0].gpu_uuid == UUIDS[4]
    finally:
        transport.close()


async def test_an_out_of_range_datagram_is_counted_invalid(tmp_path):
    """A datagram with a rank too big for the wire is counted invalid, not lost unseen."""
    path = tmp_path / "jobs.sock"
    queue = JobQueue()
    transport = await serve_job_socket(path, 0o660, queue, lambda: INVENTORY)
    try:
        send_raw(path, with_(rank=2**40), encode(GOOD))
        await wait_until(lambda: queue.received == 1, 5)
        assert queue.refused == {"bad_value": 1}
    finally:
        transport.close()


# ---- report_step ------------------------------------------------------------------------------


def test_report_step_sends_one_compact_json_datagram(listener):
    """A report carries the wire keys, a current time and the optional values given."""
    path, sock = listener
    assert report_step(
        "job-d",
        2,
        7,
        1.25,
        512,
        compute_time=1.0,
        checkpoint=(NOW - 5, NOW - 1),
        gpu="GPU-abc",
        world_size=4,
        params=7e9,
        flops_per_token=4.2e10,
        socket_path=str(path),
    )
    report = received(sock)
    assert report.pop("time") == pytest.approx(time.time(), abs=60)
    assert report == {
        "v": 1,
        "job": "job-d",
        "rank": 2,
        "step": 7,
        "step_time": 1.25,
        "tokens": 512.0,
        "compute_time": 1.0,
        "checkpoint": [NOW - 5, NOW - 1],
        "gpu": "GPU-abc",
        "world_size": 4,
        "params": 7e9,
        "flops_per_token": 4.2e10,
    }


def test_report_step_finds_the_socket_in_the_environment(listener, monkeypatch):
    """Without socket_path the report goes to $FLEETWATCH_JOB_SOCKET."""
    path, sock = listener
    monkeypatch.setenv("FLEETWATCH_JOB_SOCKET", str(path))
    assert report_step("job-e", 0, 1, 1.0)
    assert received(sock)["job"] == "job-e"


def test_report_step_without_agent_returns_false(tmp_path):
    """No socket at the path: False, no exception, one report counted unsent."""
    assert report_step("job-f", 0, 1, 1.0, socket_path=str(tmp_path / "nobody.sock")) is False
    assert jobclient._unsent[0] == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"rank": "x"}, id="rank-not-a-number"),
        pytest.param({"step": None}, id="step-none"),
        pytest.param({"step_time": "fast"}, id="step-time-text"),
        pytest.param({"job": "j" * 5000}, id="datagram-too-big"),
        pytest.param({"gpu": object()}, id="gpu-not-json"),
        pytest.param({"checkpoint": (1.0,)}, id="checkpoint-not-a-pair"),
    ],
)
def test_report_step_with_unusable_values_returns_false(listener, kwargs):
    """Garbage values never raise; nothing is sent and the report counts as unsent."""
    path, sock = listener
    args = {"job": "job-g", "rank": 0, "step": 1, "step_time": 1.0} | kwargs
    assert report_step(**args, socket_path=str(path)) is False
    assert jobclient._unsent[0] == 1
    assert nothing_waiting(sock)


def test_nan_step_time_is_sent_as_null_and_refused_by_the_agent(listener):
    """A NaN step time leaves as JSON null, which parse_report refuses as missing."""
    path, sock = listener
    assert report_step("job-h", 0, 1, float("nan"), float("inf"), socket_path=str(path))
    data = sock.recv()
    report = json.loads(data)
    assert report["step_time"] is None
    assert report["tokens"] is None
    assert b"NaN" not in data
    assert b"Infinity" not in data
    assert reason_of(data) == "missing_field"


def test_non_finite_optional_values_are_left_out(listener):
    """Optional values that are not finite are omitted rather than sent as NaN."""
    path, sock = listener
    assert report_step(
        "job-i", 0, 1, 1.0, compute_time=math.nan, params=math.inf, socket_path=str(path)
    )
    report = received(sock)
    assert "compute_time" not in report
    assert "params" not in report


def test_unsent_count_travels_with_the_next_report_then_resets(listener, tmp_path):
    """After failed sends the next good report says how many; the one after says nothing."""
    path, sock = listener
    missing = str(tmp_path / "missing.sock")
    assert not report_step("job-j", 0, 1, 1.0, socket_path=missing)
    assert not report_step("job-j", 0, 2, 1.0, socket_path=missing)
    assert not report_step("j" * 5000, 0, 3, 1.0, socket_path=str(path))
    assert report_step("job-j", 0, 4, 1.0, socket_path=str(path))
    assert received(sock)["unsent"] == 3
    assert jobclient._unsent[0] == 0
    assert report_step("job-j", 0, 5, 1.0, socket_path=str(path))
    assert "unsent" not in received(sock)


def test_close_closes_the_socket_and_the_next_report_opens_another(listener):
    """The client's socket is closed at exit (no unclosed-socket warning); sending after a close
    opens a fresh one."""
    path, sock = listener
    assert report_step("job-j", 0, 1, 1.0, socket_path=str(path))
    (first,) = jobclient._sockets.values()
    jobclient.close()
    assert first.fileno() == -1
    assert report_step("job-j", 0, 2, 1.0, socket_path=str(path))
    assert received(sock)["step"] == 1
    assert received(sock)["step"] == 2
    assert jobclient._sockets[os.getpid(), str(path)] is not first
    assert sock.accepted == 2


@pytest.mark.parametrize(
    ("visible", "gpu"),
    [
        ("3,5", 5),
        ("GPU-abc,GPU-def", "GPU-def"),
        (" 3 , 5 ", 5),
        (None, 1),
    ],
)
def test_gpu_defaults_from_local_rank(listener, monkeypatch, visible, gpu):
    """LOCAL_RANK picks the GPU, through CUDA_VISIBLE_DEVICES when that is set."""
    path, sock = listener
    monkeypatch.setenv("LOCAL_RANK", "1")
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert report_step("job-k", 1, 1, 1.0, socket_path=str(path))
    assert received(sock)["gpu"] == gpu


@pytest.mark.parametrize(
    ("local_rank", "visible"),
    [(None, "3,5"), ("2", "3,5"), ("one", None)],
)
def test_no_gpu_key_when_local_rank_does_not_say(listener, monkeypatch, local_rank, visible):
    """Without a usable LOCAL_RANK (or beyond the visible devices) no gpu key is sent."""
    path, sock = listener
    if local_rank is not None:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert report_step("job-l", 0, 1, 1.0, socket_path=str(path))
    assert "gpu" not in received(sock)


def test_explicit_gpu_beats_local_rank(listener, monkeypatch):
    """A gpu argument is sent as given even when LOCAL_RANK is set."""
    path, sock = listener
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert report_step("job-m", 0, 1, 1.0, gpu=0, socket_path=str(path))
    assert received(sock)["gpu"] == 0


# ---- validate_job_report ----------------------------------------------------------------------


def _wire_step(**changes: object) -> pb.JobStep:
    values: dict[str, Any] = {
        "job_id": "job-n",
        "rank": 3,
        "step": 7,
        "time_unix_ms": 1_767_225_600_000,
        "step_time_s": 1.0,
        "gpu_uuid": UUIDS[0],
    }
    values.update(changes)
    return pb.JobStep(**values)


NODE = Inventory(nvlinks_by_gpu={UUIDS[0]: 18, UUIDS[1]: 18})


def test_report_within_limits_passes():
    """A report of known GPUs and the maximum number of steps is accepted."""
    steps = [_wire_step(step=n) for n in range(MAX_STEPS_PER_REPORT)]
    validate_job_report(pb.JobReport(steps=steps), NODE)


def test_report_with_too_many_steps_is_refused():
    """One step over MAX_STEPS_PER_REPORT is refused, saying how many."""
    steps = [_wire_step(step=n) for n in range(MAX_STEPS_PER_REPORT + 1)]
    with pytest.raises(WireError, match=f"{MAX_STEPS_PER_REPORT + 1} steps") as caught:
        validate_job_report(pb.JobReport(steps=steps), NODE)
    assert caught.value.reason == "invalid_job_step"


def test_report_naming_a_gpu_the_node_lacks_is_refused():
    """A gpu_uuid not in the node's inventory is refused, naming job, rank and step."""
    report = pb.JobReport(steps=[_wire_step(), _wire_step(gpu_uuid="GPU-not-here", step=8)])
    with pytest.raises(WireError) as caught:
        validate_job_report(report, NODE)
    assert caught.value.reason == "invalid_job_step"
    message = str(caught.value)
    assert "job job-n rank 3 step 8" in message
    assert "GPU-not-here" in message


def test_report_without_gpu_passes_any_inventory():
    """A step that names no GPU needs no inventory entry."""
    validate_job_report(pb.JobReport(steps=[_wire_step(gpu_uuid="")]), Inventory())


async def test_a_rank_reconnects_by_itself_when_the_agent_restarts(tmp_path):
    """The agent restarts (its connections close, a new socket is bound at the path): the
    rank's next report finds its connection closed, opens another and is delivered."""
    path = tmp_path / "jobs.sock"
    queue = JobQueue()
    transport = await serve_job_socket(path, 0o660, queue, lambda: INVENTORY)
    assert report_step("job-r", 0, 1, 1.0, socket_path=str(path))
    await wait_until(lambda: queue.received == 1, 5)
    transport.close()
    path.unlink()
    again = JobQueue()
    transport = await serve_job_socket(path, 0o660, again, lambda: INVENTORY)
    try:
        assert report_step("job-r", 0, 2, 1.0, socket_path=str(path))
        await wait_until(lambda: again.received == 1, 5)
        assert again.take()[0].step == 2
    finally:
        transport.close()


def test_an_older_agents_datagram_socket_is_sent_datagrams(tmp_path):
    """An agent from before connections listens with a datagram socket: report_step sees the
    connection refused as of the wrong type and sends it datagrams."""
    path = tmp_path / "jobs.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as old:
        old.bind(str(path))
        old.settimeout(2)
        assert report_step("job-o", 0, 1, 1.0, socket_path=str(path))
        assert report_step("job-o", 0, 2, 1.0, socket_path=str(path))
        assert [json.loads(old.recv(4096))["step"] for _ in range(2)] == [1, 2]


async def test_a_connection_is_closed_when_the_agent_closes_and_counts_nothing_lost(tmp_path):
    """Closing the socket closes every rank's connection (they see it at their next report)."""
    path = tmp_path / "jobs.sock"
    queue = JobQueue()
    transport = await serve_job_socket(path, 0o660, queue, lambda: INVENTORY)
    assert report_step("job-c", 0, 1, 1.0, socket_path=str(path))
    await wait_until(lambda: transport.connections == 1, 5)
    rank_side = jobclient._sockets[os.getpid(), str(path)]
    transport.close()
    assert transport.connections == 0
    assert rank_side.recv(10) == b""  # the agent's end is closed
    assert queue.lost == 0


CHILD = """
import os, signal, sys
from fleetwatch.jobclient import report_step
assert report_step("job-f", 0, 1, 1.0, socket_path=sys.argv[1])
sys.stdin.readline()  # the agent took the report (a rank outlives its first by a moment)
if sys.argv[2] == "error":
    raise RuntimeError("the rank's own failure")
if sys.argv[2] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(("ending", "farewell"), [("ok", "ok"), ("error", "error"), ("killed", "")])
async def test_a_rank_process_says_how_it_ends(tmp_path, ending, farewell):
    """A real process reports a step and ends: normally (farewell ok), in an uncaught exception
    (error), or killed (nothing). The agent's watch shows it exited, with what it said."""
    path = tmp_path / "jobs.sock"
    queue = JobQueue()
    transport = await serve_job_socket(path, 0o660, queue, lambda: INVENTORY)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            str(path),
            ending,
            stdin=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await wait_until(lambda: queue.received == 1, 10)
        assert proc.stdin is not None
        proc.stdin.write(b"end\n")
        await proc.wait()
        await wait_until(lambda: transport.connections == 0, 5, "the connection closed")
        (process,) = queue.ranks.snapshot()
        assert (process.job_id, process.rank, process.state) == ("job-f", 0, "exited")
        assert process.farewell == farewell
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("process", "named"),
    [
        (pb.RankProcess(job_id="j", rank=0, state="dancing"), "state 'dancing'"),
        (pb.RankProcess(job_id="j", rank=0, state="stopped", cpu_s=math.nan), "cpu_s"),
        (pb.RankProcess(job_id="j", rank=0, state="exited", farewell="bye"), "farewell"),
        (pb.RankProcess(job_id="../x", rank=0, state="running"), "job id"),
        (pb.RankProcess(job_id="j", rank=2**31, state="running"), "rank above"),
    ],
)
def test_the_collector_refuses_a_rank_process_it_cannot_believe(process, named):
    """What a node says of its rank processes is checked like its steps: the error names it."""
    with pytest.raises(WireError, match=named):
        validate_job_report(pb.JobReport(processes=[process]), Inventory({}))


def test_a_report_of_too_many_rank_processes_is_refused():
    processes = [pb.RankProcess(job_id="j", rank=r, state="running") for r in range(1025)]
    with pytest.raises(WireError, match="1025 rank processes"):
        validate_job_report(pb.JobReport(processes=processes), Inventory({}))


def test_a_checkpoint_announcement_is_sent_and_parsed(listener):
    """checkpointing=True travels as "checkpointing": true and becomes the JobStep's flag; a
    value other than true or false is refused."""
    path, sock = listener
    assert report_step("job-k", 0, 7, 1.0, checkpointing=True, socket_path=str(path))
    data = sock.recv()
    assert json.loads(data)["checkpointing"] is True
    assert parse_report(data, INVENTORY).checkpointing
    assert report_step("job-k", 0, 8, 1.0, socket_path=str(path))
    later = sock.recv()
    assert "checkpointing" not in json.loads(later)
    assert not parse_report(later, INVENTORY).checkpointing
    assert reason_of(with_(checkpointing="yes")) == "bad_type"
