"""Pre-flight's torch runners read what their worker printed on a real H200.

``tests/fixtures/preflight/real-h200-torch-2.11-cu130/`` holds the worker's output recorded on
the device machine (``scripts/gpu-runners-record.sh``). A stand-in ``python`` prints that
output for the mode it is asked, so each runner's command line, the process handling and the
reading of the result are the real ones; only the GPU is absent here.
"""

import json
import shlex
import stat
from pathlib import Path

import pytest

from agent.preflight.real.torch_runners import TorchCopies, TorchLadder
from agent.preflight.runners import Group
from fleetwatch.preflight.vocabulary import Check, Verdict
from rules.gates_file import load_gates

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "preflight"
RECORD = FIXTURES / "real-h200-torch-2.11-cu130"


def recorded_python(folder: Path, stdout: str, stderr: str | None = None, rc: int = 0) -> str:
    """A ``python`` that logs its argv, then prints a recorded stdout (and stderr)."""
    path = folder / "python"
    err = f"cat {shlex.quote(str(RECORD / stderr))} >&2\n" if stderr else ""
    path.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > "{path}.args"\n'
        f"cat {shlex.quote(str(RECORD / stdout))}\n{err}exit {rc}\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def result_of(name: str) -> dict[str, object]:
    line = (RECORD / name).read_text().splitlines()[-1]
    prefix, _, body = line.partition(" ")
    assert prefix == "FLEETWATCH_PREFLIGHT"
    loaded: dict[str, object] = json.loads(body)
    return loaded


def test_host_copies_of_a_real_gpu(tmp_path):
    python = recorded_python(tmp_path, "torch_worker_host.txt")
    got = {(m.check, m.component): m for m in TorchCopies(python=python).measure_host([0], 30.0)}
    assert set(got) == {(Check.H2D_BW, "gpu:0"), (Check.D2H_BW, "gpu:0")}
    assert got[Check.H2D_BW, "gpu:0"].value == pytest.approx(54.89, abs=0.01)
    assert got[Check.D2H_BW, "gpu:0"].value == pytest.approx(54.69, abs=0.01)
    assert all(m.error == "" for m in got.values())
    args = Path(f"{python}.args").read_text().splitlines()
    assert args[:4] == ["-m", "agent.preflight.real.torch_worker", "host", "--gpus"]
    # an H200's PCIe 5 x16 host copies pass the gate the real GPU is held to
    gates = load_gates()
    for m in got.values():
        assert gates.judge(m, "H200", "NDR").verdict is Verdict.PASS


def test_a_one_rank_ladder_rung_over_nccl(tmp_path):
    python = recorded_python(tmp_path, "torch_worker_ladder.txt", "torch_worker_ladder.err")
    group = Group("pf-test", ("gpu-01",), 0, 1, "127.0.0.1", 29500, 64 << 20, 30.0)
    m = TorchLadder(python=python).run(group, 20)
    recorded = result_of("torch_worker_ladder.txt")
    assert m.check is Check.LADDER_THROUGHPUT
    assert m.component == "nodes:1"
    assert m.value == pytest.approx(recorded["samples_per_s"])
    assert m.error == ""
    assert m.evidence.startswith("nccl 1 ranks: 640 samples in 0.035 s")


def test_a_gpu_that_is_not_there_could_not_run(tmp_path):
    python = recorded_python(tmp_path, "torch_worker_pairs_missing_gpu.txt", rc=3)
    got = TorchCopies(python=python).measure_pairs([0, 1], 30.0)
    assert {m.check for m in got} == {Check.P2P_BW, Check.P2P_BIDIR_BW}
    for m in got:
        assert m.value is None
        assert m.error == "2 GPUs asked for, CUDA sees 1"
