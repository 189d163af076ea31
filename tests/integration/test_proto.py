"""The committed generated code is what the .proto generates."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTO = "fleetwatch/wire/v1/fleetwatch.proto"
GENERATED = ["fleetwatch_pb2.py", "fleetwatch_pb2.pyi", "fleetwatch_pb2_grpc.py"]


def test_regenerating_the_wire_code_gives_no_diff(tmp_path: Path):
    """`make proto` was run after the last .proto edit: regenerating changes nothing."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(ROOT),
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(ROOT / PROTO),
        ],
        check=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "fleetwatch/wire/v1" / name).read_text()
        committed = (ROOT / "fleetwatch/wire/v1" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `make proto`"


@pytest.mark.parametrize("module", ["fleetwatch_pb2", "fleetwatch_pb2_grpc"])
def test_generated_code_imports(module: str):
    """The generated modules import against the pinned protobuf and grpcio versions."""
    __import__(f"fleetwatch.wire.v1.{module}")
