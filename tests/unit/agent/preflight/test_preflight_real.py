"""The real pre-flight runners: their command lines, and the tools' output as the tools print it.

The outputs are in tests/fixtures/preflight/ (typed in the tools' formats; its README says where
each format comes from). Each runner runs a stand-in script of the tool's name that records its
arguments and environment and prints a fixture, so the whole path is real except the tool.
"""

import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.preflight.real import nccl_tests, nvbandwidth, perftest, real_runners
from agent.preflight.real.process import ToolRun, run_tool
from agent.preflight.real.torch_runners import RESULT_PREFIX, TorchLadder
from agent.preflight.runners import Group, Rail
from fleetwatch.preflight.vocabulary import Check, Measurement, Verdict
from rules.gates_file import load_gates

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "preflight"
GATES = load_gates()


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def fake_tool(folder: Path, name: str, body: str) -> Path:
    """A script named like the tool: logs argv and CUDA_VISIBLE_DEVICES to NAME.args, then BODY."""
    path = folder / name
    path.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > "{path}.args"\n'
        f'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES" >> "{path}.args"\n' + body
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def prints(name: str) -> str:
    return f"cat {shlex.quote(str(FIXTURES / name))}\n"


def args_of(tool: Path) -> list[str]:
    return Path(f"{tool}.args").read_text().splitlines()


def by_component(measurements: list[Measurement]) -> dict[tuple[Check, str], Measurement]:
    return {(m.check, m.component): m for m in measurements}


# ---- nvbandwidth --------------------------------------------------------------------------


def test_nvbandwidth_matrices_are_read():
    cases = nvbandwidth.parse(fixture("nvbandwidth_d2d.txt"))
    read = cases[nvbandwidth.D2D_READ].matrix()
    assert read is not None
    assert read.columns == [0, 1, 2, 3]
    assert read.value(0, 0) is None  # N/A
    assert read.value(1, 2) == 201.33
    bidir = cases[nvbandwidth.D2D_BIDIR]
    total = bidir.matrix("total")
    assert total is not None
    assert total.value(2, 1) == 400.06
    assert cases[nvbandwidth.D2D_READ].total == 4013.27


def test_nvbandwidth_pairs_end_to_end(tmp_path):
    tool = fake_tool(tmp_path, "nvbandwidth", prints("nvbandwidth_d2d.txt"))
    runners = real_runners(search_path=str(tmp_path))
    assert runners.pair is not None
    got = by_component(runners.pair.measure([0, 1, 2, 3], 30.0))
    assert len(got) == 12 + 6
    assert args_of(tool)[:3] == ["-t", nvbandwidth.D2D_READ, nvbandwidth.D2D_BIDIR]
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in args_of(tool)
    slow = got[Check.P2P_BW, "gpu:1-gpu:2"]
    assert slow.value == 201.33
    assert got[Check.P2P_BW, "gpu:0-gpu:1"].value == 376.21
    # both directions' totals: the smaller of (1,2) and (2,1)
    assert got[Check.P2P_BIDIR_BW, "gpu:1-gpu:2"].value == 399.88
    assert GATES.judge(slow, "H100", "NDR").verdict is Verdict.FAIL
    healthy = got[Check.P2P_BIDIR_BW, "gpu:0-gpu:3"]
    assert GATES.judge(healthy, "H100", "NDR").verdict is Verdict.PASS


def test_nvbandwidth_indices_map_to_the_gpus_asked_for(tmp_path):
    tool = fake_tool(tmp_path, "nvbandwidth", prints("nvbandwidth_bidir_old.txt"))
    got = by_component(nvbandwidth.NvbandwidthPair(str(tool)).measure([2, 5], 30.0))
    assert "CUDA_VISIBLE_DEVICES=2,5" in args_of(tool)
    assert got[Check.P2P_BW, "gpu:5-gpu:2"].value == 374.88
    # an old nvbandwidth prints one matrix: the total is both directions added
    assert got[Check.P2P_BIDIR_BW, "gpu:2-gpu:5"].value == pytest.approx(370.55 + 370.61)


def test_nvbandwidth_host_copies(tmp_path):
    fake_tool(tmp_path, "nvbandwidth", prints("nvbandwidth_host.txt"))
    runners = real_runners(search_path=str(tmp_path))
    assert runners.host is not None
    got = by_component(runners.host.measure([0, 1], 30.0))
    assert got[Check.H2D_BW, "gpu:0"].value == 55.21
    assert got[Check.D2H_BW, "gpu:1"].value == 27.70
    judged = GATES.judge(got[Check.H2D_BW, "gpu:1"], "H100", "NDR")
    assert judged.verdict is Verdict.FAIL  # a GPU whose PCIe link trained at half width


def test_a_waived_testcase_could_not_run(tmp_path):
    fake_tool(tmp_path, "nvbandwidth", prints("nvbandwidth_waived.txt"))
    got = real_runners(search_path=str(tmp_path)).pair.measure([0, 1], 30.0)  # type: ignore[union-attr]
    assert len(got) == 3
    for m in got:
        assert m.value is None
        assert "Waived: Peer access is not available" in m.error
        assert GATES.judge(m, "H100", "NDR").verdict is Verdict.COULD_NOT_RUN


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("echo 'hello, world'\n", "printed no device_to_device_memcpy_read_ce results"),
        ("echo 'cudaErrorNoDevice' >&2\nexit 1\n", "nvbandwidth exited 1: cudaErrorNoDevice"),
        ("kill -SEGV $$\n", "nvbandwidth was killed by SIGSEGV"),
        ("sleep 30\n", "did not finish in"),
        (
            (
                "echo 'Running device_to_device_memcpy_read_ce.'\n"
                "echo 'memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)'\n"
            ),
            "nvbandwidth printed no value for GPU",
        ),
    ],
)
def test_garbage_a_crash_or_a_timeout_is_never_a_figure(tmp_path, body, reason):
    fake_tool(tmp_path, "nvbandwidth", body)
    got = real_runners(search_path=str(tmp_path)).pair.measure([0, 1], 1.5)  # type: ignore[union-attr]
    assert got
    p2p = [m for m in got if m.check is Check.P2P_BW]
    assert p2p
    for m in p2p:
        assert m.value is None
        assert reason in m.error
        assert GATES.judge(m, "H100", "NDR").verdict is Verdict.COULD_NOT_RUN


def test_without_nvbandwidth_torch_copies_answer_no_cuda(tmp_path):
    # this machine has no GPU: the torch fallback starts its worker, which says so
    runners = real_runners(search_path=str(tmp_path))
    assert runners.pair is not None
    assert runners.host is not None
    for m in runners.pair.measure([0, 1], 120.0) + runners.host.measure([0], 120.0):
        assert m.value is None
        assert m.error == "no CUDA device"


# ---- ib_write_bw --------------------------------------------------------------------------


def test_ib_write_bw_results_are_read():
    assert perftest.parse(fixture("ib_write_bw_client.txt")) == (386.74, "")
    value, why = perftest.parse(fixture("ib_write_bw_mib.txt"))
    assert why == ""
    assert value == pytest.approx(23398.51 * 8 * 1048576 / 1e9)
    assert perftest.parse(fixture("ib_write_bw_empty.txt")) == (
        None,
        "ib_write_bw's results table is empty",
    )
    assert perftest.parse("garbage\n") == (None, "ib_write_bw printed no results table")


def test_ib_write_bw_client_and_server_command_lines(tmp_path):
    tool = fake_tool(tmp_path, "ib_write_bw", prints("ib_write_bw_client.txt"))
    runners = real_runners(search_path=str(tmp_path), ib_cuda_device=None)
    assert runners.ib is not None
    rail = Rail("mlx5_3", 1)
    client = runners.ib.connect(rail, "10.1.0.7", 18600, 30.0)
    assert client.check is Check.IB_WRITE_BW
    assert client.value == 386.74
    assert client.component == "rail:mlx5_3/1:10.1.0.7"
    argv = args_of(tool)
    assert argv[:-1] == [
        *("-d", "mlx5_3", "-i", "1", "-p", "18600", "-s", "1048576", "-D", "5", "-q", "4"),
        *("-F", "--report_gbits", "10.1.0.7"),
    ]
    server = runners.ib.serve(rail, 18600, 30.0)
    assert server.value == 386.74
    assert "10.1.0.7" not in args_of(tool)
    assert GATES.judge(client, "H100", "NDR").verdict is Verdict.WARN  # 380 <= 386.7 < 390


def test_gpudirect_only_when_the_build_has_it(tmp_path):
    with_cuda = fake_tool(
        tmp_path,
        "ib_write_bw",
        'case "$1" in --help) echo "      --use_cuda=<cuda device id>  Use CUDA memory";'
        " exit 0;; esac\n" + prints("ib_write_bw_client.txt"),
    )
    runner = perftest.IbWriteBw(str(with_cuda), cuda_device=3)
    runner.serve(Rail("mlx5_0", 1), 18515, 30.0)
    assert "--use_cuda=3" in args_of(with_cuda)
    plain = fake_tool(tmp_path, "plain_ib_write_bw", prints("ib_write_bw_client.txt"))
    got = perftest.IbWriteBw(str(plain), cuda_device=3).serve(Rail("mlx5_0", 1), 18515, 30.0)
    assert not any(a.startswith("--use_cuda") for a in args_of(plain))
    assert "host memory was used" in got.evidence
    assert got.value == 386.74


def test_the_client_waits_for_a_server_that_is_not_listening_yet(tmp_path):
    state = tmp_path / "tries"
    fake_tool(
        tmp_path,
        "ib_write_bw",
        f'echo x >> "{state}"\n'
        f'if [ "$(wc -l < "{state}")" -lt 3 ]; then\n'
        '  echo "Couldn\'t connect to 10.1.0.7:18515" >&2; exit 1\nfi\n'
        + prints("ib_write_bw_client.txt"),
    )
    got = real_runners(search_path=str(tmp_path)).ib.connect(  # type: ignore[union-attr]
        Rail("mlx5_0", 1), "10.1.0.7", 18515, 30.0
    )
    assert got.value == 386.74
    assert len(state.read_text().splitlines()) == 3


def test_ib_write_bw_missing_could_not_run(tmp_path):
    got = real_runners(search_path=str(tmp_path)).ib.serve(Rail("mlx5_0", 1), 18515, 5.0)  # type: ignore[union-attr]
    assert got.value is None
    assert got.error == "ib_write_bw is not installed (Debian package perftest)"


def test_the_real_ib_write_bw_fails_cleanly_without_rdma_devices():
    tool = perftest.find("/usr/bin:/usr/local/bin:/bin")
    assert tool, "ib_write_bw is missing: scripts/ensure-test-deps.sh installs perftest"
    if Path("/sys/class/infiniband").is_dir() and any(Path("/sys/class/infiniband").iterdir()):
        pytest.skip("this machine has RDMA devices; the test is for one without")
    runner = perftest.IbWriteBw(tool, duration_s=1)
    got = runner.serve(Rail("mlx5_0", 1), 18515, 20.0)
    assert got.value is None
    assert got.error.startswith("ib_write_bw exited 1:")
    assert "Unable to find the Infiniband/RoCE device" in got.error
    assert GATES.judge(got, "H100", "NDR").verdict is Verdict.COULD_NOT_RUN


# ---- all_reduce_perf ----------------------------------------------------------------------


def test_all_reduce_perf_table_is_read():
    assert nccl_tests.parse(fixture("all_reduce_perf.txt")) == (465.31, "", 465.76)
    # old columns (no root, "error"), an NCCL log line inside the table: the largest size counts
    assert nccl_tests.parse(fixture("all_reduce_perf_old.txt")) == (189.31, "", 187.48)
    value, why, _ = nccl_tests.parse(fixture("all_reduce_perf_wrong.txt"))
    assert value is None
    assert why == "all_reduce_perf: 21 wrong values (a GPU or link corrupts data)"
    assert nccl_tests.parse("# nothing\n")[:2] == (None, "all_reduce_perf printed no results table")


def group(nodes: int = 1, gpus: int = 8, size: int = 16 << 30) -> Group:
    names = tuple(f"gpu-{i:02d}" for i in range(1, nodes + 1))
    return Group("run-1", names, 0, gpus, "127.0.0.1", 29500, size, 60.0)


def test_all_reduce_perf_runs_one_node_with_the_groups_env(tmp_path):
    tool = fake_tool(
        tmp_path,
        "all_reduce_perf",
        f'echo "NCCL_ALGO=$NCCL_ALGO" >> "{tmp_path}/all_reduce_perf.args"\n'
        + prints("all_reduce_perf.txt"),
    )
    runners = real_runners(search_path=str(tmp_path), env={"NCCL_ALGO": "Ring"})
    assert runners.collective is not None
    got = runners.collective.all_reduce(group())
    assert (got.check, got.component, got.value, got.unit) == (
        Check.ALLREDUCE_NODE,
        "node",
        465.31,
        "GB/s",
    )
    argv = args_of(tool)
    assert argv[:12] == [
        *("-b", "17179869184", "-e", "17179869184", "-f", "2", "-g", "8"),
        *("-w", "5", "-n", "20"),
    ]
    assert "NCCL_ALGO=Ring" in argv
    assert GATES.judge(got, "H100", "NDR").verdict is Verdict.PASS


def test_wrong_values_from_all_reduce_perf_could_not_pass(tmp_path):
    fake_tool(tmp_path, "all_reduce_perf", prints("all_reduce_perf_wrong.txt"))
    got = real_runners(search_path=str(tmp_path)).collective.all_reduce(group())  # type: ignore[union-attr]
    assert got.value is None
    assert "wrong values" in got.error
    assert GATES.judge(got, "H100", "NDR").verdict is Verdict.COULD_NOT_RUN


# ---- the process runner -------------------------------------------------------------------


def test_a_timeout_kills_the_tools_whole_process_group(tmp_path):
    child = tmp_path / "child.pid"
    script = fake_tool(tmp_path, "spawner", f'sleep 300 &\necho $! > "{child}"\nwait\n')
    run = run_tool([str(script)], 1.0)
    assert run.timed_out
    assert "did not finish in 1 s and was killed" in run.why_not()
    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid), "the tool's child outlived the timeout"


@pytest.mark.timeout(30)
def test_a_child_that_leaves_the_group_holding_the_pipe_does_not_hang_the_runner(tmp_path):
    child = tmp_path / "child.pid"
    script = fake_tool(tmp_path, "escaper", f'setsid sleep 20 &\necho $! > "{child}"\necho done\n')
    run = run_tool([str(script)], 10.0)
    assert run.ok
    assert run.stdout.strip() == "done"
    os.kill(int(child.read_text()), signal.SIGKILL)  # ours to clean up: it left the group


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_tool_that_cannot_start_is_named(tmp_path):
    run = run_tool([str(tmp_path / "absent")], 5.0)
    assert run.returncode is None
    assert "could not start" in run.why_not()


def test_output_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr("agent.preflight.real.process.MAX_OUTPUT", 1000)
    run = run_tool([sys.executable, "-c", "print('x' * 100000)"], 30.0)
    assert run.ok
    assert len(run.stdout) == 1000


def test_no_shell_is_involved(tmp_path):
    marker = tmp_path / "pwned"
    run = run_tool(["/bin/echo", f"; touch {marker}"], 5.0)
    assert run.stdout.strip() == f"; touch {marker}"
    assert not marker.exists()


def test_a_real_agent_carries_the_real_runners(tmp_path):
    from agent.config import AgentConfig  # noqa: PLC0415
    from agent.main import real_hardware  # noqa: PLC0415

    cfg = AgentConfig(node="n1", state_dir=None, kmsg_path="", udev=False, gpu_reset=False)
    runners = real_hardware(cfg).preflight
    assert None not in (
        runners.pair,
        runners.host,
        runners.collective,
        runners.ib,
        runners.ladder,
    )
    assert runners.ib is not None
    # the real ib_write_bw, on a machine with no RDMA device: the tool's own reason
    got = runners.ib.serve(Rail("mlx5_9", 1), 18515, 20.0)
    assert got.value is None
    assert "ib_write_bw" in got.error


def test_without_torch_the_fallback_says_so(tmp_path):
    # a torch package that cannot be imported, ahead of the real one on the workers' path
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no torch on this node')\n")
    runners = real_runners(search_path=str(tmp_path), env={"PYTHONPATH": str(shadow.parent)})
    got = runners.host.measure([0], 60.0)  # type: ignore[union-attr]
    assert got
    assert all(m.value is None for m in got)
    assert all("torch is not installed for" in m.error for m in got), got[0].error
    assert "no torch on this node" in got[0].error


def test_a_rank_that_fails_after_its_result_says_how():
    """A rank that printed its result and then exited non-zero is a failure with a reason, not
    an empty one (seen once in CI: "local rank 0: ")."""
    good = ToolRun(("python3",), 0, RESULT_PREFIX + '{"samples_per_s": 10.0}\n', "", 1.0)
    died = ToolRun(("python3",), 1, RESULT_PREFIX + '{"samples_per_s": 10.0}\n', "gloo: ", 1.0)
    result, why, _ = TorchLadder().result([died, good])
    assert result is None
    assert why.startswith("local rank 0: python3 exited 1")


def test_a_rank_ends_without_the_interpreters_teardown(tmp_path):
    """Once its result line is out, a worker leaves at once: a teardown that aborts (as torch's
    gloo group held by DDP did in CI: SIGABRT, "terminate called without an active exception")
    cannot turn a finished rank into a failed one."""
    # an exit handler that aborts, as a C++ destructor during finalisation does
    boot = (
        "import atexit, os, runpy; atexit.register(os.abort); "
        "runpy.run_module('agent.preflight.real.torch_worker', run_name='__main__')"
    )
    # no CUDA here (or no torch): the host mode says it cannot run, with its own exit status
    done = subprocess.run(
        [sys.executable, "-c", boot, "host", "--gpus", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3, (done.returncode, done.stderr[-500:])
    assert done.stdout.strip().splitlines()[-1].startswith(RESULT_PREFIX)
